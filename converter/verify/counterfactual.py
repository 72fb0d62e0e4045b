"""Causes found by re-running: the first layer over budget re-run with one of its settings changed.

Every plain setting a layer keeps (a flag, a number, a word, a tuple of numbers: what its
constructor stored and its forward reads) is a candidate cause. For the paddle layer and each
layer inside it, each setting is changed in turn to a value the other side suggests (the values
torch's module keeps, the opposite flag, the complement `1 - x` of a fraction) and the layer
re-run on torch's recorded inputs (the whole numbers of a layer that holds weights only where
building the layer afresh measures them as no part of its structure: counterfactual_rebuild.py);
a change under which paddle's output lands within the layer's budget of torch's is a cause,
confirmed by re-running. The same search on torch's float64 module against paddle's output says
what paddle computes where no paddle setting does. Nothing here knows a layer family: the settings
are read from the two layers, and a layer type no family covers gets a cause the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..diagnosis import CONFIRMED, GIVES_OUTPUT, Diagnosis, confirmed_cause, gives_input_of, went
from .counterfactual_settings import constructor_parameter, same as _same, settings
from .counterfactual_wrapping import framework_of, named_layers

MAX_RUNS = 160  # re-runs per side: the search is for one layer, and a block holds a few hundred settings
MAX_SECONDS = 30.0
SMALL_INT = 16  # ints beyond this are sizes (features, channels), which no re-run can change alone
KIND = "setting"


@dataclass(frozen=True)
class Setting:
    """One setting of a layer, changed: the attribute its forward reads, and the constructor's
    parameter that sets it where one does."""

    name: str
    was: object
    to: object
    parameter: str | None
    assigned: tuple = ()  # ((attribute, its value, the value set), ...) where one change sets several

    def set_to(self) -> tuple:
        """(attribute, its value, the value set) for each attribute the change sets."""
        return self.assigned or ((self.name, self.was, self.to),)

    def said(self, value) -> str:
        return f"{self.parameter or self.name}={value!r}"


@dataclass(frozen=True)
class Change:
    side: str  # whose layer was changed: "paddle" or "torch"
    where: str  # the layer's path in its model
    layer_type: str
    settings: tuple[Setting, ...]
    ratio: float  # the layer's error against the other side, re-run with the change

    def diagnosis(self, culprit: str, before: float, other_type: str = "", gives: str = GIVES_OUTPUT) -> Diagnosis:
        """`other_type`: where the change is torch's, the type of the paddle layer that computes otherwise."""
        moved = went(before, self.ratio)
        was = ", ".join(f"{s.name}={s.was!r}" for s in self.settings)
        to = ", ".join(f"{s.name}={s.to!r}" for s in self.settings)
        where = self.where or "<model>"
        if self.side == "paddle":
            cause = confirmed_cause(f"paddle's {where} ({self.layer_type}) has {was}", "re-run on torch's recorded "
                                    "inputs", to, gives, moved)
            if all(s.parameter for s in self.settings):
                hint = f"construct paddle's {self.layer_type} with {', '.join(s.said(s.to) for s in self.settings)}"
            else:
                hint = f"make paddle's {where} compute with {to}"
        else:
            cause = (f"paddle's {other_type} computes what torch's {where} ({self.layer_type}) computes with {to} "
                     f"(torch's has {was}): torch's module re-run with it gives paddle's output within the budget "
                     f"({moved}): {CONFIRMED}")
            which = "settings that match" if len(self.settings) > 1 else "setting that matches"
            hint = (f"give paddle's {other_type} the {which} torch's "
                    f"{', '.join(s.said(s.was) for s in self.settings)}")
        return Diagnosis(culprit, cause, hint, kind=KIND)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def candidates(value, suggested: list, sizes: bool = True) -> list:
    """Values to try for a setting that holds `value`: those the layer's counterpart on the other
    side keeps (`suggested`), the opposite of a flag, the complement of a fraction. Whole numbers
    and tuples of them (axes, strides, windows, factors) only where `sizes`: in a layer that holds
    weights they are its structure (counts of layers, heads, features), which no re-run may change
    (native kernels trust them: a changed count can crash the process); such a layer's whole numbers
    that measure as no part of its structure are tried by `_measured`."""
    if isinstance(value, bool):
        return [not value]
    out = []
    if isinstance(value, str):
        out = [s for s in suggested if isinstance(s, str) and s.isidentifier()]
    elif isinstance(value, float):
        out = [float(s) for s in suggested if isinstance(s, float)]
        if 0.0 < value < 1.0:
            out.append(1.0 - value)
    elif isinstance(value, int) and sizes:  # an int default (a factor such as Softplus' beta) takes floats too
        out = [s for s in suggested if isinstance(s, float) or _number(s) and abs(s) <= SMALL_INT]
        out += [s[0] for s in suggested if isinstance(s, (tuple, list)) and len(set(s)) == 1
                and isinstance(s[0], int) and abs(s[0]) <= SMALL_INT]
    elif isinstance(value, (tuple, list)) and sizes:
        n = len(value)
        out = [type(value)(s) for s in suggested if isinstance(s, (tuple, list)) and len(s) == n]
        out += [type(value)([s] * n) for s in suggested if _number(s) and isinstance(s, int) and abs(s) <= SMALL_INT]
    distinct = []
    for c in out:
        if not _same(c, value) and not any(_same(c, d) for d in distinct):
            distinct.append(c)
    return distinct


class _Runs:
    """The re-runs' shared limits: a count and a time per side."""

    def __init__(self):
        self.left = MAX_RUNS
        self.until = time.monotonic() + MAX_SECONDS

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0 and time.monotonic() < self.until


def _search(side: str, root, root_path: str, framework_keys: frozenset, suggested, run, judge) -> list[Change]:
    """Each setting of each layer under `root` changed to each candidate, the root re-run (`run()`
    gives its outputs) and judged (`judge(outputs)` gives the ratio or None), the candidates coming
    from `suggested(path)`: the settings of the layer's counterpart on the other side; the changes whose
    ratio is at most 1, best first. Where no single change is one, two settings of one layer
    changed together (a range's two ends). Every setting is restored, whatever the run does."""
    runs = _Runs()
    try:
        unchanged = judge(run())
    except Exception:  # noqa: BLE001 - a layer that cannot re-run here has no setting to find
        return []
    unchanged = float("inf") if unchanged is None else unchanged  # None: its outputs do not pair with torch's
    if unchanged <= 1.0:  # re-run unchanged it is within its budget: nothing to explain here
        return []
    options = []  # per layer: (path, layer, [each setting changed])
    for path, layer in named_layers(root, root_path):
        weighted = _weighted(layer)
        here = [Setting(name, value, new, constructor_parameter(layer, name))
                for name, value in settings(layer, framework_keys).items()
                for new in candidates(value, suggested(path).values, not weighted)]
        here += _measured(layer, framework_keys, suggested(path)) if weighted else []
        if here:
            options.append((path, layer, here))
    for together in (1, 2):
        hits = []
        for path, layer, here in options:
            for changed in _combinations(here, together):
                if not runs.take():
                    return sorted(hits, key=lambda c: c.ratio)
                ratio = _run_changed(layer, changed, run, judge)
                if ratio is not None and ratio <= 1.0 and ratio < unchanged:
                    hits.append(Change(side, path, type(layer).__name__, changed, ratio))
        if hits:
            return sorted(hits, key=lambda c: c.ratio)
    return []


def _combinations(here: list, together: int):
    from itertools import combinations
    for changed in combinations(here, together):
        if len({s.name for s in changed}) == together:
            yield changed


def _measured(layer, framework_keys: frozenset, counterpart) -> list[Setting]:
    """The whole-number settings of a layer that holds weights, changed to the counterpart's value
    for the same constructor argument, where building the layer with it measures them as no part
    of its structure (see counterfactual_rebuild.py)."""
    if not counterpart.arguments:
        return []
    from .counterfactual_rebuild import Rebuilder
    rebuilder, out = None, []
    for name, value in settings(layer, framework_keys).items():
        parameter = constructor_parameter(layer, name)
        theirs = counterpart.arguments.get(parameter)
        if not _whole(value) or not _whole(theirs) or _same(value, theirs):
            continue
        rebuilder = rebuilder or Rebuilder(layer, framework_keys)
        for to in candidates(value, [theirs]) or [theirs]:
            assigned = rebuilder.measured(name, parameter, to)
            if assigned is not None:
                out.append(Setting(name, value, to, parameter, assigned))
    return out


def _whole(value) -> bool:
    """A whole number, or a sequence of them (a stride, a padding per side)."""
    if isinstance(value, (tuple, list)):
        return 0 < len(value) <= 6 and all(_whole(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _run_changed(layer, changed: tuple, run, judge) -> float | None:
    assigned = [a for s in changed for a in s.set_to()]
    for name, _, to in assigned:
        setattr(layer, name, to)
    try:
        return judge(run())
    except Exception:  # noqa: BLE001 - a setting the layer cannot run with is not the cause
        return None
    finally:
        for name, was, _ in reversed(assigned):
            setattr(layer, name, was)


def _framework_keys(framework: str) -> frozenset:
    if framework == "paddle":
        import paddle
        return frozenset(vars(paddle.nn.Layer()))
    import torch
    return frozenset(vars(torch.nn.Module()))


def _weighted(layer) -> bool:
    """Whether the layer holds parameters of its own."""
    named = layer.named_parameters(include_sublayers=False) if framework_of(layer) == "paddle" \
        else layer.named_parameters(recurse=False)
    return any(True for _ in named)


def _counterparts(ctx, side: str, keys: frozenset):
    """path on `side` -> the settings' values of its paired layer on the other side (the culprit's
    own pair, and the pairs inside it); nothing for a layer with no counterpart."""
    if side == "paddle":
        paired = {ctx.result.paddle: ctx.torch_module}
        paired.update({p.paddle: ctx.session.torch_module(p.torch) for p in ctx.pairs})
    else:
        paired = {ctx.result.torch: ctx.paddle_layer}
        paired.update({p.torch: ctx.session.paddle_layer(p.paddle) for p in ctx.pairs})
    values = {path: Counterpart(layer, keys) for path, layer in paired.items()}
    return lambda path: values.get(path, Counterpart(None, keys))


class Counterpart:
    """The settings of a layer's counterpart on the other side: their values, and by the
    constructor argument that sets them."""

    def __init__(self, layer, keys: frozenset):
        kept = settings(layer, keys) if layer is not None else {}
        self.values = list(kept.values())
        named = ((constructor_parameter(layer, k), v) for k, v in kept.items())
        self.arguments = {p: v for p, v in named if p}


class _Target:
    """Torch's recorded output of the culprit, and how an output list is judged against it."""

    def __init__(self, ctx, pair):
        self.ctx, self.pair = ctx, pair
        self._budgets: dict = {}  # the shapes torch's outputs are laid out in -> their budget

    @cached_property
    def torch_outputs(self) -> list:
        from ..compare.replay import to_numpy_list
        from .analyze import torch_read
        return to_numpy_list(torch_read(self.pair, self.ctx.t_call.outputs), "torch")

    def paddle_ratio(self, outputs: list) -> float | None:
        """Paddle's outputs (numpy, as run_paddle gives them) against torch's, under the budget of
        torch's output laid out as these pair with it."""
        from ..compare.fused import sliced
        from ..compare.matching import pair_outputs
        from .analyze import laid_out
        ev = self.ctx.evidence
        outputs = sliced(self.pair, outputs)
        if ev is not None and ev.pairs is not None and ev.budget is not None and ev.pairs.fits(outputs):
            return _ratio(ev.budget, laid_out(ev.pairs.of_paddle(outputs), ev.pairs.shapes), ev.y_torch)
        t = self.torch_outputs
        pairs = pair_outputs([a.shape for a in t], [a.shape for a in outputs], lambda: t, lambda: outputs)
        if not pairs or not pairs.fits(outputs):
            return None
        y_t = laid_out(pairs.of_torch(t), pairs.shapes)
        return _ratio(self._budget(pairs, y_t), laid_out(pairs.of_paddle(outputs), pairs.shapes), y_t)

    def _budget(self, pairs, y_t: np.ndarray):
        """The budget of torch's output laid out as `pairs` lay it out, made once for those shapes."""
        from ..compare.replay import run_torch64
        from .analyze import laid_out, layer_budget, torch_read
        if pairs.shapes not in self._budgets:
            session, call = self.ctx.session, self.ctx.t_call
            y64 = laid_out(pairs.of_torch(torch_read(self.pair, run_torch64(session.torch64_module(self.pair.torch),
                                                                              call))), pairs.shapes)
            self._budgets[pairs.shapes] = layer_budget(session, self.pair, call, y_t, y64, pairs, session.formats)
        return self._budgets[pairs.shapes]

    def torch_ratio(self, outputs: list) -> float | None:
        """Torch's float64 outputs, changed, against paddle's output on torch's inputs."""
        from .analyze import laid_out, torch_read
        ev = self.ctx.evidence
        if ev is None or ev.y_local is None or ev.pairs is None or ev.budget is None:
            return None
        return _ratio(ev.budget, laid_out(ev.pairs.of_torch(torch_read(self.pair, outputs)), ev.pairs.shapes),
                      ev.y_local)


def _ratio(budget, y: np.ndarray, ref: np.ndarray) -> float | None:
    """`y` against `ref` under `budget` (a NaN over any budget); None where their shapes differ."""
    if y.shape != ref.shape:
        return None
    return budget.ratio(np.abs(np.nan_to_num(y - ref, nan=np.inf)))[0]


def _culprit_pair(ctx):
    ev = ctx.evidence
    if ev is not None and ev.pair is not None:
        return ev.pair
    from ..compare.align import LayerPair
    found = next((p for p in ctx.pairs if p.torch == ctx.result.torch and p.paddle == ctx.result.paddle), None)
    return found or LayerPair(ctx.result.torch, ctx.result.paddle, type(ctx.torch_module).__name__,
                              type(ctx.paddle_layer).__name__)


@dataclass(frozen=True)
class Culprit:
    """What every search re-runs the culprit with: its pair, torch's recorded inputs handed to the
    paddle layer (args, kwargs), how its outputs are judged, and its ratio before any change."""

    pair: object
    forced: tuple
    target: _Target
    before: float

    @classmethod
    def of(cls, ctx) -> Culprit | None:
        """The diagnosis context's culprit; None where it has no recorded call to re-run on."""
        from ..compare.replay import forced_paddle_inputs
        pair = _culprit_pair(ctx)
        if pair is None or ctx.t_call is None or ctx.p_call is None or not ctx.t_call.outputs:
            return None
        ev = ctx.evidence
        try:
            forced = ev.forced if ev is not None and ev.forced is not None else \
                forced_paddle_inputs(ctx.t_call, ctx.p_call)
        except (TypeError, ValueError):  # torch's inputs cannot be handed to the paddle layer: nothing to re-run
            return None
        return cls(pair, forced, _Target(ctx, pair), ctx.result.ratio if ctx.result.ratio is not None else float("inf"))


def setting_causes(ctx) -> list[Diagnosis]:
    """Confirmed causes of the culprit's error among its settings (see the module's docstring): the
    paddle side's changes where any reproduces torch, else the torch side's that reproduce paddle."""
    from ..compare.replay import run_paddle, run_torch64
    culprit = Culprit.of(ctx)
    if culprit is None:
        return []
    pair, forced, target, before, ev = culprit.pair, culprit.forced, culprit.target, culprit.before, ctx.evidence
    torch_keys, paddle_keys = _framework_keys("torch"), _framework_keys("paddle")
    p_layer = ctx.paddle_layer
    run, judge = (lambda: run_paddle(p_layer, *forced)), target.paddle_ratio
    from .counterfactual_child import child_of
    child = child_of(ctx, judge)  # the row is worst at an input the layer's code computed for a child: judged there
    if child is not None:
        run, judge = child.run(run), child.ratio
    from .counterfactual_calls import call_causes
    found = _search("paddle", p_layer, ctx.result.paddle, paddle_keys, _counterparts(ctx, "paddle", torch_keys), run,
                    judge) or call_causes(p_layer, ctx.result.paddle, run, judge, _Runs())
    gives = GIVES_OUTPUT if child is None else gives_input_of(ctx.result.worst_input)
    if found or ev is None or ev.y_local is None:  # torch's side is judged at the layer's output (against paddle's)
        return [c.diagnosis(ctx.name, before, gives=gives) for c in found[:2]]
    module64 = ctx.session.torch64_module(pair.torch)
    run64 = lambda: run_torch64(module64, ctx.t_call)  # noqa: E731 - one re-run, handed to both searches
    hits = _search("torch", module64, ctx.result.torch, torch_keys, _counterparts(ctx, "torch", paddle_keys), run64,
                   target.torch_ratio)
    if hits:
        return [c.diagnosis(ctx.name, before, type(p_layer).__name__) for c in hits[:2]]
    calls = call_causes(module64, ctx.result.torch, run64, target.torch_ratio, _Runs(), side="torch")
    return [c.diagnosis(ctx.name, before, ctx.result.paddle) for c in calls[:2]]
