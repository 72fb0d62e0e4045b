"""What arithmetic each side really uses, and emulating other formats on CPU.

Formats are named by the precision a matmul or convolution rounds its inputs
to: fp32 (no rounding), tf32 (10 mantissa bits), bf16 (7), fp16 (10, narrow
range). Accumulation is fp32 in every case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from ..families import paddle_rounds_inputs, rounds_inputs

U32 = 2.0 ** -24
UNIT_ROUNDOFF = {"fp32": 0.0, "tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
MANTISSA_BITS = {"tf32": 10, "fp16": 10, "bf16": 7}
FORMATS = tuple(UNIT_ROUNDOFF)
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
    return paddle.to_tensor(round_array(t.numpy(), fmt))


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
        if cc[0] >= 8 and uses_tf32 and not _tf32_override_off():
            side.matmul = "tf32"
    return side


def paddle_precision(device: str) -> SidePrecision:
    import paddle
    flags = {"NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE")}
    for name in ("FLAGS_cublas_allow_tf32", "FLAGS_cudnn_allow_tf32"):
        try:
            flags[name] = bool(paddle.get_flags([name])[name])
        except (ValueError, KeyError, RuntimeError):
            pass
    core = getattr(getattr(paddle, "base", None), "core", None)
    if "FLAGS_cublas_allow_tf32" not in flags and core is not None and hasattr(core, "get_cublas_switch"):
        flags["cublas_switch"] = bool(core.get_cublas_switch())
    side = SidePrecision("paddle", device, flags)
    if device == "cuda" and paddle.device.is_compiled_with_cuda():
        cc = paddle.device.cuda.get_device_capability()
        flags["compute_capability"] = f"{cc[0]}.{cc[1]}"
        uses_tf32 = flags.get("FLAGS_cublas_allow_tf32", flags.get("cublas_switch", False))
        if cc[0] >= 8 and uses_tf32 and not _tf32_override_off():
            side.matmul = "tf32"
    return side


def set_strict(device: str) -> None:
    """Turn TF32 off on both sides."""
    import paddle
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for name in ("FLAGS_cublas_allow_tf32", "FLAGS_cudnn_allow_tf32"):
        try:
            paddle.set_flags({name: False})
        except (ValueError, RuntimeError):
            pass


def parse_emulate(values) -> dict[str, str]:
    out = {}
    for value in values or ():
        side, _, fmt = value.partition("=")
        if side not in ("torch", "paddle") or fmt not in ("tf32", "bf16", "fp16"):
            raise UserError(f"--emulate takes SIDE=MODE with SIDE torch or paddle and MODE tf32, bf16 or fp16; got '{value}'")
        out[side] = fmt
    return out


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


def round_torch_matmuls(model, fmt: str):
    """Round the inputs and weights of every torch matmul layer in `model` to `fmt`.
    Returns (the original weights, the hook handles), to undo it."""
    import torch
    saved, handles = [], []
    for m in model.modules():
        if not rounds_inputs(m):
            continue
        saved.append((m, m.weight.detach().clone()))
        with torch.no_grad():
            m.weight.copy_(round_torch(m.weight, fmt))
        handles.append(m.register_forward_pre_hook(
            lambda mod, args, _f=fmt: tuple(round_torch(a, _f) if isinstance(a, torch.Tensor) else a for a in args)))
    return saved, handles


def emulate_torch(model, fmt: str) -> list:
    """Round inputs and weights of every torch matmul layer to `fmt` for good; returns hook handles."""
    return round_torch_matmuls(model, fmt)[1]


def emulate_paddle(model, fmt: str) -> set[str]:
    """Round inputs and weights of every paddle matmul layer to `fmt`; returns the state-dict
    names of the weights it rounded."""
    import paddle

    from ..frameworks import paddle_side
    handles, names = [], set()
    for path, layer in paddle_side.named_layers(model):
        if not paddle_rounds_inputs(layer):
            continue
        layer.weight.set_value(round_array(layer.weight.numpy(), fmt))
        names.add(f"{path}.weight" if path else "weight")
        handles.append(layer.register_forward_pre_hook(
            lambda lay, args, _f=fmt: tuple(round_paddle(a, _f) if isinstance(a, paddle.Tensor) else a for a in args)))
    model._port_emulation_hooks = handles
    return names
