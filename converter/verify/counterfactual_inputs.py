"""Causes in the form of a layer's inputs, found by re-running: the culprit paddle layer re-run on
torch's recorded inputs with one input in another form its values admit, where neither its
settings nor its calls' arguments reproduce torch (counterfactual.py).

The forms come from the values alone, never from names:
* a mask of booleans: its negation (True where it was False: "keep" read as "masked");
* a mask of 0 and 1 (1 = attend; floating, or integers as HF's int64 masks): its additive form,
  0 where 1 and a large negative where 0 (floating), and its complement (1 = masked);
* an additive mask (0, and large negatives): the 0 and 1 form it stands for, that form's
  complement, and the additive mask of the positions it keeps (a boolean mask read the other way
  round before it was made additive);
* a tensor whose last two axes are as long: those axes swapped (a square attention mask or
  score matrix read transposed).
A form is a cause only where the re-run lands within the layer's own budget."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..diagnosis import GIVES_OUTPUT, Diagnosis, confirmed_cause, went

KIND = "input form"
LARGE_NEGATIVE = -1e4  # an additive mask's value where it masks: exp() of it is 0 in float32 and bf16
MASKED_BELOW = -1e3  # an additive mask's masked positions are at most this


@dataclass(frozen=True)
class Form:
    """One input (`where`: its position among the layer's arguments, or its keyword) in another form."""

    where: int | str
    what: str  # the form, in words
    hint: str  # what the paddle layer's caller (or its code) does to give it that form
    value: np.ndarray


def forms(value: np.ndarray, where: int | str) -> list[Form]:
    """The other forms `value` (numpy) admits, as the module's docstring lists them."""
    out = []
    if value.dtype == np.bool_:
        out.append(Form(where, "negated (True where it is False)", "negate it (~mask, or paddle.logical_not)",
                        ~value))
    elif (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)) and value.size:
        seen = np.unique(value)
        floating = np.issubdtype(value.dtype, np.floating)
        if len(seen) <= 2 and set(seen.tolist()) <= {0.0, 1.0}:  # HF's masks are int64 0/1
            additive = np.where(value > 0.5, 0.0, LARGE_NEGATIVE).astype(value.dtype if floating else np.float32)
            out += [Form(where, f"in additive form (0 where it is 1, {LARGE_NEGATIVE:g} where it is 0)",
                         f"turn it into an additive mask before adding it to the logits: (1 - mask) * {LARGE_NEGATIVE:g}",
                         additive),
                    Form(where, "complemented (1 where it is 0)", "use 1 - mask", (1.0 - value).astype(value.dtype))]
        elif floating and np.all((value == 0) | (value <= MASKED_BELOW)) and np.any(value <= MASKED_BELOW):
            keep = (value == 0).astype(value.dtype)
            out += [Form(where, "as the 0 and 1 mask it stands for (1 where it is 0)",
                         "pass the mask as 1 = attend, 0 = masked, or add it to the logits as it is", keep),
                    Form(where, "as a 0 and 1 mask with 1 where it masks", "pass the mask as 1 = masked", 1.0 - keep),
                    Form(where, "with its masked and kept positions swapped",
                         "build the mask the other way round (a boolean mask's True means the opposite on the two "
                         "sides: negate it before it is made additive)",
                         np.where(value == 0, value.min(), 0.0).astype(value.dtype))]
    if value.ndim >= 2 and value.shape[-1] == value.shape[-2] and value.shape[-1] > 1:
        out.append(Form(where, "with its last two axes swapped", "swap its last two axes (transpose(-1, -2))",
                        np.ascontiguousarray(np.swapaxes(value, -1, -2))))
    return out


def _inputs(args: tuple, kwargs: dict):
    """(position or keyword, numpy value) of each tensor argument of a paddle call."""
    from ..frameworks import paddle_side
    for where, value in list(enumerate(args)) + list(kwargs.items()):
        if paddle_side.is_tensor(value):
            yield where, paddle_side.to_numpy(value)


def _name(layer, position: int | str) -> str | int:
    """The forward's parameter at `position` (a keyword is its own name); the position where its
    signature does not say."""
    import inspect
    if isinstance(position, str):
        return position
    try:
        names = [n for n, p in inspect.signature(layer.forward).parameters.items()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return position
    return names[position] if position < len(names) else position


def _with(args: tuple, kwargs: dict, form: Form):
    import paddle
    value = paddle.to_tensor(form.value)
    if isinstance(form.where, int):
        return args[:form.where] + (value,) + args[form.where + 1:], kwargs
    return args, {**kwargs, form.where: value}


def input_form_causes(ctx) -> list[Diagnosis]:
    """Confirmed causes among the forms of the culprit paddle layer's inputs (verify/diagnose.py):
    torch's recorded inputs handed to it, one in another form, judged as the setting search judges
    its re-runs."""
    from ..compare.replay import run_paddle
    from .counterfactual import Culprit
    culprit = Culprit.of(ctx)
    if culprit is None:
        return []
    layer, where = ctx.paddle_layer, ctx.result.paddle
    args, kwargs = culprit.forced
    for position, value in _inputs(args, kwargs):
        for form in forms(value, position):
            try:
                ratio = culprit.target.paddle_ratio(run_paddle(layer, *_with(args, kwargs, form)))
            except (ValueError, TypeError, RuntimeError, IndexError, AssertionError):  # a form the layer refuses
                continue
            if ratio is not None and ratio <= 1.0:
                which = f"input {_name(layer, position)!r}"
                cause = confirmed_cause(f"paddle's {where or '<model>'} ({type(layer).__name__}) reads its {which} "
                                        "otherwise than torch's", "re-run on torch's recorded inputs", f"that input "
                                        f"{form.what}", GIVES_OUTPUT, went(culprit.before, ratio))
                return [Diagnosis(ctx.name, cause, f"give paddle's {where or 'model'} its {which} as torch's module "
                                  f"reads it: {form.hint}", kind=KIND)]
    return []
