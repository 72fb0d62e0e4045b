"""The sweep: every layer judged against its own budget, a few units at a time, where no unit's
boundary is over the end-to-end budget (the binary strategy) or every layer's activations at once do
not fit (the full strategy in chunks); and the state of a binary search it reads and gives back."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ..compare.capture import module_path
from ..compare.known import Recorded, recording_forced, returning_recorded
from .full import FullCapture, StrategyResult, first_bad
from ..paths import is_under
from .report import LayerResult

from ..compare.port import Session


@dataclasses.dataclass(frozen=True)
class SearchState:
    """What a binary search knows, replaced as it learns more, never changed: its capture limit, the
    outline pass's calls (torch's, paddle's) and the calls of a whole forward per side (`counts`:
    later passes that record some modules end once theirs have completed), the units, their
    boundaries where recorded (torch's, paddle's and the free-running float64 model's outputs) and
    the bytes those hold with what the sweep's last chunk is handed, whether the float64 paddle
    copy's outputs at every unit fit beside them and (`paddle64`) those outputs once made, the
    outline pass's spills (spill.py) and the captures read back from them, the paired passes run,
    the notes, the last full capture (`inside`) and the model's own probe (`outputs`)."""

    limit_bytes: int | None
    outline: tuple[dict, dict] = ({}, {})
    counts: tuple[dict, dict] = ({}, {})
    units: tuple = ()
    boundaries: tuple[dict, dict, dict] | None = None
    boundary_bytes: int = 0
    own64_fits: bool = False
    paddle64: tuple = ()  # (the float64 paddle copy's outputs at every unit,) once made
    spills: tuple | None = None
    spill_reads: int = 0
    passes: int = 1
    notes: tuple[str, ...] = ()
    inside: StrategyResult | None = None
    outputs: LayerResult | None = None


def captured(state: SearchState, t_paths, p_paths) -> tuple[tuple[dict, dict] | None, SearchState]:
    """The calls at `t_paths` and `p_paths` as the outline pass recorded them, read back from its
    spills (None where it kept none: a capture pass records them), and the state that counts it."""
    if state.spills is None:
        return None, state
    (t_spill, p_spill), (t_calls, p_calls) = state.spills, state.outline
    calls = t_spill.revive(t_calls, _calls_at(t_calls, t_paths)), p_spill.revive(p_calls, _calls_at(p_calls, p_paths))
    return calls, dataclasses.replace(state, spill_reads=state.spill_reads + 1)


def _calls_at(calls: dict, paths) -> list[str]:
    """The keys of `calls` that `paths` names, as a capture pass records them: a module's path
    stands for every call of it, a call key for that call (capture.call_key)."""
    paths = set(paths)
    return [key for key in calls if key in paths or module_path(key) in paths]


def sweep(session: Session, state: SearchState, pairs, t_calls, p_calls,
          said: str) -> tuple[list, LayerResult | None, SearchState]:
    """Full captures of the units in execution order, as many at once as the capture limit holds
    (estimated from the outline pass's shapes, less the boundaries held), and of the modules
    holding them (their own code, between the units) with the last, which records every
    earlier unit's own module too (their outputs alone): the code between the units is judged
    on the same calls as one capture of every unit records, whatever the chunks; (every row
    judged, the first over budget, the state after it, with the note `said`, formatted with the
    units and captures). Where the boundaries were recorded, the units before a chunk return their
    recorded outputs in its passes instead of running (known.py); in the last, which forces every
    unit, what they returned in their own chunks' forced passes."""
    units = [u for u in state.units if u.torch != ""]
    holders = [p for p in pairs if p.torch not in {u.torch for u in units}
               and not any(is_under(p.torch, u.torch) for u in units)]
    size = lambda calls, root: sum(4 * 2 * int(np.prod(s)) for c in calls.values()
                                   if is_under(c.path, root) for s in c.shapes)
    limit = None if state.limit_bytes is None else state.limit_bytes - state.boundary_bytes
    chunks, chunk, held = [], [], 0
    for unit in units:
        need = size(t_calls, unit.torch) + size(p_calls, unit.paddle)
        if chunk and limit is not None and held + need > limit:
            chunks.append(chunk)
            chunk, held = [], 0
        chunk, held = chunk + [unit], held + need
    chunks.append(chunk)
    recorded = None if state.boundaries is None else Recorded(*state.boundaries, state.counts)
    results = []
    for i, chunk in enumerate(chunks):
        t_paths = {p for p in t_calls if any(is_under(p, u.torch) for u in chunk)}
        p_paths = {p for p in p_calls if any(is_under(p, u.paddle) for u in chunk)}
        before, last = units[:units.index(chunk[0])] if chunk else [], i == len(chunks) - 1  # no units: []
        if last:
            t_paths |= {h.torch for h in holders} | {u.torch for u in units}
            p_paths |= {h.paddle for h in holders} | {u.paddle for u in units}
        with _returned(session, recorded, before, chunk, last):
            calls, state = captured(state, t_paths, p_paths)
            inside = FullCapture().capture(session, (t_paths, p_paths), state.counts, calls)
        state = dataclasses.replace(state, inside=inside, passes=state.passes + inside.passes)
        judged = {r.torch for r in results}  # an earlier unit, recorded again for the code around it
        found = [r for r in inside.results if r.torch not in judged]
        results += found
        bad = first_bad(found)
        if bad is not None:
            break
    return results, bad, dataclasses.replace(state, notes=state.notes + (said.format(units=len(units), captures=i + 1),))


@contextlib.contextmanager
def _returned(session: Session, recorded: Recorded | None, before, chunk, last: bool):
    """The context of a sweep chunk's capture: the units `before` it return what they returned
    where that was recorded (known.returning_recorded: their boundaries; in the `last` chunk,
    which forces them, their own chunks' forced outputs, which the others keep); every unit runs
    where the boundaries were not recorded (`recorded` None)."""
    if recorded is None:
        yield
        return
    units = [u for u in before if recorded.returnable(u, forced=last)]
    # only a unit each side calls once is ever returned (Recorded.returnable): a call of a module called
    # more than once (a unit at capture.call_key) is not kept
    once = [u for u in chunk if recorded.counts[0].get(u.torch) == 1 and recorded.counts[1].get(u.paddle) == 1]
    with returning_recorded(session, units, recorded, forced=last), \
            (contextlib.nullcontext() if last else recording_forced(session, once, recorded)):
        yield
