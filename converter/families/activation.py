"""Activations: they pair with each other by kind (a ReLU ported as ReLU6 is paired, compared
and diagnosed rather than lost). PReLU's weight is `_weight` in paddle. GELU's tanh form is
approximate='tanh' in torch and approximate=True in paddle."""

from ..diagnosis import Diagnosis
from . import Family, PortedLayer, register

TORCH_TYPES = ("ReLU", "ReLU6", "GELU", "SiLU", "Hardswish", "Hardsigmoid", "LeakyReLU", "ELU", "SELU", "CELU",
               "Mish", "Tanh", "Sigmoid", "Softplus", "Hardtanh", "PReLU")
PADDLE_TYPES = ("ReLU", "ReLU6", "GELU", "Silu", "Swish", "Hardswish", "Hardsigmoid", "LeakyReLU", "ELU", "SELU",
                "CELU", "Mish", "Tanh", "Sigmoid", "Softplus", "Hardtanh", "PReLU")


def _activation(pair: PortedLayer) -> None:
    pair.rename("weight", "_weight")  # PReLU; the others have none


def _best(candidates, y):
    import numpy as np
    errs = {}
    for name, fn in candidates.items():
        c = fn().numpy().ravel()
        if c.size == y.size:
            errs[name] = float(np.abs(c - y).max() / (np.abs(y).max() + 1e-30))
    best = min(errs, key=errs.get) if errs else None
    return best if best and errs[best] < 1e-5 else None


def variant(ctx, where, torch_module, paddle_layer) -> list:
    """GELU's setting on both sides; else, for the first layer over budget, a what-if: which
    activation each side computes on the same input."""
    names = {c.__name__ for c in type(torch_module).__mro__}
    if "GELU" in names and hasattr(paddle_layer, "_approximate"):
        t_tanh, p_tanh = getattr(torch_module, "approximate", "none") == "tanh", bool(paddle_layer._approximate)
        if t_tanh != p_tanh:
            label = lambda tanh: "tanh approximation" if tanh else "exact (erf)"
            return [Diagnosis(where, f"GELU variant: torch computes the {label(t_tanh)} form, paddle the "
                              f"{label(p_tanh)} form", f"construct paddle.nn.GELU(approximate={t_tanh})", kind="activation")]
    return recorded_variant(ctx) if where == ctx.name else []


def recorded_variant(ctx) -> list:
    """Which activation each side computes on the culprit's recorded input (any culprit that
    takes one tensor and gives one of the same size: HF activation classes too)."""
    import torch
    import torch.nn.functional as F

    ev, call = ctx.evidence, ctx.t_call
    if ev is None or ev.y_local is None or call is None or len(call.args) != 1 \
            or not isinstance(call.args[0], torch.Tensor):
        return []
    x = call.args[0].detach().cpu().double()
    if x.numel() != ev.y_torch.size:
        return []
    candidates = {"GELU (exact, erf)": lambda: F.gelu(x), "GELU (tanh approximation)": lambda: F.gelu(x, approximate="tanh"),
                  "ReLU": lambda: F.relu(x), "ReLU6": lambda: F.relu6(x), "Hardswish": lambda: F.hardswish(x),
                  "SiLU/Swish": lambda: F.silu(x), "Sigmoid": lambda: torch.sigmoid(x), "Tanh": lambda: torch.tanh(x),
                  "QuickGELU (x * sigmoid(1.702 x), CLIP's)": lambda: x * torch.sigmoid(1.702 * x),
                  "LeakyReLU(0.01)": lambda: F.leaky_relu(x, 0.01), "LeakyReLU(0.2)": lambda: F.leaky_relu(x, 0.2),
                  "identity": lambda: x}
    t_name, p_name = _best(candidates, ev.y_torch.ravel()), _best(candidates, ev.y_local.ravel())
    if not t_name or not p_name or t_name == p_name:
        return []
    gelu_form = {"GELU (exact, erf)": "use paddle.nn.GELU(approximate=False) (the default) or "
                                      "F.gelu(x, approximate=False)",
                 "GELU (tanh approximation)": "use paddle.nn.GELU(approximate=True) or F.gelu(x, approximate=True)"}
    hint = gelu_form[t_name] if {t_name, p_name} <= set(gelu_form) else f"compute {t_name} in paddle, as torch does"
    return [Diagnosis(ctx.name, f"activation variant: paddle computes {p_name} where torch computes {t_name}", hint, kind="activation")]


register(Family("activation", TORCH_TYPES, PADDLE_TYPES, _activation, kind="activation", what_ifs=(variant,)))

# HF transformers' own activation modules (transformers/activations.py), by class name: they pair
# with paddle's activation layers (T5 v1.1's NewGELUActivation against PaddleNLP's nn.GELU), and
# their variant is found from what each side computes on the recorded input
HF_TYPES = ("GELUActivation", "NewGELUActivation", "FastGELUActivation", "QuickGELUActivation", "PytorchGELUTanh",
            "ClippedGELUActivation", "AccurateGELUActivation", "MishActivation",
            "LinearActivation", "LaplaceActivation", "ReLUSquaredActivation")
register(Family("hf-activation", HF_TYPES, (), kind="activation", what_ifs=(variant,)))
