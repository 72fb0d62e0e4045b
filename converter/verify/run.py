"""verify-port end to end: session, strategy, first bad layer, diagnosis, Report."""

from __future__ import annotations

from .one_pair import culprit_evidence
from .finite import check_finite
from dataclasses import dataclass

from .full import FullCapture, Strategy, StrategyResult, first_bad
from .strategies import BinarySearch, ChunkedCapture
from ..compare import memory
from ..compare.capture import CaptureTooLarge, PassComplete
from .diagnose import Context, check_loaded_weights, diagnose
from ..paths import is_inside, is_under
from .report import Diagnosis, Report
from ..results import Verdict, skipped_notes
from ..compare.session import Options, PortSession


def verify(spec, options: Options, weights=None, converted=None, mapping=None, bisect=False,
           capture_limit: int | None = None) -> Report:
    """The Report of one run; framework flags, hooks, modes, devices and in-place weight changes are
    put back when it ends, also on error (see PortSession)."""
    with PortSession(spec, options, weights=weights, converted=converted, mapping=mapping) as session:
        return run_on(session, options, bisect, capture_limit)


def run_on(session: PortSession, options: Options, bisect: bool = False, capture_limit: int | None = None) -> Report:
    """The Report of the forward check on a set-up session (whose restore is the caller's)."""
    plan = planned(session, options.strategy, capture_limit)  # a run that cannot fit stops here
    strategy, notes = plan.strategy, list(plan.notes)
    try:
        found = strategy.run(session)
    except CaptureTooLarge as exc:
        if isinstance(exc, PassComplete) or plan.switch is None:  # PassComplete ends one pass, caught by the
            raise  # pass that armed it: never here
        notes.append(f"activations exceed {plan.limit / 2**30:.1f} GiB: switched to the low-memory binary search")
        strategy = plan.switch
        found = strategy.run(session)
    notes.extend(found.notes)
    results, bad, outputs = found.results, found.first_bad, found.outputs
    checked = check_finite(found, results)  # no PASS on a NaN or an infinity (finite.py)
    if any(a is not b for a, b in zip(checked, results)):
        results, bad = checked, first_bad(checked)
    diagnosis = []
    if bad is None and outputs is not None and outputs.verdict is Verdict.FAIL:
        bad = outputs  # no single layer isolated: the verdict still follows the final outputs
        diagnosis.append(_not_isolated(results, outputs))
    elif bad is not None and bisect and found.calls is not None:
        diagnosis = diagnose(_context(session, found, bad))
    notes += [f"{r.torch or '<model>'}: {r.note}" for r in results if r.note and r.ratio is None]
    weights = session.weight_check
    if weights is not None and weights.differ:  # mapping 'loaded': a loaded weight that is not torch's fails the run
        named = {d.paddle for d in weights.differ}
        diagnosis = check_loaded_weights(weights) + [d for d in diagnosis if d.layer not in named]
    precision = {side: p.to_json() for side, p in session.precision.items()}
    return Report(results, bad, precision, diagnosis, strategy.name, found.passes,
                  session.plan.notes + notes + skipped_notes(session.skipped), outputs, weights)


@dataclass(frozen=True)
class Plan:
    """The strategy a run takes, its capture limit, the memory's notes, and the strategy it switches
    to where its captures pass that limit (None: it does not switch)."""

    strategy: Strategy
    limit: int
    notes: tuple[str, ...]
    switch: Strategy | None = None


def planned(session: PortSession, name: str, capture_limit: int | None = None) -> Plan:
    """The one place a run's strategy is chosen, from its name (auto, full or binary) and the memory
    available. The capture limit is a share of the memory available (a few blocks' activations where
    the weights are streamed: the forced passes hold about as much again as the capture), or
    `capture_limit` where given. `binary`: BinarySearch under the limit. `auto`: FullCapture under
    it, switching to BinarySearch where its captures pass it. `full`: FullCapture without a limit
    where every layer's activations at once fit, else a few units at a time (ChunkedCapture, under
    the limit: see memory.whole_capture). A run that does not fit raises UserError here."""
    limit_of = lambda: capture_limit if capture_limit is not None else memory.capture_limit(session)
    if name == "full":
        est, chunked = memory.whole_capture(session)
        if chunked is None:
            return Plan(FullCapture(None), 0, tuple(memory.check(session, None, est)))
        limit = limit_of()
        return Plan(ChunkedCapture(limit), limit, (f"{chunked}: the full strategy captures a few units at a time",
                                                   *memory.check(session, limit)))
    limit = limit_of()
    notes = tuple(memory.check(session, limit))
    if name == "binary":
        return Plan(BinarySearch(limit), limit, notes)
    return Plan(FullCapture(limit), limit, notes, BinarySearch(limit))


def _context(session: PortSession, found: StrategyResult, bad) -> Context:
    """What the diagnosis of the first layer over budget looks at, from the strategy's last full capture."""
    t_calls, p_calls = found.calls
    pair = next((p for p in found.pairs if p.torch == bad.torch), None)
    evidence = None if pair is None else culprit_evidence(session, pair, t_calls[pair.torch], p_calls[pair.paddle])
    inside = [r for r in found.results if r is not bad and r.ratio is not None and is_inside(r.torch, bad.torch)]
    return Context(session, bad, session.torch_module(bad.torch), session.paddle_layer(bad.paddle), evidence,
                   bool(inside) and all(r.within_budget for r in inside), t_calls.get(bad.torch),
                   p_calls.get(bad.paddle), [p for p in found.pairs if is_under(p.torch, bad.torch)])


def _not_isolated(results, outputs) -> Diagnosis:
    """Why a run whose final outputs are over budget names no layer: the deepest pairs that could
    not be judged, or else the code no pair covers."""
    unjudged = [r.torch for r in results if r.ratio is None]
    deepest = [p for p in unjudged if not any(q != p and is_under(q, p) for q in unjudged)]
    where = (f"in or under {', '.join(p or '<model>' for p in deepest[:5])} (not judged: "
             f"{'; '.join(r.note for r in results if r.torch in deepest[:5] and r.note)[:300]})" if deepest
             else "in code that no paired layer covers (functions called between layers, or layers on one side only)")
    return Diagnosis("<model>", f"the final outputs differ beyond the end-to-end budget (ratio {outputs.ratio:.3g}, "
                     f"max abs {outputs.max_abs:.3g}) though every judged layer is within its own: the difference "
                     f"arises {where}",
                     "compare those parts of the two forwards line by line, or pair their layers with --mapping", kind="not isolated")
