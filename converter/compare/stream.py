"""Both models' weights streamed from the checkpoint block by block, for models larger than memory.

A torch model built on the meta device (its tensors have shapes, no data) and a paddle model
built under paddle.LazyGuard (its parameters take no memory) are verified with the weights of the
checkpoint (--weights), read one tensor at a time (safetensors: memory-mapped). Each side holds its
tensors outside the blocks for the whole run and one block at a time (STREAMED_KEEP), made when
one of the block's modules is called and dropped before the next block is made (the machinery of
compare/widen.py): torch's read from the checkpoint in the dtype the model was built in (a bf16
checkpoint computed in float32), paddle's computed from the conversion plan's entries for the
block's keys. The float64 reference reads its tensors from the same checkpoint, one block at a
time too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import dtypes
from ..errors import UserError
from ..io.base import Source, TensorInfo
from ..io.torch_io import numpy_view, tensor_to_numpy
from ..lazy import import_paddle, import_torch
from .recycle import Storages
from .widen import (STREAMED_KEEP, KINDS, BlockTensors, HeldTensor, _block_index, _blocks, _largest_lists, _like,
                    block_tensors, tensor_names)

LENT_DTYPES = ("float16", "bfloat16", "float32", "float64")  # paddle tensors made on lent storage


class Checkpoint(Source):
    """The checkpoint at `path` as a source of the torch model's state dict: its keys, each read
    in the dtype the model holds it in (`read`: a storage array; `tensor`: a torch tensor). A tensor
    of the model on the CPU that the checkpoint does not hold (a buffer the model computes) is read
    from the model; a tensor tied to another key (one tensor under two names) from the key the
    checkpoint holds it under."""

    def __init__(self, path: str, torch_model):
        from ..io import open_source
        from ..dtypes import torch_name
        super().__init__(path)
        self.inner = open_source(path)
        try:
            want = torch_model.state_dict(keep_vars=True)
            keys_of: dict[int, list[str]] = {}
            for k, t in want.items():
                keys_of.setdefault(id(t), []).append(k)
            self.stored_as = {k: next((s for s in keys_of[id(t)] if s in self.inner.infos), None)
                              for k, t in want.items()}  # key -> the key the checkpoint holds its tensor under
            self.own = {name: t for name, t in _named_tensors(torch_model)
                        if not t.is_meta and self.stored_as.get(name) is None}  # computed by the model
            missing = [k for k, t in want.items() if t.is_meta and self.stored_as[k] is None]
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
            self.storages = Storages(_widest_block(torch_model))
            self.infos = {k: TensorInfo(k, torch_name(t.dtype), tuple(t.shape)) for k, t in want.items()}
        except BaseException:
            self.inner.close()
            raise

    def holds(self, key: str) -> bool:
        """The checkpoint holds the tensor `key` (under its own key or one it is tied to)."""
        return self.stored_as.get(key) is not None

    def tensor(self, key: str, dtype=None):
        """The tensor `key` as a CPU torch tensor of the model's dtype, or of `dtype` (wider: a
        float64 copy): the checkpoint's, or a copy of the model's own where the model computes it.
        Made on storage the pool lends (self.storages), converted in one copy where the model's
        dtype holds every value of the checkpoint's."""
        if key in self.own:
            own = self.own[key].detach()
            return own.to("cpu", dtype or own.dtype, copy=True)
        held = self.dtypes[key]
        dtype = dtype or held
        stored = self.stored_as[key]
        kind = self.inner.infos[stored].dtype
        array = self.inner.read(stored)
        try:
            view = numpy_view(array, kind)
            if view.dtype != held and not _holds_every_value(held, view.dtype):
                view = view.to(held)  # rounded to the model's dtype first, as loading it would
            out = self.storages.empty(view.shape, dtype)
            out.copy_(view)
        finally:
            self.inner.release(stored)
        return out

    def read(self, name: str) -> np.ndarray:
        return tensor_to_numpy(self.tensor(name))

    def close(self) -> None:
        self.storages.clear()
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


def stream_torch(model, checkpoint: Checkpoint) -> Streamed:
    """The torch model (on the meta device) with its tensors read from `checkpoint` as they run."""
    names = tensor_names(model)
    off = [names[id(t)] for m in model.modules() for kind in KINDS for t in getattr(m, kind).values()
           if t is not None and t.is_meta and not checkpoint.holds(names[id(t)])]
    if off:
        raise UserError(f"torch_model()'s buffer '{off[0]}' is on the meta device and --weights '{checkpoint.path}' "
                        "does not hold it: it can be neither read nor computed (a buffer is computed when the "
                        "model's own code makes it inside `with torch.device(\"meta\")`, not when it is moved there "
                        "or made from a parameter); make it on the CPU in the model's code, or save it in the "
                        "checkpoint")
    streamed = lambda t: t.is_meta or checkpoint.holds(names[id(t)])  # a CPU tensor held: the checkpoint's values
    records: dict[int, HeldTensor] = {}

    def held(t):
        key = names[id(t)]
        make = lambda: _like(t, checkpoint.tensor(key))
        return records.setdefault(id(t), HeldTensor(make, t, t.numel() * t.element_size()))

    blocks = _blocks(model)
    block_of = _block_index(blocks, lambda b: b.modules())
    places = [(m, block_of.get(id(m), []), [(kind, name, held(t)) for kind in KINDS
                                            for name, t in getattr(m, kind).items() if t is not None and streamed(t)])
              for m in model.modules()]
    handles = []
    hook = lambda m, h: handles.append(m.register_forward_pre_hook(h, prepend=True))
    tensors = block_tensors(places, len(blocks), hook, STREAMED_KEEP)
    handles.append(model.register_forward_hook(tensors.done_hook()))  # a whole forward done: its last block goes
    return Streamed(model, tensors, handles, block_of)


def stream_paddle(model, plan, checkpoint: Checkpoint, keep: int = STREAMED_KEEP,
                  dtype: str | None = None) -> Streamed:
    """The paddle model (built under LazyGuard) with the tensors the plan writes computed from
    the checkpoint's storage arrays as its layers run, on storage its pool lends; `dtype`: its
    floating tensors made in that dtype instead of their own (a float64 copy of the model)."""
    arrays = {}
    for entry in plan.entries:
        for name in (entry.name, *entry.aliases):
            arrays[name] = lambda entry=entry: entry.compute(checkpoint.read)
    return stream_paddle_arrays(model, arrays, keep, dtype, checkpoint.storages)


def stream_paddle_arrays(model, arrays: dict, keep: int = STREAMED_KEEP, dtype: str | None = None,
                         storages: Storages | None = None) -> Streamed:
    """The paddle model (built under LazyGuard) with each tensor whose state-dict key `arrays` has
    made by it (a function returning its storage array) as its layers run; `dtype`: as in
    stream_paddle; `storages`: the pool lending the floating tensors' storage on the CPU."""
    records: dict[int, HeldTensor] = {}
    width = 1 if dtype is None else np.dtype(dtype).itemsize

    def held(t, array):
        size = int(np.prod(t.shape)) * (t.element_size() if dtype is None or not t.is_floating_point() else width)
        return records.setdefault(id(t), HeldTensor(lambda: _paddle_tensor(t, array(), dtype, storages), t, size))

    layers = [(prefix, layer) for prefix, layer in model.named_sublayers(include_self=True)]
    blocks = _paddle_blocks(model)
    block_of = _block_index(blocks, lambda b: b.sublayers(include_self=True))
    places = []
    for prefix, layer in layers:
        found = []
        for kind in KINDS:
            for name, t in getattr(layer, kind).items():
                array = arrays.get(f"{prefix}.{name}" if prefix else name)
                if t is not None and array is not None:
                    found.append((kind, name, held(t, array)))
        places.append((layer, block_of.get(id(layer), []), found))
    handles = []
    hook = lambda layer, h: handles.append(layer.register_forward_pre_hook(h))
    tensors = block_tensors(places, len(blocks), hook, keep)
    handles.append(model.register_forward_post_hook(tensors.done_hook()))  # a whole forward done: its last block goes
    return Streamed(model, tensors, handles, block_of)


@dataclass
class PaddleWeights:
    """The paddle model's weights in a streamed run: the plan (the torch tensors read from the
    checkpoint), its blocks streamed (None where the model holds its own weights), whether they are
    computed from the checkpoint through the plan (not read from a file nor the model's own), the check
    of loaded weights against torch's (mapping 'loaded', else None), and a note."""

    plan: object
    streamed: Streamed | None
    from_plan: bool
    weight_check: object
    note: str
    close: Callable[[], None]


def paddle_weights(torch_model, paddle_model, rules, checkpoint: Checkpoint, converted: str | None,
                   loaded: bool) -> PaddleWeights:
    """The paddle model's weights beside a streamed torch model: computed from the checkpoint
    through the plan block by block; with `converted` (a paddle weights file, or the directory
    convert-weights wrote), read from it block by block, each checked bit for bit against torch's
    first, one tensor at a time, under mapping 'loaded'; under mapping 'loaded' without it, the
    weights the paddle model was loaded with, checked so."""
    from ..inmemory import plan_for_loaded, plan_in_memory
    from .weights import check_loaded
    plan_for = plan_for_loaded if loaded else plan_in_memory
    plan = plan_for(torch_model, paddle_model, rules, source=checkpoint)[0]
    keep = STREAMED_KEEP
    held = "one block" if keep == 1 else f"{keep} blocks"
    where = f"'{checkpoint.path}'"
    if converted is None and loaded:
        return PaddleWeights(plan, None, False, check_loaded(plan, checkpoint, paddle_model),
                             f"weights: torch_model() is on the meta device: its weights are streamed from {where} "
                             f"block by block ({held} held at a time), the paddle model keeps the weights it "
                             "was loaded with", lambda: None)
    if converted is None:
        streamed = stream_paddle(paddle_model, plan, checkpoint, keep)
        return PaddleWeights(plan, streamed, True, None,
                             f"weights: torch_model() is on the meta device: both models' weights are streamed from "
                             f"{where} block by block (the part outside the blocks and {held} per side held at a "
                             "time)", streamed.close)
    source = _paddle_source(converted, paddle_model)
    try:
        check = _check_file(plan, checkpoint, source) if loaded else None
        streamed = stream_paddle_arrays(paddle_model, {name: lambda name=name: source.read(name) for name in source.infos},
                                        keep)
    except BaseException:
        source.close()
        raise

    def close():
        streamed.close()
        source.close()
    return PaddleWeights(plan, streamed, False, check,
                         f"weights: torch_model() is on the meta device: its weights are streamed from {where} and the "
                         f"paddle model's from '{converted}', block by block (the part outside the blocks and {held} "
                         "per side held at a time)", close)


def _paddle_source(converted: str, paddle_model):
    """The paddle weights file `converted` (or the directory convert-weights wrote) opened: every
    parameter of the paddle model in it, every key of it in the model's state dict (a buffer it
    lacks stays as the model computes it), each in the model's shape and dtype."""
    from ..frameworks.paddle_side import state_dict_infos
    source = paddle_file(converted)
    try:
        want = state_dict_infos(paddle_model)
        missing = sorted(k for k, _ in paddle_model.named_parameters() if k not in source.infos)
        unexpected = sorted(k for k in source.infos if k not in want)
        if missing or unexpected:
            raise UserError(f"--converted '{converted}' does not fit the paddle model (missing: "
                            f"{', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(unexpected[:5]) or 'none'}); "
                            "convert it again for this model")
        misfit = [k for k in source.infos if (tuple(want[k].shape), want[k].dtype) != (tuple(source.infos[k].shape),
                                                                                         source.infos[k].dtype)]
        if misfit:
            k = misfit[0]
            raise UserError(f"--converted '{converted}' does not fit the paddle model: {k} is "
                            f"{source.infos[k].describe()} in the file, {want[k].describe()} in the model; convert it "
                            "again for this model")
    except BaseException:
        source.close()
        raise
    return source


def paddle_file(converted: str) -> Source:
    """The paddle weights file `converted` opened; a directory convert-weights wrote: its weights."""
    import os
    from ..hf.directory import INDEX, WEIGHTS
    from ..io import open_source
    path = converted
    if os.path.isdir(converted):
        path = next((os.path.join(converted, n) for n in (INDEX, WEIGHTS) if os.path.isfile(os.path.join(converted, n))),
                    converted)
    return open_source(path)


def _check_file(plan, checkpoint: Checkpoint, source):
    """Every tensor the plan writes, as the paddle weights file holds it, against the torch tensor
    the plan makes of the checkpoint, bit for bit, one tensor at a time: a WeightCheck."""
    from .weights import check_written

    def actual(name):
        array = source.read(name)
        if source.infos[name].dtype == "bfloat16":
            array = dtypes.bf16_to_f32(array)
        source.release(name)
        return array
    return check_written(plan, checkpoint.read, actual)


def _named_tensors(model):
    """(key, tensor) for every parameter and buffer of a torch model, buffers kept out of the state
    dict included, each tensor once under its first key."""
    names = tensor_names(model)
    seen = {}
    for m in model.modules():
        for kind in KINDS:
            for t in getattr(m, kind).values():
                if t is not None:
                    seen.setdefault(id(t), (names[id(t)], t))
    return list(seen.values())


def _paddle_blocks(model) -> list:
    """The paddle model's blocks, found as the torch model's are (compare/widen.py)."""
    paddle = import_paddle()
    lists = [m for m in model.sublayers(include_self=True)
             if isinstance(m, (paddle.nn.LayerList, paddle.nn.Sequential)) and len(m) > 1]
    return _largest_lists(lists, lambda m: len(m.sublayers(include_self=True)),
                          lambda m: m.sublayers(include_self=True), lambda m: list(m.children()))


def _paddle_tensor(placeholder, array: np.ndarray, dtype: str | None = None, storages: Storages | None = None):
    """`array` as a paddle tensor standing where `placeholder` (a lazy parameter or a buffer) stands;
    a floating one on the CPU made on storage `storages` lends (shared with paddle through DLPack)."""
    paddle = import_paddle()
    kind, name = placeholder.dtype, placeholder.name
    if dtype is not None and placeholder.is_floating_point():  # a copy of the model in another dtype
        # under a name of its own: a parameter made under its original's name writes the original's values
        kind, name = getattr(paddle, dtype), f"{placeholder.name}.{dtype}"
    lent = _lent(array, kind, storages)
    if lent is None:
        array = _contiguous(array)
        if dtype is not None and placeholder.is_floating_point():
            array = array.astype(dtype)
    if isinstance(placeholder, paddle.base.framework.EagerParamBase):
        if lent is not None:
            p = paddle.base.framework.EagerParamBase.from_tensor(lent, name=name)
        else:
            p = paddle.base.framework.EagerParamBase(shape=list(array.shape), dtype=kind, name=name)
            p.set_value(array)
        p.stop_gradient = placeholder.stop_gradient
        return p
    return lent if lent is not None else paddle.to_tensor(array, dtype=kind)


def _lent(array: np.ndarray, kind, storages: Storages | None):
    """`array` copied in paddle dtype `kind` to a CPU tensor on storage `storages` lends, as a
    paddle tensor sharing it; None where there is no pool, paddle computes elsewhere than on the
    CPU, `kind` is not floating, or the array's layout is one torch cannot view."""
    paddle = import_paddle()
    torch = import_torch()
    name = str(kind).rpartition(".")[2]
    if (storages is None or name not in LENT_DTYPES or paddle.device.get_device() != "cpu"
            or any(s < 0 for s in array.strides)):
        return None
    out = storages.empty(array.shape, getattr(torch, name))
    out.copy_(numpy_view(array, dtypes.from_numpy(array.dtype)))
    return paddle.utils.dlpack.from_dlpack(out)


def _holds_every_value(wide, narrow) -> bool:
    """Torch dtype `wide` holds every value of `narrow` exactly (a cast between them is exact)."""
    torch = import_torch()
    floats = [torch.float16, torch.float32, torch.float64]
    return wide == narrow or (wide in floats[1:] and narrow in (torch.bfloat16, *floats[:floats.index(wide)]))


def _widest_block(torch_model) -> int:
    """Bytes of the largest block's floating tensors in float64: the free storage a pool keeps
    (see compare/recycle.py), a block of the widest copy the run makes."""
    return max((8 * sum(t.numel() for t in {id(t): t for t in block.state_dict(keep_vars=True).values()}.values()
                        if t.is_floating_point()) for block in _blocks(torch_model)), default=0)


def _contiguous(array: np.ndarray) -> np.ndarray:
    """`array` laid out row-major; a transposed weight copied by torch, whose blocked copy is about
    three times numpy's strided one (a 2752 x 1024 float32: 9 ms against 25 ms)."""
    if array.flags.c_contiguous:
        return array
    if array.dtype in (np.float32, np.float64, np.float16) and all(s > 0 for s in array.strides):
        return numpy_view(array, array.dtype.name).contiguous().numpy()  # a read-only view: torch only reads it
    return np.ascontiguousarray(array)
