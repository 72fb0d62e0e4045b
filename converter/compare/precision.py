"""What arithmetic each side really uses, and emulating other formats on CPU.

Formats are named by the precision a matmul or convolution rounds its inputs
to: fp32 (no rounding), tf32 (10 mantissa bits), bf16 (7), fp16 (10, narrow
range). Accumulation is fp32 in every case.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np


U32 = 2.0 ** -24
UNIT_ROUNDOFF = {"fp32": 0.0, "tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
MANTISSA_BITS = {"tf32": 10, "fp16": 10, "bf16": 7}
# the unit roundoff of what a matmul computed in each format stores: TF32 is a compute format
# with fp32 results, while bf16 and fp16 kernels (autocast, AMP) return their own format
STORED_UNIT = {"fp32": U32, "tf32": U32, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def round_array(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round floating values to `fmt`'s mantissa, to nearest even (exact in fp32/fp64 storage)."""
    if fmt == "fp32" or not np.issubdtype(x.dtype, np.floating):
        return x
    if fmt == "fp16":
        return x.astype(np.float16).astype(x.dtype)
    bits = MANTISSA_BITS[fmt]
    if x.dtype == np.float32:  # on the bits: a carry out of the mantissa moves up the exponent, as it should
        drop = 23 - bits
        b = x.view(np.uint32)
        with np.errstate(over="ignore"):
            kept = (b + np.uint32((1 << (drop - 1)) - 1) + ((b >> np.uint32(drop)) & np.uint32(1))) \
                & np.uint32(0xFFFFFFFF ^ ((1 << drop) - 1))
        return np.where(np.isnan(x), x, kept.view(np.float32))
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), e).astype(x.dtype)


def round_torch(t, fmt: str):
    import torch
    if fmt == "fp32" or not t.is_floating_point():
        return t
    if fmt == "fp16":
        return t.half().to(t.dtype)
    if fmt == "bf16" and t.dtype == torch.float32:
        return t.bfloat16().float()
    bits = MANTISSA_BITS[fmt]
    m, e = torch.frexp(t)
    return torch.ldexp(torch.round(m * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), e.to(t.dtype)).to(t.dtype)


def round_paddle(t, fmt: str):
    import paddle
    if fmt == "fp32" or t.dtype not in (paddle.float32, paddle.float64):
        return t
    return paddle.to_tensor(round_array(t.numpy(), fmt), place=t.place)


@dataclass
class SidePrecision:
    """A side's precision state as recorded, and the matmul format that follows from it."""

    framework: str
    device: str
    flags: dict = field(default_factory=dict)
    matmul: str = "fp32"
    emulated: str | None = None

    @property
    def format(self) -> str:
        return self.emulated or self.matmul

    @property
    def can_run_tf32(self) -> bool:
        """TF32 exists only in NVIDIA GPUs' tensor cores of compute capability 8.0 and later."""
        capability = self.flags.get("compute_capability")
        return self.device == "cuda" and capability is not None and int(capability.split(".")[0]) >= 8

    def to_json(self) -> dict:
        return {"framework": self.framework, "device": self.device, "flags": self.flags,
                "matmul_format": self.matmul, "emulated": self.emulated, "effective": self.format}


def _tf32_override_off() -> bool:
    return os.environ.get("NVIDIA_TF32_OVERRIDE") == "0"


def torch_precision(device: str) -> SidePrecision:
    import torch
    flags = {
        "cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE"),
    }
    fp32_precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if fp32_precision is not None:
        flags["cuda.matmul.fp32_precision"] = fp32_precision
    side = SidePrecision("torch", device, flags)
    if device == "cuda" and torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        flags["compute_capability"] = f"{cc[0]}.{cc[1]}"
        uses_tf32 = flags["cuda.matmul.allow_tf32"] or fp32_precision == "tf32"
        if side.can_run_tf32 and uses_tf32 and not _tf32_override_off():
            side.matmul = "tf32"
    return side


def paddle_precision(device: str) -> SidePrecision:
    import paddle
    flags = {"NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE"), **read_paddle_flags(PADDLE_TF32_FLAGS, bool),
             # paddle 3.3's kernels aligned with torch's (GPU; nothing changes on CPU)
             **read_paddle_flags(ALIGNED_KERNEL_FLAGS)}
    core = getattr(getattr(paddle, "base", None), "core", None)
    if "FLAGS_cublas_allow_tf32" not in flags and core is not None and hasattr(core, "get_cublas_switch"):
        flags["cublas_switch"] = bool(core.get_cublas_switch())
    side = SidePrecision("paddle", device, flags)
    if device == "cuda" and paddle.device.is_compiled_with_cuda():
        cc = paddle.device.cuda.get_device_capability()
        flags["compute_capability"] = f"{cc[0]}.{cc[1]}"
        uses_tf32 = flags.get("FLAGS_cublas_allow_tf32", flags.get("cublas_switch", False))
        if side.can_run_tf32 and uses_tf32 and not _tf32_override_off():
            side.matmul = "tf32"
    return side


ALIGNED_KERNEL_FLAGS = ("FLAGS_use_accuracy_compatible_kernel", "FLAGS_use_legacy_gemm", "FLAGS_cudnn_deterministic")
PADDLE_TF32_FLAGS = ("FLAGS_cublas_allow_tf32", "FLAGS_cudnn_allow_tf32")


def read_paddle_flags(names, kind=lambda value: value) -> dict:
    """paddle's flags `names` as `kind` makes them, those this build has and can read."""
    import paddle
    flags = {}
    for name in names:
        try:
            flags[name] = kind(paddle.get_flags([name])[name])
        except (ValueError, KeyError, RuntimeError):  # not in this build, or not readable on it (CPU)
            pass
    return flags


@contextlib.contextmanager
def fp32_arithmetic():
    """TF32 off on both sides inside the block (torch's matmul and cuDNN switches and float32
    matmul precision, paddle's cuBLAS and cuDNN flags), each put back as it was after it."""
    import paddle
    import torch
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32, torch.get_float32_matmul_precision())
    flags = read_paddle_flags(PADDLE_TF32_FLAGS, bool)  # one not readable is left alone
    try:
        set_strict()
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
        for name, value in flags.items():
            paddle.set_flags({name: value})


def set_strict() -> None:
    """Turn TF32 off on both sides."""
    import paddle
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for name in PADDLE_TF32_FLAGS:
        try:
            paddle.set_flags({name: False})
        except (ValueError, RuntimeError):
            pass


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16; Linux only:
    elsewhere False, which only costs speed)."""
    global _NATIVE_BF16
    if _NATIVE_BF16 is None:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        except OSError:
            flags = []
        _NATIVE_BF16 = bool({"amx_bf16", "avx512_bf16"} & set(flags))
    return _NATIVE_BF16


_NATIVE_BF16: bool | None = None


# The matmul-like operators a lower-precision format rounds the inputs of, with the positions of
# the arguments it rounds: every product on a GPU in TF32 (cuBLAS and cuDNN), not only the Linear
# and Conv layers (an attention's own q.k^T, DeBERTa's c2p and p2c terms). torch's are seen at the
# ATen level, where linear, matmul and einsum have become mm, bmm and addmm; paddle's are the
# operators of paddle._C_ops that its functions and Tensor methods call, and the @ operator.
_ATEN_ROUNDED = {"mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1), "vdot": (0, 1),
                 "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "addmv": (1, 2),
                 "convolution": (0, 1), "_convolution": (0, 1),
                 "_scaled_dot_product_flash_attention_for_cpu": (0, 1, 2),
                 "_scaled_dot_product_flash_attention": (0, 1, 2),
                 "_scaled_dot_product_efficient_attention": (0, 1, 2),
                 "_scaled_dot_product_cudnn_attention": (0, 1, 2), "_trilinear": (0, 1, 2)}
_PADDLE_ROUNDED = {"matmul": (0, 1), "bmm": (0, 1), "dot": (0, 1), "mv": (0, 1), "linear": (0, 1),
                   "linear_v2": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "einsum": (0,), "multi_dot": (0,),
                   "conv2d": (0, 1), "conv3d": (0, 1), "depthwise_conv2d": (0, 1), "conv2d_transpose": (0, 1),
                   "conv3d_transpose": (0, 1), "depthwise_conv2d_transpose": (0, 1), "conv2d_transpose_bias": (0, 1),
                   "bilinear": (0, 1, 2)}
_PADDLE_TENSOR_ROUNDED = ("__matmul__", "__rmatmul__")


# The effect of rounding on a layer's output is one draw per element of a sum of many rounding
# errors: where that draw happens to be small, an implementation that rounds other values (a
# scale applied before the product instead of after) lands elsewhere. Budgets take the rms over
# this many draws: round to nearest, then rounding errors of the same size drawn at random.
ROUNDING_DRAWS = 4


def dither_torch(t, fmt: str, generator):
    """`t` moved by a random error of the size `fmt`'s rounding makes: uniform within half a unit
    in the last place of the format, at each element's own exponent."""
    import torch
    if not t.is_floating_point():
        return t
    _, e = torch.frexp(t)
    ulp = torch.ldexp(torch.ones_like(t), e - (MANTISSA_BITS[fmt] + 1))
    noise = torch.rand(t.shape, generator=generator, dtype=t.dtype) - 0.5
    return t + ulp * noise.to(t.device)


def torch_rounding(fmt: str, dtypes=("float32",), draw: int = 0):
    """A context under which every matmul, batched matmul, convolution and fused attention torch
    runs on this thread rounds its inputs of `dtypes` to `fmt` (results as computed; autograd
    sees through the rounding, as a GPU's TF32 backward does). draw 0 rounds to nearest; draw k
    > 0 makes errors of the same size at random instead (seeded by k; see ROUNDING_DRAWS)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    aten = torch.ops.aten
    rounded = {getattr(aten, name): where for name, where in _ATEN_ROUNDED.items() if hasattr(aten, name)}
    kinds = tuple(getattr(torch, d) for d in dtypes)
    if draw:
        generator = torch.Generator().manual_seed(draw)
        change = lambda t: dither_torch(t, fmt, generator)
    else:
        change = lambda t: round_torch(t, fmt)

    class MatmulRounding(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            where = rounded.get(func.overloadpacket)
            if where is not None:
                args = tuple(change(a) if i in where and isinstance(a, torch.Tensor) and a.dtype in kinds
                             else a for i, a in enumerate(args))
            return func(*args, **(kwargs or {}))

    return MatmulRounding()


def emulate_torch(model, fmt: str) -> list:
    """Every forward of `model` or of any of its modules (replays of one module on its own
    included) runs under torch_rounding(fmt) for its float32 products; returns the hook
    handles, to undo it."""
    return _on_outermost_call(model, lambda: [torch_rounding(fmt)])


def _on_outermost_call(model, modes) -> list:
    """Hooks under which every forward of `model` or of one of its modules runs inside the contexts
    `modes()` makes; returns the hook handles. The modes are thread-local, so they are entered by the
    outermost module call on each thread and left when that call ends, also by an exception."""
    state = threading.local()

    def enter(module, args):
        depth = getattr(state, "depth", 0)
        if depth == 0:
            state.stack = contextlib.ExitStack()
            for mode in modes():
                state.stack.enter_context(mode)
        state.depth = depth + 1

    def leave(module, args, out):
        state.depth -= 1
        if state.depth == 0:
            state.stack.close()

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    return handles


# The products as torch's function level shows them (what autograd records), with the positions
# and names of the arguments rounded; None: every tensor argument (einsum's operands, a list's).
def _torch_function_products() -> dict:
    import torch
    F = torch.nn.functional
    two, added, qkv = ((0, "input"), (1, "weight"), (1, "other"), (1, "mat2"), (1, "vec"), (1, "tensor")), \
        ((1, "mat1"), (2, "mat2"), (1, "batch1"), (2, "batch2"), (1, "mat"), (2, "vec")), \
        ((0, "query"), (1, "key"), (2, "value"))
    out = {f: two for f in (torch.mm, torch.bmm, torch.mv, torch.dot, torch.vdot, torch.matmul, torch.inner,
                            F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
                            F.conv_transpose3d, torch.Tensor.mm, torch.Tensor.bmm, torch.Tensor.mv, torch.Tensor.dot,
                            torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__)}
    out.update({f: added for f in (torch.addmm, torch.baddbmm, torch.addbmm, torch.addmv, torch.Tensor.addmm,
                                   torch.Tensor.baddbmm, torch.Tensor.addbmm, torch.Tensor.addmv)})
    out.update({F.scaled_dot_product_attention: qkv, F.bilinear: two + ((1, "input2"), (2, "weight"))})
    out.update({f: None for f in (torch.einsum, torch.tensordot, torch.linalg.multi_dot, torch.chain_matmul)})
    return out


def torch_straight_through(fmt: str):
    """A context under which the float32 inputs of every product torch's function level shows
    (linear, matmul and @, bmm, einsum, convolutions, fused attention: what autograd records) are
    rounded to `fmt` with the gradient passed straight through: the product's backward is the
    unrounded product's backward on the rounded inputs, d(round(a) b)/da := round(b) (as the
    forward used it), and the rounding itself passes gradients unchanged. A product inside a
    function that is one call at this level (nn.MultiheadAttention's functional form, an RNN's
    kernel) is not seen here: emulate_torch_training enters torch_rounding beside this mode, which
    rounds those too, at the ATen level, where autograd does not see it."""
    import torch
    from torch.overrides import TorchFunctionMode
    products = _torch_function_products()

    def straight(t):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return t
        rounded = round_torch(t.detach(), fmt)
        return t + (rounded - t.detach()) if t.requires_grad else rounded

    def listed(t):
        return type(t)(straight(v) for v in t) if isinstance(t, (list, tuple)) else straight(t)

    class StraightThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products:
                where = products[func]
                if where is None:
                    args, kwargs = tuple(listed(a) for a in args), {k: listed(v) for k, v in kwargs.items()}
                else:
                    args = tuple(straight(a) if any(i == p for p, _ in where) else a for i, a in enumerate(args))
                    kwargs = {k: straight(v) if any(k == n for _, n in where) else v for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return StraightThrough()


def emulate_torch_training(model, fmt: str | None) -> list:
    """The emulation of a format in training: every forward of `model` rounds the float32 inputs of
    its products to `fmt` as the forward check does (torch_rounding), with straight-through
    gradients wherever torch's function level shows the product (torch_straight_through); the
    stored parameters stay as they are, as on a GPU in TF32. Returns hook handles (none for fp32
    or None)."""
    if fmt in (None, "fp32"):
        return []
    return _on_outermost_call(model, lambda: [torch_straight_through(fmt), torch_rounding(fmt)])


def emulate_paddle_training(fmt: str | None) -> list:
    """The emulation of a format in paddle's training runs: emulate_paddle (straight through already:
    each rounded input is the unrounded one plus a detached difference, so d(round(a) b)/da :=
    round(b)); a handle list for remove() (none for fp32 or None): its handle's remove() is the
    function emulate_paddle returns, which undoes it once."""
    if fmt in (None, "fp32"):
        return []
    return [SimpleNamespace(remove=emulate_paddle(fmt))]


def remove(handles: list) -> None:
    """Undo what emulate_torch_training and emulate_paddle_training (or any hook handles) did, last first."""
    for handle in reversed(handles):
        handle.remove()


def _round_paddle_value(value, fmt: str):
    """A paddle operator argument with its float32 tensors rounded to `fmt` (a list's too);
    gradients pass straight through the rounding."""
    import paddle
    if isinstance(value, (list, tuple)):
        return type(value)(_round_paddle_value(v, fmt) for v in value)
    if not isinstance(value, paddle.Tensor) or value.dtype != paddle.float32:
        return value
    r = round_paddle(value, fmt)
    return r if value.stop_gradient else value + (r - value).detach()


def emulate_paddle(fmt: str):
    """Every float32 matmul, batched matmul and convolution paddle runs on the calling thread, in any
    layer or function, rounds its inputs to `fmt` until the returned function is called. paddle's
    operators are module functions: they are replaced for the calling thread alone
    (patches.thread_patch), so another verification on another thread keeps its own arithmetic.
    Calls nest on a thread; a nested call in another format is an error of the caller."""
    import paddle

    from ..patches import thread_patch
    me = threading.get_ident()
    with _EMULATING_LOCK:
        formats = _EMULATING.setdefault(me, [])
        if formats and formats[-1] != fmt:
            raise RuntimeError(f"paddle already emulates {formats[-1]}, not {fmt}")
        formats.append(fmt)
    stack = contextlib.ExitStack()
    targets = [(paddle._C_ops, name, where) for name, where in _PADDLE_ROUNDED.items() if hasattr(paddle._C_ops, name)]
    targets += [(paddle.Tensor, name, (0, 1)) for name in _PADDLE_TENSOR_ROUNDED]
    for owner, name, where in targets:
        stack.enter_context(thread_patch(owner, name).patched(lambda op, w=where: _rounding(op, w, fmt)))

    restored = []

    def restore() -> None:
        if restored:  # a second call undoes nothing
            return
        restored.append(True)
        stack.close()
        with _EMULATING_LOCK:
            formats.pop()
            if not formats:
                del _EMULATING[me]
    return restore


def _rounding(op, where, fmt: str):
    """`op`, rounding its float32 tensor arguments at positions `where` to `fmt`."""
    def call(*args, **kwargs):
        return op(*(_round_paddle_value(a, fmt) if i in where else a for i, a in enumerate(args)), **kwargs)
    return call


_EMULATING: dict[int, list[str]] = {}  # thread -> the formats it emulates, innermost last
_EMULATING_LOCK = threading.Lock()
