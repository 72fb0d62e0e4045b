"""Known porting pitfalls, checked against the first layer over budget.

Each check has the same signature, check(ctx) -> list[Diagnosis], and looks at the
torch module and paddle layer (their settings, their weights under the mapping) or
re-runs the layer to test a what-if. Every diagnosis names a layer, a cause and a
hint saying what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from .. import dtypes
from ..frameworks import paddle_side
from ..frameworks.paddle_side import to_numpy
from ..families import lookup
from ..paths import is_under, join
from ..diagnosis import CONFIRMED
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


def _walk_pairs(ctx):
    """(torch path, torch module, paddle layer) for the culprit and the sublayers paired with
    it: by alignment (real ports name them differently), and by the same relative path."""
    seen = set()
    for pair in ctx.pairs:
        seen.add(pair.torch)
        yield pair.torch or "<model>", ctx.session.torch_module(pair.torch), ctx.session.paddle_layer(pair.paddle)
    p_layers = dict(paddle_side.named_layers(ctx.paddle_layer))
    for rel, _ in ctx.torch_module.named_modules():
        path = join(ctx.result.torch, rel)
        if rel in p_layers and path not in seen:  # through the session: a streamed model's block made
            yield (path or "<model>", ctx.session.torch_module(path),
                   ctx.session.paddle_layer(join(ctx.result.paddle, rel)))


def check_weights(ctx) -> list[Diagnosis]:
    """Paddle weights that are not torch's under the mapping; a square one transposed."""
    session = ctx.session
    prefix = ctx.result.torch
    paddle_state = session.paddle_model.state_dict()
    parameters = {name for name, _ in session.paddle_model.named_parameters()}
    within = lambda entry: any(is_under(p.source, prefix) for p in entry.parts)
    out = [_unloadable(entry, session) for entry in session.plan.unloadable if within(entry)]
    out = [d for d in out if d is not None]
    for entry in session.plan.entries:
        if not within(entry) or entry.name not in paddle_state:
            continue
        expected = entry.compute(session.torch_state.read)
        if entry.dtype == "bfloat16":
            expected = dtypes.bf16_to_f32(expected)
        actual = to_numpy(paddle_state[entry.name])
        if actual.shape == expected.shape and np.array_equal(actual, expected):
            continue
        if actual.ndim == 2 and actual.shape[0] == actual.shape[1] and np.array_equal(actual, expected.T):
            out.append(Diagnosis(entry.name, f"paddle weight '{entry.name}' {list(actual.shape)} is square and holds "
                                 f"torch's '{entry.parts[0].source}' untransposed",
                                 "paddle.nn.Linear stores [in, out]: transpose torch's [out, in] weight when converting "
                                 "(convert-weights decides this by module type; check the mapping's transpose rules)", kind="transpose"))
        elif actual.shape != expected.shape:
            out.append(Diagnosis(entry.name, f"paddle weight '{entry.name}' has shape {list(actual.shape)}, the mapping "
                                 f"gives {list(expected.shape)}", "reconvert the weights for this model", kind="weight shape"))
        else:
            diff = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max())
            kind = "weight" if entry.name in parameters else "buffer"
            out.append(Diagnosis(entry.name, f"paddle {kind} '{entry.name}' differs from torch's "
                                 f"{_differing_source(entry, actual, session.torch_state.read)} under the "
                                 f"mapping (max abs {diff:.3g})",
                                 "load the converted weights again, and check that nothing changes them after loading", kind=kind))
    return out


def _unloadable(entry, session) -> Diagnosis | None:
    """A buffer the rules map torch's tensor onto but the paddle model never loads (not persistable),
    where it holds other values than torch's."""
    from ..inmemory import unloadable_difference
    said = unloadable_difference(entry, session.paddle_model, session.torch_state.read)
    if said.startswith("equal"):
        return None
    return Diagnosis(entry.name, f"paddle buffer '{entry.name}' is not persistable, so the converted weights never "
                     f"reach it: it {said}",
                     f"register '{entry.name}' with register_buffer(..., persistable=True) in the paddle model (or "
                     "set it from the converted weights after loading)", kind="unloadable buffer")


SHOWN_WEIGHTS = 5  # loaded weights named one by one in the diagnosis; the report's table holds them all


def check_loaded_weights(check) -> list[Diagnosis]:
    """With mapping 'loaded': each loaded paddle weight that is not torch's under the mapping, bit for
    bit, named with its worst element (a WeightCheck's differences; the first few, then a count)."""
    out = []
    hint = ("the paddle model was loaded with other weights than torch's: load a checkpoint converted from this "
            "torch model (convert-weights), or verify without mapping 'loaded' to check the port on torch's weights")
    for d in check.differ[:SHOWN_WEIGHTS]:
        if d.note.startswith("it holds"):
            cause = (f"loaded paddle weight '{d.paddle}' {list(d.shape)} is torch's '{d.torch}' transposed under "
                     f"mapping '{check.mapping}'")
            out.append(Diagnosis(d.paddle, cause, "paddle.nn.Linear stores [in, out]: the checkpoint it was loaded "
                                 "from holds torch's [out, in] weight untransposed; convert it again with convert-weights",
                                 kind="transpose"))
            continue
        cause = (f"loaded paddle weight '{d.paddle}' {list(d.shape)} differs from torch's '{d.torch}' under mapping "
                 f"'{check.mapping}' in {d.differ} of {d.size} element(s); the worst at {list(d.index)}: paddle "
                 f"{d.paddle_value:.9g}, torch {d.torch_value:.9g} (abs {d.max_abs:.3g})")
        out.append(Diagnosis(d.paddle, cause + (f" ({d.note})" if d.note else ""), hint, kind="loaded weight"))
    if len(check.differ) > SHOWN_WEIGHTS:
        more = check.differ[SHOWN_WEIGHTS:]
        out.append(Diagnosis(more[0].paddle, f"{len(more)} more loaded paddle weight(s) differ from torch's "
                             f"({', '.join(d.paddle for d in more[:3])}{', ...' if len(more) > 3 else ''}; all "
                             "in the report's table of loaded weights)", hint, kind="loaded weight"))
    return out


def _differing_source(entry, actual: np.ndarray, read) -> str:
    """The torch tensor a paddle weight is built from, quoted; of a merge, the first part that
    differs, with its elements along the merge axis (a fused q|k|v weight whose v part is wrong)."""
    if entry.merge_axis is None or len(entry.parts) < 2:
        return f"'{entry.parts[0].source}'"
    start = 0
    for part in entry.parts:
        piece = dtypes.cast(part.apply(read(part.source)), entry.source_dtype, entry.dtype)
        if entry.dtype == "bfloat16":
            piece = dtypes.bf16_to_f32(piece)
        stop = start + piece.shape[entry.merge_axis]
        got = np.take(actual, np.arange(start, stop), axis=entry.merge_axis)
        if got.shape != piece.shape or not np.array_equal(got.astype(np.float64), piece.astype(np.float64)):
            return f"'{part.source}' (its elements {start}:{stop} along axis {entry.merge_axis})"
        start = stop
    return f"'{entry.parts[0].source}'"


EPSILON_NAMES = ("eps", "epsilon", "_epsilon", "variance_epsilon", "_eps", "layer_norm_eps", "norm_eps",
                 "rms_norm_eps", "layer_norm_epsilon")  # what classes no family covers call it (custom RMSNorms)


def epsilon_of(layer, family=None) -> tuple[str, float] | None:
    """(attribute, value) of a normalisation's epsilon: the names its family gives first, then
    the names classes without a family use (LayerNorm's eps, paddle's _epsilon, RMSNorm's
    variance_epsilon, ...); None when it has none."""
    for name in (family.epsilon if family is not None else ()) + EPSILON_NAMES:
        value = getattr(layer, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
            return name, float(value)
    return None


def check_norm_eps(ctx) -> list[Diagnosis]:
    out = []
    for where, m, p in _walk_pairs(ctx):
        family = lookup(m)
        t_eps, p_eps = epsilon_of(m, family), epsilon_of(p, family)
        if t_eps is None or p_eps is None or np.isclose(t_eps[1], p_eps[1], rtol=1e-6, atol=0):
            continue
        out.append(Diagnosis(where, f"{type(m).__name__} epsilon differs: torch {t_eps[0]}={t_eps[1]:g}, paddle "
                             f"{p_eps[0].lstrip('_')}={p_eps[1]:g}",
                             f"construct the paddle {type(p).__name__} with {p_eps[0].lstrip('_')}={t_eps[1]:g}", kind="epsilon"))
    return out


def check_family_what_ifs(ctx) -> list[Diagnosis]:
    """Each pair's own family's what-ifs (see families/): BatchNorm's momentum convention and
    batch statistics, GELU's form, AvgPool's padding, interpolation, padding mode, an
    untransposed square Linear weight, ..."""
    out = []
    for where, m, p in _walk_pairs(ctx):
        family = lookup(m, p)
        for what_if in family.what_ifs if family is not None else ():
            out.extend(what_if(ctx, where, m, p))
    return out


def check_recorded_activation(ctx) -> list[Diagnosis]:
    """For a culprit no activation family covers (HF's activation classes, a function wrapped in
    a module): which activation each side computes on its recorded input."""
    from ..families.activation import recorded_variant
    family = lookup(ctx.torch_module)
    return [] if family is not None and family.name == "activation" else recorded_variant(ctx)


def check_training(ctx) -> list[Diagnosis]:
    """A layer in training mode, or randomness between two identical runs (dropout left on)."""
    from ..compare.replay import run_paddle
    out = []
    training = [n for n, l in paddle_side.named_layers(ctx.paddle_layer) if l.training]
    if training:
        out.append(Diagnosis(ctx.name, f"paddle layer(s) in training mode: {', '.join(training[:3]) or '<this layer>'}",
                             "call model.eval() on the paddle model before comparing", kind="training mode"))
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
                                 "or use a paddle.nn.Dropout layer", kind="dropout"))
    return out


# the largest rms difference, relative to the output's rms, that a reduced format's rounding is
# offered for: bf16's 8-bit mantissa gives about 4e-3 per product, a few times that summed; a
# rotary table built from another base differs by the table's own size
ROUNDING_AT_MOST = 0.05


def check_precision(ctx) -> list[Diagnosis]:
    """Over the budget of the recorded formats, but within the budget if one side used a lower precision."""
    ev, t_call = ctx.evidence, ctx.t_call
    if ev is None or ev.y_local is None or ev.budget is None or t_call is None or ctx.result.worst_input:
        return []  # (worst_input: an input its own code computed for a child is over budget, not its output)
    from .analyze import layer_budget
    signed = np.subtract(ev.y_local, ev.y_torch, dtype=np.float64).ravel()
    diff = np.abs(ev.y_local - ev.y_torch)
    if _follows_the_output(signed, ev.y_torch):
        return []  # rounding is noise; a difference that tracks the output is a changed weight or scale
    if np.sqrt(np.mean(np.square(signed))) > ROUNDING_AT_MOST * np.sqrt(np.mean(np.square(ev.y_torch, dtype=np.float64))):
        return []  # a format's rounding moves an output by a few units of its mantissa, not by its own size
    own, _ = layer_budget(ctx.session, ev.pair, t_call, ev.y_torch, ev.y64, ev.pairs, dict(ctx.session.formats)).ratio(diff)
    if own <= 1.0:  # on torch's inputs the layer is within its own budget: the error came in with its inputs
        return []
    for fmt, label in (("tf32", "TF32"), ("fp16", "fp16"), ("bf16", "bf16")):
        for side in ("paddle", "torch"):
            formats = dict(ctx.session.formats)
            if formats[side] == fmt:
                continue
            formats[side] = fmt
            budget = layer_budget(ctx.session, ev.pair, t_call, ev.y_torch, ev.y64, ev.pairs, formats)
            ratio, tol = budget.ratio(diff)
            if ratio <= 1.0 and fmt == "tf32" and not ctx.session.precision[side].can_run_tf32:
                where = ctx.session.precision[side].device
                return [Diagnosis(ctx.name, f"the local error {float(diff.max()):.3g} is over the "
                                  f"{ctx.session.formats[side]} budget ({ctx.result.budget:.3g}) but within that of "
                                  f"inputs rounded to TF32's 10-bit mantissa on the {side} side ({tol:.3g}); TF32 does "
                                  f"not run on this {'CPU' if where == 'cpu' else 'GPU'}, so the {side} layer rounds "
                                  "its inputs itself",
                                  "look in the layer for a cast to a lower precision (astype, to, a bf16/fp16 "
                                  "kernel or autocast) or a hand-written rounding, and remove it", kind="own rounding")]
            if ratio <= 1.0:
                return [Diagnosis(ctx.name, f"consistent with {label} on one side: the local error "
                                  f"{float(diff.max()):.3g} is over the {ctx.session.formats[side]} budget "
                                  f"({ctx.result.budget:.3g}) but within the {label} budget ({tol:.3g}) for the {side} side",
                                  f"if {side} really runs {label}, say so with --emulate {side}={fmt}; to compare exactly, "
                                  f"turn it off ({'FLAGS_cublas_allow_tf32=0, ' if side == 'paddle' else ''}"
                                  "NVIDIA_TF32_OVERRIDE=0 or --precision strict)", kind=fmt)]
    return []


def _follows_the_output(signed: np.ndarray, y: np.ndarray) -> bool:
    """Whether the difference is mostly a multiple of the output itself (|cosine| above 0.5): a
    weight or scale off by a fraction, not the noise a lower precision's rounding makes."""
    y = np.asarray(y, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(signed)) * float(np.linalg.norm(y))
    return norm > 0 and abs(float(np.dot(signed, y))) / norm > 0.5


def check_own_forward(ctx) -> list[Diagnosis]:
    if not ctx.children_within:
        return []
    cause = f"the difference arises in {ctx.name}'s own forward: every paired sublayer inside it is within budget"
    what = "its forward"
    unpaired = _unpaired_with_weights(ctx)
    if unpaired:
        cause += (f"; sublayers with weights and no counterpart on the other side, compared only as part of its "
                  f"output: {', '.join(unpaired)}")
        what = f"{'those sublayers' if len(unpaired) > 1 else 'that sublayer'} and its own forward"
    hint = (f"compare {what} line by line: scales (1/sqrt(d)), softmax axes, residual connections, activations "
            "called as functions, reshapes and transposes, masks")
    return [Diagnosis(ctx.name, cause, hint, kind="own forward")]


def _unpaired_with_weights(ctx) -> list[str]:
    """The outermost sublayers inside the culprit, on either side, that hold weights and that no
    pair covers, each as "side's path (type)": HF 5 holds a block's routed experts as one module
    of stacked weights where PaddleFormers has a layer per expert, and neither is paired."""
    found = []
    sides = (("torch", ctx.result.torch, ctx.torch_module.named_modules(), {p.torch for p in ctx.pairs}),
             ("paddle", ctx.result.paddle, paddle_side.named_layers(ctx.paddle_layer), {p.paddle for p in ctx.pairs}))
    for side, root, named, paired in sides:
        outermost = []
        for rel, layer in named:
            path = join(root, rel)
            if not rel or any(is_under(path, top) for top in outermost) or any(is_under(q, path) for q in paired):
                continue
            if next(iter(layer.parameters()), None) is not None:
                outermost.append(path)
                found.append(f"{side}'s {path} ({type(layer).__name__})")
    return found


CHECKS = (check_norm_eps, check_family_what_ifs, check_recorded_activation, check_training, check_precision)


def diagnose(ctx) -> list[Diagnosis]:
    from .diagnose_model import CHECKS as MODEL_CHECKS
    found = check_weights(ctx)  # under the mapping; the families' what-ifs look at the layers themselves
    said = any(d.kind == "transpose" for d in found)
    for check in CHECKS + MODEL_CHECKS:
        found.extend(d for d in check(ctx) if not (said and d.kind == "transpose"))
    found = _distinct(found)  # a family's what-if and a generic check may agree
    if all(d.kind in SIZE_FITS | READ_FROM_SETTINGS for d in found):  # no cause yet that re-running confirmed
        from .counterfactual import setting_causes
        confirmed = setting_causes(ctx)
        read = [d for d in found if d.kind in READ_FROM_SETTINGS]
        rest = [d for d in found if d.kind not in READ_FROM_SETTINGS]
        found = (_checked(read, confirmed) if confirmed else [_unconfirmed(d) for d in read]) + rest
    if any(d.kind not in SIZE_FITS for d in found):  # a cause that reproduces paddle's output outranks a fit by size
        found = [d for d in found if d.kind not in SIZE_FITS]
    if not found:  # neither a setting nor a call's argument: the form of an input (a mask read otherwise)
        from .counterfactual_inputs import input_form_causes
        found = input_form_causes(ctx)
    if not found:
        found = check_own_forward(ctx)
    if not found:
        found = [Diagnosis(ctx.name, "no known porting pitfall fits this layer",
                           f"compare the forward of torch {type(ctx.torch_module).__name__} and paddle "
                           f"{type(ctx.paddle_layer).__name__} line by line on the recorded inputs", kind="unknown")]
    return found


# check_precision's diagnoses: the difference fits a lower precision's budget by its size alone
SIZE_FITS = frozenset({"tf32", "fp16", "bf16", "own rounding"})
# diagnoses read from the two layers' settings, not from a re-run: each is a cause only where
# re-running the layer with that setting changed reproduces torch's output
READ_FROM_SETTINGS = frozenset({"epsilon", "pool padding", "interpolation", "padding mode", "momentum"})


def _named(d: Diagnosis) -> set[str]:
    return set(re.findall(r"(\w+)=", d.hint))


def _checked(read: list[Diagnosis], confirmed: list[Diagnosis]) -> list[Diagnosis]:
    """The settings' diagnoses that a confirmed change bears out (in their own words, said to be
    confirmed), then the confirmed changes they do not word, then the others, said to be unconfirmed."""
    borne, unborne, worded = [], [], set()
    for d in read:  # a layer's setting is borne out by a changed setting, not by a changed call's argument
        same = [c for c in confirmed if c.kind == "setting" and _named(c) & _named(d)]
        worded.update(id(c) for c in same)
        if same:
            borne.append(replace(d, cause=f"{d.cause}: {CONFIRMED}"))
        else:
            unborne.append(_unconfirmed(d))
    return borne + [c for c in confirmed if id(c) not in worded] + unborne


def _unconfirmed(d: Diagnosis) -> Diagnosis:
    return replace(d, cause=f"{d.cause} (read from the settings, not confirmed: re-running the layer with it "
                   "changed alone does not reproduce torch's output)", hint=f"check before changing it: {d.hint}")


def _distinct(found: list[Diagnosis]) -> list[Diagnosis]:
    """The first diagnosis of each kind at each layer."""
    seen, out = set(), []
    for d in found:
        if (d.kind, d.layer) not in seen:
            seen.add((d.kind, d.layer))
            out.append(d)
    return out
