"""How a run builds its models: as the spec builds them, or with the torch model's parameters on
the meta device and paddle's under paddle.LazyGuard where the weights are streamed (stream.py),
decided from the checkpoint's header before anything is built (plan_build).

A buffer the model computes itself (a rotary table, position ids, a causal mask: kept out of the
state dict, or in it and not in the checkpoint) is the model's own: `computed_buffers()`, around
torch_model()'s build, makes what a factory is asked to make on the meta device on the CPU and
moves the parameters made so to the meta device, so that such a buffer is computed by the
model's own code while every parameter stays shapes alone (`parameters_on_meta()` builds a whole
model so). A tensor of the model that is on the CPU and in the checkpoint (a persistent buffer)
takes the checkpoint's values while the run holds it, as loading the checkpoint would give it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..lazy import import_paddle, import_torch
from ..patches import thread_patch


def on_meta_device(model) -> bool:
    """The torch model's parameters are on the meta device: its weights are to be streamed."""
    return any(p.is_meta for p in model.parameters())


@contextlib.contextmanager
def computed_buffers():
    """While a torch model is built inside: a tensor a factory (torch.empty, zeros, arange, ...) is
    asked to make on the meta device is made on the CPU, and a parameter registered from such a
    tensor, or while the default device is meta (`with torch.device("meta")`), is moved to the meta
    device. Parameters stay shapes alone as the model's code asked; buffers hold what its code
    computes. A model built without the meta device is built as it is. The registration of
    parameters is patched for the building thread alone (patches.py) while it lasts."""
    torch = import_torch()
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors
    factories = _device_constructors()
    made: set[int] = set()  # data pointers of tensors made on the CPU for the meta device (a parameter that
    # reuses the memory of one freed before is moved too: the checkpoint holds every parameter of a streamed model)

    class MetaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if func not in factories or device is None or torch.device(device).type != "meta":
                return func(*args, **kwargs)
            kwargs["device"] = "cpu"
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.data_ptr():
                made.add(out.data_ptr())
            return out

    def asked_for_meta(t) -> bool:
        return (t.data_ptr() and t.data_ptr() in made) or torch.get_default_device().type == "meta"

    def on_meta(register):
        def register_on_meta(module, name, param):
            register(module, name, param)
            if param is not None and not param.is_meta and asked_for_meta(param):
                moved = torch.nn.Parameter(param.detach().to("meta"), param.requires_grad)
                moved.__dict__.update(param.__dict__)
                module._parameters[name] = moved
        return register_on_meta

    with thread_patch(torch.nn.Module, "register_parameter").patched(on_meta), MetaOnCpu():
        yield


@contextlib.contextmanager
def parameters_on_meta():
    """A torch model built inside has its parameters on the meta device (shapes alone, streamed
    from --weights when verify-port runs it) and its buffers computed on the CPU by its own code."""
    torch = import_torch()
    with computed_buffers(), torch.device("meta"):
        yield


@dataclass
class Build:
    """How a run builds its models: `streamed` (torch_model() under parameters_on_meta(), and
    paddle_model() under paddle.LazyGuard() where `paddle_lazy`), else as the spec builds them
    (with --weights, under computed_buffers()); `note` says why a run streams."""

    weights: bool
    streamed: bool = False
    paddle_lazy: bool = False
    note: str | None = None

    def torch(self):
        if self.streamed:
            return parameters_on_meta()
        return computed_buffers() if self.weights else contextlib.nullcontext()

    def paddle(self):
        return import_paddle().LazyGuard() if self.paddle_lazy else contextlib.nullcontext()


def plan_build(weights: str | None, converted: str | None = None, loaded: bool = False,
               max_memory: int | None = None, train: bool = False) -> Build:
    """How to build the models of a run with `weights` (a torch checkpoint), decided from its header
    before anything is built: as the spec builds them where the in-memory run fits (a torch model
    built on the meta device streams all the same), streamed where it does not and the checkpoint
    is read one tensor at a time (read_tensor_by_tensor); a UserError where neither fits. The floating
    tensors are taken as float32 (the dtype a model computes in unless it is built in another).
    `converted`: paddle's weights read from that file; `loaded`: the paddle model loads its own
    weights (streamed only when `converted` gives them); `max_memory`: the most the process may hold
    (--max-memory); `train`: the training checks run too, which hold both models (never streamed)."""
    if not weights:
        return Build(False)
    from ..io import open_source
    from . import memory
    with open_source(weights) as source:
        torch_infos, files = dict(source.infos), list(source.files)
    paddle_infos = None
    if converted:
        from .stream import paddle_file
        with paddle_file(converted) as source:
            paddle_infos = dict(source.infos)
    paddle_streams = converted is not None or not loaded
    available, where = memory.available_memory(max_memory)
    planned = memory.before_build(torch_infos, available, paddle_infos=paddle_infos, paddle_streams=paddle_streams)
    need = planned.must_stream(available, where, "verify-port", train, None if read_tensor_by_tensor(files) else (
        f"a run that streams the weights block by block reads --weights one tensor at a time, which '{weights}' (a "
        "torch pickle of the format before zip files) does not allow: save the checkpoint as safetensors "
        "(safetensors.torch.save_file, or save_pretrained), or free memory"))
    if need is None:
        return Build(True)
    return Build(True, True, paddle_streams, f"weights: streamed block by block, as {need}")


def read_tensor_by_tensor(files: list[str]) -> bool:
    """A checkpoint of these files is read one tensor at a time, memory-mapped: safetensors (and
    their index), .pdparams, and torch's zip format; not torch's pickle before zip files, which
    torch.load reads whole."""
    import zipfile
    from ..io.open import TORCH_SUFFIXES
    return all(not f.lower().endswith(TORCH_SUFFIXES) or zipfile.is_zipfile(f) for f in files)
