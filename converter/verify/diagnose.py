"""Known porting pitfalls, checked against the first layer over budget.

Each check has the same signature, check(ctx) -> list[Diagnosis], and looks at the
torch module and paddle layer (their settings, their weights under the mapping) or
re-runs the layer to test a what-if. Every diagnosis names a layer, a cause and a
hint saying what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..frameworks import paddle_side
from ..frameworks.paddle_side import to_numpy
from .precision import round_array
from .report import Diagnosis, LayerResult


@dataclass
class Context:
    session: object
    result: LayerResult
    torch_module: object
    paddle_layer: object
    evidence: object
    children_within: bool
    t_call: object = None  # the torch layer's recorded call, when there is one
    p_call: object = None  # the paddle layer's recorded call, when there is one
    pairs: list = ()  # the aligned pairs inside the culprit (LayerPair)

    @property
    def name(self) -> str:
        return self.result.torch or "<model>"


def _names(obj) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _walk_pairs(ctx):
    """(torch path, torch module, paddle layer) for the culprit and the sublayers paired with
    it: by alignment (real ports name them differently), and by the same relative path."""
    seen = set()
    for pair in ctx.pairs:
        seen.add(pair.torch)
        yield pair.torch or "<model>", ctx.session.torch_module(pair.torch), ctx.session.paddle_layer(pair.paddle)
    t_root, p_root = ctx.torch_module, ctx.paddle_layer
    p_layers = dict(paddle_side.named_layers(p_root))
    for rel, module in t_root.named_modules():
        path = ".".join(filter(None, [ctx.result.torch, rel]))
        if rel in p_layers and path not in seen:
            yield path or "<model>", module, p_layers[rel]


def check_weights(ctx) -> list[Diagnosis]:
    """Paddle weights that are not torch's under the mapping; a square one transposed."""
    session = ctx.session
    prefix = ctx.result.torch
    paddle_state = session.paddle_model.state_dict()
    emulated = session.options.emulate.get("paddle")
    out = []
    for entry in session.plan.entries:
        sources = [p.source for p in entry.parts]
        if prefix and not any(s == prefix or s.startswith(prefix + ".") for s in sources):
            continue
        if entry.name not in paddle_state:
            continue
        expected = entry.compute(session.torch_state.read)
        if entry.dtype == "bfloat16":
            expected = dtypes.bf16_to_f32(expected)
        actual = to_numpy(paddle_state[entry.name])
        if emulated and entry.name in session.rounded_weights:
            expected = round_array(np.ascontiguousarray(expected), emulated)
        if actual.shape == expected.shape and np.array_equal(actual, expected):
            continue
        if actual.ndim == 2 and actual.shape[0] == actual.shape[1] and np.array_equal(actual, expected.T):
            out.append(Diagnosis(entry.name, f"paddle weight '{entry.name}' {list(actual.shape)} is square and holds "
                                 f"torch's '{sources[0]}' untransposed",
                                 "paddle.nn.Linear stores [in, out]: transpose torch's [out, in] weight when converting "
                                 "(convert-weights decides this by module type; check the mapping's transpose rules)"))
        elif actual.shape != expected.shape:
            out.append(Diagnosis(entry.name, f"paddle weight '{entry.name}' has shape {list(actual.shape)}, the mapping "
                                 f"gives {list(expected.shape)}", "reconvert the weights for this model"))
        else:
            diff = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max())
            out.append(Diagnosis(entry.name, f"paddle weight '{entry.name}' differs from torch's '{sources[0]}' under the "
                                 f"mapping (max abs {diff:.3g})",
                                 "load the converted weights again, and check that nothing changes them after loading"))
    return out


EPSILON_NAMES = ("eps", "epsilon", "_epsilon", "variance_epsilon", "_eps", "layer_norm_eps", "norm_eps",
                 "rms_norm_eps", "layer_norm_epsilon")


def epsilon_of(layer) -> tuple[str, float] | None:
    """(attribute, value) of a normalisation's epsilon, whatever the class calls it (LayerNorm's
    eps, paddle's _epsilon, RMSNorm's variance_epsilon, ...); None when it has none."""
    for name in EPSILON_NAMES:
        value = getattr(layer, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
            return name, float(value)
    return None


def check_norm_eps(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        t_eps, p_eps = epsilon_of(m), epsilon_of(p)
        if t_eps is None or p_eps is None or np.isclose(t_eps[1], p_eps[1], rtol=1e-6, atol=0):
            continue
        kind = type(m).__name__
        out.append(Diagnosis(where, f"{kind} epsilon differs: torch {t_eps[0]}={t_eps[1]:g}, paddle "
                             f"{p_eps[0].lstrip('_')}={p_eps[1]:g}",
                             f"construct the paddle {type(p).__name__} with {p_eps[0].lstrip('_')}={t_eps[1]:g}"))
    return out


def check_bn_momentum(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        if "_BatchNorm" not in _names(m) or getattr(p, "_momentum", None) is None or m.momentum is None:
            continue
        if not np.isclose(p._momentum, 1.0 - m.momentum):
                out.append(Diagnosis(where, f"BatchNorm momentum convention: torch momentum={m.momentum:g} weights the new "
                                 f"batch, paddle momentum={p._momentum:g} weights the old statistics",
                                 f"use momentum={1.0 - m.momentum:g} in paddle (1 - torch's)"))
    return out


def _activation_candidates(x):
    import torch
    import torch.nn.functional as F
    return {"GELU (exact, erf)": lambda: F.gelu(x), "GELU (tanh approximation)": lambda: F.gelu(x, approximate="tanh"),
            "ReLU": lambda: F.relu(x), "ReLU6": lambda: F.relu6(x), "Hardswish": lambda: F.hardswish(x),
            "SiLU/Swish": lambda: F.silu(x), "Sigmoid": lambda: torch.sigmoid(x), "Tanh": lambda: torch.tanh(x),
            "LeakyReLU(0.01)": lambda: F.leaky_relu(x, 0.01), "LeakyReLU(0.2)": lambda: F.leaky_relu(x, 0.2),
            "identity": lambda: x}


def _best(candidates, y):
    errs = {}
    for name, fn in candidates.items():
        c = fn().numpy().ravel()
        if c.size == y.size:
            errs[name] = float(np.abs(c - y).max() / (np.abs(y).max() + 1e-30))
    best = min(errs, key=errs.get) if errs else None
    return (best, errs[best]) if best and errs[best] < 1e-5 else (None, None)


def check_activation(ctx) -> list[Diagnosis]:
    """GELU's setting on both sides; else a what-if: which activation each side computes on the same input."""
    m, p = ctx.torch_module, ctx.paddle_layer
    if "GELU" in _names(m) and hasattr(p, "_approximate"):
        t_tanh, p_tanh = getattr(m, "approximate", "none") == "tanh", bool(p._approximate)
        if t_tanh != p_tanh:
            label = lambda tanh: "tanh approximation" if tanh else "exact (erf)"
            return [Diagnosis(ctx.name, f"GELU variant: torch computes the {label(t_tanh)} form, paddle the {label(p_tanh)} form",
                              f"construct paddle.nn.GELU(approximate={t_tanh})")]
    ev, t_call = ctx.evidence, ctx.t_call
    if ev is None or ev.y_local is None or t_call is None:
        return []
    import torch
    if len(t_call.args) != 1 or not isinstance(t_call.args[0], torch.Tensor):
        return []
    x = t_call.args[0].detach().cpu().double()
    if x.numel() != ev.y_torch.size:
        return []
    cands = _activation_candidates(x)
    t_name, _ = _best(cands, ev.y_torch.ravel())
    p_name, _ = _best(cands, ev.y_local.ravel())
    if t_name and p_name and t_name != p_name:
        hint = {"GELU (tanh approximation)": "use paddle.nn.GELU(approximate=False) (the default) or F.gelu(x, approximate=False)",
                "GELU (exact, erf)": "use paddle.nn.GELU(approximate=True) or F.gelu(x, approximate=True)"}.get(
            p_name, f"compute {t_name} in paddle, as torch does")
        return [Diagnosis(ctx.name, f"activation variant: paddle computes {p_name} where torch computes {t_name}", hint)]
    return []


def check_batch_statistics(ctx) -> list[Diagnosis]:
    """What-if: does paddle's BatchNorm output match normalising with the batch's own statistics?"""
    m, ev, t_call = ctx.torch_module, ctx.evidence, ctx.t_call
    if "_BatchNorm" not in _names(m) or ev is None or ev.y_local is None or t_call is None:
        return []
    import torch.nn.functional as F
    x = t_call.args[0].detach().cpu().double()
    w = None if m.weight is None else m.weight.detach().cpu().double()
    b = None if m.bias is None else m.bias.detach().cpu().double()
    batch = F.batch_norm(x, None, None, w, b, True, 0.0, m.eps).numpy()
    scale = float(np.abs(batch).max()) + 1e-30
    if float(np.abs(batch.ravel() - ev.y_local.ravel()).max()) < 1e-4 * scale:
        return [Diagnosis(ctx.name, "the paddle BatchNorm normalises with the batch's own statistics (training mode), "
                          "torch with its running statistics",
                          "call model.eval(), and do not pass training=True / use_global_stats=False to batch_norm")]
    return []


def check_avgpool(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        if not any(n.startswith("AvgPool") for n in _names(m)) or not hasattr(p, "exclusive"):
            continue
        if bool(m.count_include_pad) == bool(p.exclusive):
                out.append(Diagnosis(where, f"AvgPool padding: torch count_include_pad={m.count_include_pad}, paddle "
                                 f"exclusive={p.exclusive} (paddle's default excludes padding, torch's includes it)",
                                 f"construct the paddle pool with exclusive={not m.count_include_pad}"))
    return out


def check_interpolate(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        if "Upsample" not in _names(m) or not hasattr(p, "align_corners"):
            continue
        t_ac = bool(m.align_corners)
        if t_ac != bool(p.align_corners) or getattr(m, "mode", None) != getattr(p, "mode", None):
            out.append(Diagnosis(where, f"interpolation differs: torch mode={m.mode} align_corners={t_ac}, paddle "
                                 f"mode={p.mode} align_corners={p.align_corners}",
                                 f"use mode='{m.mode}', align_corners={t_ac} in paddle"))
        elif not t_ac and getattr(p, "align_mode", 0) != 0 and m.mode in ("linear", "bilinear", "trilinear"):
            out.append(Diagnosis(where, f"interpolation align_mode={p.align_mode} in paddle; torch's half-pixel "
                                 "sampling is align_mode=0", "use align_mode=0 in paddle"))
    return out


def check_padding_mode(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        t_mode, p_mode = getattr(m, "padding_mode", None), getattr(p, "_padding_mode", None)
        if t_mode and p_mode and t_mode != p_mode:
                out.append(Diagnosis(where, f"padding mode differs: torch '{t_mode}', paddle '{p_mode}'",
                                 f"construct the paddle layer with padding_mode='{t_mode}'"))
    return out


def check_training(ctx) -> list[Diagnosis]:
    """A layer in training mode, or randomness between two identical runs (dropout left on)."""
    from .replay import run_paddle
    out = []
    training = [n for n, l in paddle_side.named_layers(ctx.paddle_layer) if l.training]
    if training:
        out.append(Diagnosis(ctx.name, f"paddle layer(s) in training mode: {', '.join(training[:3]) or '<this layer>'}",
                             "call model.eval() on the paddle model before comparing"))
    ev = ctx.evidence
    if ev is not None and ev.forced is not None:
        again = run_paddle(ctx.paddle_layer, *ev.forced)
        first = run_paddle(ctx.paddle_layer, *ev.forced)
        if any(a.shape == b.shape and not np.array_equal(a, b) for a, b in zip(again, first)):
            zeros_p = float(np.mean(first[0] == 0))
            zeros_t = float(np.mean(ev.y_torch == 0))
            out.append(Diagnosis(ctx.name, f"the paddle layer gives different outputs on the same input "
                                 f"({zeros_p:.0%} zeros vs torch's {zeros_t:.0%}): dropout is active in eval",
                                 "paddle.nn.functional.dropout defaults to training=True: pass training=self.training, "
                                 "or use a paddle.nn.Dropout layer"))
    return out


def check_precision(ctx) -> list[Diagnosis]:
    """Over the budget of the recorded formats, but within the budget if one side used a lower precision."""
    ev = ctx.evidence
    if ev is None or ev.y_local is None or ev.budget is None:
        return []
    from .analyze import layer_budget
    t_call = ctx.t_call
    if t_call is None:
        return []
    diff = np.abs(ev.y_local - ev.y_torch)
    for fmt, label in (("tf32", "TF32"), ("fp16", "fp16"), ("bf16", "bf16")):
        for side in ("paddle", "torch"):
            formats = dict(ctx.session.formats)
            if formats[side] == fmt:
                continue
            formats[side] = fmt
            budget = layer_budget(ctx.session, ctx.result.torch, t_call, ev.y_torch, ev.y64, formats)
            ratio, tol = budget.ratio(diff)
            if ratio <= 1.0:
                return [Diagnosis(ctx.name, f"consistent with {label} on one side: the local error "
                                  f"{float(diff.max()):.3g} is over the {ctx.session.formats[side]} budget "
                                  f"({ctx.result.budget:.3g}) but within the {label} budget ({tol:.3g}) for the {side} side",
                                  f"if {side} really runs {label}, say so with --emulate {side}={fmt}; to compare exactly, "
                                  f"turn it off ({'FLAGS_cublas_allow_tf32=0, ' if side == 'paddle' else ''}"
                                  "NVIDIA_TF32_OVERRIDE=0 or --precision strict)")]
    return []


def check_own_forward(ctx) -> list[Diagnosis]:
    if not ctx.children_within:
        return []
    return [Diagnosis(ctx.name, f"the difference arises in {ctx.name}'s own forward: every paired sublayer inside "
                      "it is within budget", "compare its forward line by line: scales (1/sqrt(d)), softmax axes, "
                      "residual connections, activations called as functions, reshapes and transposes, masks")]


CHECKS = (check_norm_eps, check_bn_momentum, check_activation, check_batch_statistics, check_avgpool, check_interpolate,
          check_padding_mode, check_training, check_precision)


def check_untransposed(ctx) -> list[Diagnosis]:
    """A paired Linear whose square paddle weight is torch's as is (paddle's Linear wants [in, out]),
    found from the two layers themselves, whatever the mapping says."""
    out = []
    for where, m, p in _walk_pairs(ctx):
        if "Linear" not in _names(m) or "Linear" not in _names(p) or getattr(m, "weight", None) is None:
            continue
        w, pw = m.weight.detach().cpu().numpy(), to_numpy(p.weight)
        if w.ndim == 2 and w.shape[0] == w.shape[1] and pw.shape == w.shape and np.array_equal(pw, w) \
                and not np.array_equal(w, w.T):
            out.append(Diagnosis(where, f"paddle's {type(p).__name__} weight {list(pw.shape)} is square and holds "
                                 f"torch's '{where}.weight' untransposed",
                                 "paddle.nn.Linear stores [in, out]: transpose torch's [out, in] weight (a rule "
                                 "file needs a transpose rule for it)"))
    return out


def diagnose(ctx) -> list[Diagnosis]:
    from .diagnose_model import CHECKS as MODEL_CHECKS
    found = check_weights(ctx)  # under the mapping; then from the two layers themselves
    if not any("untransposed" in d.cause for d in found):
        found.extend(check_untransposed(ctx))
    for check in CHECKS + MODEL_CHECKS:
        found.extend(check(ctx))
    if not found:
        found = check_own_forward(ctx)
    if not found:
        found = [Diagnosis(ctx.name, "no known porting pitfall fits this layer",
                           f"compare the forward of torch {type(ctx.torch_module).__name__} and paddle "
                           f"{type(ctx.paddle_layer).__name__} line by line on the recorded inputs")]
    return found
