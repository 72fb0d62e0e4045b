"""Both models' weights streamed from the checkpoint block by block, for models larger than memory.

A torch model built on the meta device (its tensors have shapes, no data) and a paddle model
built under paddle.LazyGuard (its parameters take no memory) are verified with the weights of the
checkpoint (--weights), read one tensor at a time (safetensors: memory-mapped). Each side holds its
tensors outside the blocks for the whole run and two blocks at a time, made when one of the
block's modules is called and dropped after (the machinery of compare/widen.py): torch's read from
the checkpoint in the dtype the model was built in (a bf16 checkpoint computed in float32),
paddle's computed from the conversion plan's entries for the block's keys. The float64 reference
reads its tensors from the same checkpoint.
"""

from __future__ import annotations

import numpy as np

from ..errors import UserError
from ..io.base import Source, TensorInfo
from ..lazy import import_paddle
from .widen import KEEP, KINDS, BlockTensors, Held, _blocks, _largest_lists, _like, block_tensors, tensor_names


def on_meta_device(model) -> bool:
    """The torch model's parameters are on the meta device: its weights are to be streamed."""
    return any(p.is_meta for p in model.parameters())


class Checkpoint(Source):
    """The checkpoint at `path` as a source of the torch model's state dict: its keys, each read
    in the dtype the model holds it in (`read`: a storage array; `tensor`: a torch tensor)."""

    def __init__(self, path: str, torch_model):
        from ..io import open_source
        from ..dtypes import torch_name
        super().__init__(path)
        self.inner = open_source(path)
        try:
            want = torch_model.state_dict(keep_vars=True)
            missing = [k for k in want if k not in self.inner.infos]
            unexpected = [k for k in self.inner.infos if k not in want]
            wrong = [k for k, t in want.items() if k in self.inner.infos
                     and tuple(self.inner.infos[k].shape) != tuple(t.shape)]
            if missing or unexpected:
                raise UserError(f"--weights '{path}' does not fit torch_model() (missing: "
                                f"{', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(unexpected[:5]) or 'none'}); "
                                "give the checkpoint of this model")
            if wrong:
                k = wrong[0]
                raise UserError(f"--weights '{path}' does not fit torch_model(): {k} is "
                                f"{list(self.inner.infos[k].shape)} in the checkpoint, {list(want[k].shape)} in the "
                                "model; give the checkpoint of this model")
            self.dtypes = {k: t.dtype for k, t in want.items()}
            self.infos = {k: TensorInfo(k, torch_name(t.dtype), tuple(t.shape)) for k, t in want.items()}
        except BaseException:
            self.inner.close()
            raise

    def tensor(self, key: str):
        """The tensor `key` of the checkpoint as a CPU torch tensor of the model's dtype."""
        from ..io.torch_io import numpy_to_tensor
        stored = numpy_to_tensor(self.inner.read(key), self.inner.infos[key].dtype)
        self.inner.release(key)
        return stored.to(self.dtypes[key])

    def read(self, name: str) -> np.ndarray:
        from ..io.torch_io import tensor_to_numpy
        return tensor_to_numpy(self.tensor(name))

    def close(self) -> None:
        self.inner.close()


class Streamed:
    """A model's tensors held block by block (`tensors`, a BlockTensors) and the hooks that make
    them; `close()` removes the hooks and puts every placeholder back."""

    def __init__(self, model, tensors: BlockTensors, handles: list, block_of: dict):
        self.model = model
        self.tensors = tensors
        self._handles = handles
        self._block_of = block_of  # id of a module or layer -> the blocks it is in

    def enter_module(self, module) -> None:
        """The block holding `module` made (for reading its weights without calling it)."""
        owners = self._block_of.get(id(module))
        if owners:
            self.tensors.enter(owners[0])

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.tensors.close()


def stream_torch(model, checkpoint: Checkpoint, keep: int = KEEP) -> Streamed:
    """The torch model (on the meta device) with its tensors read from `checkpoint` as they run."""
    names = tensor_names(model)
    state = model.state_dict(keep_vars=True)
    off = [names[id(t)] for m in model.modules() for kind in KINDS for t in getattr(m, kind).values()
           if t is not None and t.is_meta and names[id(t)] not in state]
    if off:
        raise UserError(f"torch_model() is built on the meta device and its buffer {off[0]} is not in the checkpoint "
                        "(a buffer kept out of the state dict); build that buffer on the CPU, or build the model "
                        "with its weights")
    records: dict[int, Held] = {}

    def held(t):
        key = names[id(t)]
        make = lambda: _like(t, checkpoint.tensor(key))
        return records.setdefault(id(t), Held(make, t, t.numel() * t.element_size()))

    block_of = _block_index(_blocks(model), lambda b: b.modules())
    places = [(m, block_of.get(id(m), []), [(kind, name, held(t)) for kind in KINDS
                                            for name, t in getattr(m, kind).items() if t is not None and t.is_meta])
              for m in model.modules()]
    handles = []
    hook = lambda m, h: handles.append(m.register_forward_pre_hook(h, prepend=True))
    return Streamed(model, block_tensors(places, len(_blocks(model)), hook, keep), handles, block_of)


def stream_paddle(model, plan, read, keep: int = KEEP) -> Streamed:
    """The paddle model (built under LazyGuard) with the tensors the plan writes computed from
    `read` (the torch state's storage arrays) as its layers run."""
    by_name = {}
    for entry in plan.entries:
        for name in (entry.name, *entry.aliases):
            by_name[name] = entry
    records: dict[int, Held] = {}

    def held(t, entry):
        return records.setdefault(id(t), Held(lambda: _paddle_tensor(t, entry.compute(read)), t,
                                              int(np.prod(t.shape)) * t.element_size()))

    layers = [(prefix, layer) for prefix, layer in model.named_sublayers(include_self=True)]
    blocks = _paddle_blocks(model)
    block_of = _block_index(blocks, lambda b: b.sublayers(include_self=True))
    places = []
    for prefix, layer in layers:
        found = []
        for kind in KINDS:
            for name, t in getattr(layer, kind).items():
                entry = by_name.get(f"{prefix}.{name}" if prefix else name)
                if t is not None and entry is not None:
                    found.append((kind, name, held(t, entry)))
        places.append((layer, block_of.get(id(layer), []), found))
    handles = []
    hook = lambda layer, h: handles.append(layer.register_forward_pre_hook(h))
    return Streamed(model, block_tensors(places, len(blocks), hook, keep), handles, block_of)


def _block_index(blocks, inside) -> dict[int, list[int]]:
    block_of: dict[int, list[int]] = {}
    for i, block in enumerate(blocks):
        for m in inside(block):
            block_of.setdefault(id(m), []).append(i)
    return block_of


def _paddle_blocks(model) -> list:
    """The paddle model's blocks, found as the torch model's are (compare/widen.py)."""
    paddle = import_paddle()
    lists = [m for m in model.sublayers(include_self=True)
             if isinstance(m, (paddle.nn.LayerList, paddle.nn.Sequential)) and len(m) > 1]
    return _largest_lists(lists, lambda m: len(m.sublayers(include_self=True)),
                          lambda m: m.sublayers(include_self=True), lambda m: list(m.children()))


def _paddle_tensor(placeholder, array: np.ndarray):
    """`array` as a paddle tensor standing where `placeholder` (a lazy parameter or a buffer) stands."""
    paddle = import_paddle()
    array = np.ascontiguousarray(array)
    if isinstance(placeholder, paddle.base.framework.EagerParamBase):
        p = paddle.base.framework.EagerParamBase(shape=list(array.shape), dtype=placeholder.dtype,
                                                 name=placeholder.name)
        p.set_value(array)
        p.stop_gradient = placeholder.stop_gradient
        return p
    return paddle.to_tensor(array, dtype=placeholder.dtype)


def streamed_bytes(streamed: Streamed) -> int:
    """What one side holds at most: its tensors outside the blocks and its `keep` largest blocks."""
    pinned, blocks = streamed.tensors.most_bytes()
    return pinned + blocks

