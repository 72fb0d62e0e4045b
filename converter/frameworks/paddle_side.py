"""The paddle adapter: the same functions as torch_side, plus reading converted weights."""

from __future__ import annotations

import contextlib

import numpy as np

from ..io.base import TensorInfo
from . import hooks
from ..lazy import import_paddle


def _dtype_name(dtype) -> str:
    return str(dtype).replace("paddle.", "")


def state_dict_infos(model) -> dict[str, TensorInfo]:
    return {k: TensorInfo(k, _dtype_name(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}


def to_numpy(tensor) -> np.ndarray:
    """A tensor as numpy on the CPU; floating tensors narrower than float32 widened to float32."""
    paddle = import_paddle()
    if tensor.dtype in (paddle.bfloat16, paddle.float16):
        return tensor.astype("float32").numpy()
    return tensor.numpy()


def values_of(tensor) -> tuple[object, object, tuple]:
    """For a spill (compare/spill.py), as torch_side.values_of: the tensor itself (paddle's
    tensors are compared by value alone), its bytes (its dtype's own bits: bfloat16 as paddle's
    numpy gives it, uint16) and what makes it again (numpy dtype, dtype, place, shape)."""
    array = np.ascontiguousarray(tensor.numpy())
    data = array.reshape(-1).view(np.uint8)
    return tensor, lambda: data, (array.dtype, tensor.dtype, tensor.place, tuple(tensor.shape))


def values_from(data: np.ndarray, where: tuple):
    """values_of's bytes as the tensor again."""
    paddle = import_paddle()
    numpy_dtype, dtype, place, shape = where
    return paddle.to_tensor(data.view(numpy_dtype).reshape(shape), dtype=dtype, place=place)


def tensor_in(values, where: tuple):
    """A tensor on the values values_from made (a new one each time, as detach() gives)."""
    return values.detach()


@contextlib.contextmanager
def cpu_threads(n: int):
    """Paddle's CPU kernels (MKL, OpenMP) on `n` threads while the block runs, then on paddle's own
    count again (FLAGS_paddle_num_threads, one by default): for paddle work nothing runs beside."""
    paddle = import_paddle()
    paddle.base.core.set_num_threads(n)
    try:
        yield
    finally:
        paddle.base.core.set_num_threads(int(paddle.get_flags(["FLAGS_paddle_num_threads"])["FLAGS_paddle_num_threads"]))


def random_state(device: str) -> tuple | None:
    """What paddle's random generators and numpy's and Python's global ones hold now, on a CPU; None
    on a GPU, whose kernels may sum in another order from run to run."""
    import random
    paddle = import_paddle()
    if device != "cpu":
        return None
    state = np.random.get_state()
    return tuple(g.__getstate__() for g in paddle.get_rng_state()), state[1].tobytes(), state[2:], random.getstate()


def may_differ_again(before: tuple | None, device: str) -> bool:
    """Whether a run begun at `before` (random_state) may give other outputs when run again: it drew
    random numbers (a dropout active, a random op), or ran on a GPU. A CPU run that drew none gives
    its outputs again bit for bit, so a check that it repeats needs no second run."""
    return before is None or random_state(device) != before


def in_place_changes(changed):
    """As torch_side.in_place_changes; paddle has no hook on its functions: a change in place shows
    where a spill meets the tensor again, or at the end of the pass."""
    return contextlib.nullcontext()


def is_tensor(value) -> bool:
    return isinstance(value, import_paddle().Tensor)


def is_float_tensor(value) -> bool:
    paddle = import_paddle()
    return isinstance(value, paddle.Tensor) and value.dtype in (paddle.float32, paddle.float64, paddle.float16,
                                                                paddle.bfloat16)


def named_layers(model) -> list:
    """(path, layer) for the model and every layer inside it, the model's path being ""."""
    return [("", model)] + list(model.named_sublayers())


def add_hooks(layer, pre=None, post=None, first=False) -> list:
    """Hooks on one layer (see frameworks.hooks); the handles, to remove them."""
    return hooks(layer, pre, post, first, "register_forward_post_hook")


def forward(model, inputs, device: str):
    """The model on the spec's inputs (a dict of keyword arrays or a tuple of positional ones)."""
    paddle = import_paddle()
    with paddle.no_grad():
        if isinstance(inputs, dict):
            return model(**{k: paddle.to_tensor(v) for k, v in inputs.items()})
        return model(*[paddle.to_tensor(v) for v in inputs])


def read_weights(path: str) -> dict[str, np.ndarray]:
    """A converted file's arrays, read without plain pickle."""
    if path.lower().endswith(".safetensors"):
        from ..io.safetensors_io import SafetensorsSource
        with SafetensorsSource(path) as s:
            return {name: s.read(name) for name in s.infos}
    from ..io.pdparams import load_pdparams
    return load_pdparams(path)


def load_into(model, path: str) -> tuple[list[str], list[str]]:
    """Load a converted file into the paddle model; (missing keys, unexpected keys). A file that
    does not fit is not loaded at all (paddle would warn about each key, and load the rest)."""
    import_paddle()
    weights = read_weights(path)
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in weights)
    unexpected = sorted(k for k in weights if k not in expected)
    if not missing and not unexpected:
        misfit = misfits(expected, weights)
        if misfit:
            from ..errors import UserError
            raise UserError(f"'{path}' does not fit the paddle model: {misfit[0]}"
                            f"{f' (and {len(misfit) - 1} more)' if len(misfit) > 1 else ''}; nothing was loaded; "
                            "convert the weights again for this model")
        model.set_state_dict(weights)
    return missing, unexpected


def misfits(expected: dict, weights: dict) -> list[str]:
    """'key: file [shape] dtype, model [shape] dtype' for each array whose shape or dtype is not the
    model's (paddle would skip it with a warning, or cast it), in key order."""
    out = []
    for key in sorted(expected):
        want, got = expected[key], weights[key]
        want_dtype = _dtype_name(want.dtype)
        got_dtype = "bfloat16" if want_dtype == "bfloat16" and str(got.dtype) == "uint16" else str(got.dtype)
        if tuple(want.shape) != tuple(got.shape) or want_dtype != got_dtype:
            out.append(f"{key}: file {list(got.shape)} {got_dtype}, model {list(want.shape)} {want_dtype}")
    return out
