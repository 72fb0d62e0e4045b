"""Causes found by re-running: the first layer over budget re-run with an argument of one of the
functional calls its forward makes changed.

A port's forward calls `paddle.nn.functional` (and `paddle.fft`) with arguments its author chose:
an activation's variant, an axis, `align_corners`, a reduction; as Tensor methods (`a.softmax(dim=-1)`)
too, and through functions its layers hold (`self.activation`). The culprit is run once on torch's
recorded inputs with those calls wrapped (counterfactual_wrapping.py), which records every call
(which function, from which layer, its k-th by that layer's own code, with which arguments, defaults
included); then each argument of each call is changed to each
value its signature allows (a flag's opposite, another word its annotation lists, another axis of
its input, other axes of it as many as a tuple names) and the layer re-run with that one call
changed. A change under which paddle's output lands within the layer's budget of torch's is a cause,
confirmed by re-running. Where none is, torch's float64 module is searched the same way against
paddle's output: which argument of a `torch.nn.functional` call makes torch compute what paddle
does. The functions are wrapped only while the culprit runs here, and act on this thread's calls
alone. Where no argument of paddle's is a cause, an elementwise function a layer holds is tried with
another in its place (counterfactual_held.py).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from dataclasses import dataclass

from ..diagnosis import CONFIRMED, GIVES_OUTPUT, Diagnosis, confirmed_cause, went
from .counterfactual_wrapping import RecordedCall, _signature, resolved, wrapped

KIND = "call argument"


@dataclass(frozen=True)
class CallChange:
    call: RecordedCall
    parameter: str
    to: object
    ratio: float
    side: str = "paddle"  # whose call was changed
    of: int = 1  # the calls of that function the layer's own code makes in one run

    def diagnosis(self, culprit: str, before: float, other: str = "", gives: str = GIVES_OUTPUT) -> Diagnosis:
        """`other`: where the change is torch's, the paddle layer that computes otherwise."""
        c = self.call
        was = c.arguments[self.parameter]
        nth = f" (its call {c.index + 1} of {self.of} there)" if self.of > 1 else ""
        moved = went(before, self.ratio)
        short = c.function.rsplit('.', 1)[-1]
        if self.side == "paddle":
            through = f" through its attribute {c.held}" if c.held else ""
            where = f"where {c.layer or 'the model'}'s forward calls self.{c.held} ({short})" if c.held else \
                f"to {short} in {c.layer or 'the model'}'s forward"
            where += f", in its call {c.index + 1} of {self.of} there alone" if self.of > 1 else ""
            return Diagnosis(culprit, confirmed_cause(f"paddle's {c.layer or '<model>'} calls {c.function}(..., "
                                                      f"{self.parameter}={was!r}){through}{nth}", "re-run on torch's "
                                                      "recorded inputs", f"{self.parameter}={self.to!r}",
                                                      gives, moved),
                             f"pass {self.parameter}={self.to!r} {where}", kind=KIND)
        return Diagnosis(culprit, f"paddle's {other or '<model>'} computes what torch's {c.layer or '<model>'} computes with "
                         f"{self.parameter}={self.to!r} in its call {c.function}(..., {self.parameter}={was!r}){nth}: "
                         f"torch's module re-run so gives paddle's output within the budget ({moved}): {CONFIRMED}",
                         f"make paddle's {other or 'model'} compute what torch's "
                         f"{short} computes with {self.parameter}={was!r}", kind=KIND)


@functools.cache
def _literals(function: str, parameter: str) -> tuple[str, ...]:
    """The words a parameter's annotation allows: quoted in it, or in a Literal alias it names
    (defined in the function's module, or in paddle._typing)."""
    f = resolved(function)
    annotation = str(_signature(f).parameters[parameter].annotation)
    found = _quoted(annotation)
    sources = [source for source in map(_source, (f.__module__, "paddle._typing", "paddle._typing.layout")) if source]
    for alias in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", annotation):
        for source in sources:
            m = re.search(rf"^\s*{re.escape(alias)}\s*(?::\s*TypeAlias\s*)?=\s*Literal\[(.*?)\]", source, re.M | re.S)
            if m:
                found += _quoted(m.group(1))
    return tuple(dict.fromkeys(found))


def _quoted(text: str) -> list[str]:
    return [a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", text)]


@functools.cache
def _source(module_name: str) -> str:
    """The source of a module imported already, read once; "" where there is none."""
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def candidates(call: RecordedCall, parameter: str) -> list:
    value = call.arguments[parameter]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, str):
        return [w for w in _literals(call.function, parameter) if w != value]
    if isinstance(value, int) and call.ndim and -call.ndim <= value < call.ndim:  # an axis of its input
        axes = range(-call.ndim, 0) if value < 0 else range(call.ndim)  # counted as the call counts them
        return [a for a in axes if a % call.ndim != value % call.ndim]
    if isinstance(value, float) and 0.0 < value < 1.0:
        return [1.0 - value]
    if isinstance(value, (tuple, list)) and call.ndim and _axes(value, call.ndim):  # axes of its input
        from itertools import combinations
        axes = range(-call.ndim, 0) if all(a < 0 for a in value) else range(call.ndim)
        mine = sorted(a % call.ndim for a in value)
        return [type(value)(c) for c in combinations(axes, len(value)) if sorted(a % call.ndim for a in c) != mine]
    return []


def _axes(value, ndim: int) -> bool:
    """Whether a sequence reads as axes of an input of `ndim` axes: distinct, fewer than it has, each
    one of them, counted from one end."""
    return (len(value) < ndim and all(-ndim <= a < ndim for a in value) and len({a % ndim for a in value}) == len(value)
            and (all(a < 0 for a in value) or all(a >= 0 for a in value)))


def call_causes(layer, root_path: str, run, judge, runs, side: str = "paddle") -> list[CallChange]:
    """The functional calls' changes that reproduce the other side (see the module's docstring),
    best first: `run()` runs `layer` (on torch's recorded inputs) and gives its outputs, `judge(outputs)`
    their ratio against the other side's."""
    try:
        with wrapped(layer, root_path) as seen:
            before = judge(run())
    except Exception:  # noqa: BLE001 - a layer that cannot re-run on torch's inputs has no call to find
        return []
    if before is not None and before <= 1.0:  # re-run unchanged it is within its budget: nothing to explain here
        return []
    hits = []
    for call in seen.calls:
        for parameter in call.arguments:
            if parameter == "name" or parameter.startswith("_"):  # a call's name; torch's _stacklevel
                continue
            for new in candidates(call, parameter):
                if not runs.take():
                    return sorted(hits, key=lambda c: c.ratio)
                try:
                    with wrapped(layer, root_path, (call.function, call.layer, call.index, parameter, new)):
                        ratio = judge(run())
                except Exception:  # noqa: BLE001 - an argument the function refuses is not the cause
                    ratio = None
                if ratio is not None and ratio <= 1.0:
                    of = sum(1 for c in seen.calls if c.function == call.function and c.layer == call.layer)
                    hits.append(CallChange(call, parameter, new, ratio, side, of))
    if hits or side != "paddle":
        return sorted(hits, key=lambda c: c.ratio)
    from .counterfactual_held import held_causes
    return held_causes(layer, root_path, seen, run, judge, runs)
