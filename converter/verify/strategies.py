"""The binary strategy, for models whose activations do not fit, and the full strategy in chunks.

* BinarySearch: an outline pass finds the top-level units (units.py); each probe tests one unit's
  boundary against the end-to-end budget (endtoend.py), from boundaries recorded at once where
  they fit in the capture limit, else a pass recording that unit alone; errors persist from unit
  to unit, so the first bad unit is found by bisection (search.py), and a full capture of it alone
  names the smallest module over budget inside it: at most ceil(log2 L) + 3 paired passes. Where
  no unit's boundary is over budget, every layer is judged against its own budget a few units at
  a time (sweep.py). What the search knows as it runs is a SearchState, replaced as it learns.
* ChunkedCapture: the full strategy where every layer's activations do not fit at once: the sweep
  alone, and the final outputs end to end.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ..compare.align import align
from ..compare.fused import sliced
from ..compare.known import float64_returned
from ..compare.overlap import TorchWorker
from ..frameworks import paddle_side, torch_side
from ..compare.capture import (Allowance, CaptureTooLarge, PassComplete, call_counts, capture_paddle, capture_torch,
                               module_path)
from ..compare.memory import readable_size
from ..compare.spill import Spill
from ..compare.stream import _paddle_blocks
from ..compare.widen import _blocks as _torch_blocks
from ..compare.precision import ROUNDING_DRAWS
from ..paths import common_parent, is_under, parent
from ..results import Verdict
from .dataflow import trace
from .endtoend import free_references, judge_end_to_end, same_outputs
from .full import FullCapture, StrategyResult, _capture, first_bad, let_go
from .report import LayerResult
from .one_pair import calls_said, joined
from .search import first_bad_in_order, first_bad_unit, look_back
from .sweep import SearchState, captured, sweep
from .units import outline_only, top_level_units, unit_candidates

from ..compare.port import Session


class BinarySearch:
    name = "binary"

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes  # what one sweep's captures may hold (see sweep.py)
        self.state: SearchState | None = None  # what the search knows, from run()

    def run(self, session: Session) -> StrategyResult:
        self.state = SearchState(self.limit_bytes)
        try:
            return self._run(session)
        finally:
            for spill in self.state.spills or ():
                spill.close()
            self._update(spills=None)

    def _update(self, **changes) -> None:
        self.state = dataclasses.replace(self.state, **changes)

    def _run(self, session: Session) -> StrategyResult:
        t_calls, p_calls, kept = self._outline(session)
        # the calls of a whole forward: later passes that record some modules end once theirs have completed
        self._update(outline=(t_calls, p_calls), counts=(call_counts(t_calls), call_counts(p_calls)))
        same_outputs(session, t_calls[""], p_calls[""])
        pairs = align(t_calls, p_calls, session.plan)
        # a unit with no floating outputs (ids, buckets) has nothing a probe could judge: its error
        # shows in the units that read it
        self._update(units=tuple(u for u in top_level_units(pairs, t_calls) if u.torch == "" or t_calls[u.torch].shapes))
        self._update(boundaries=self._boundaries(session, t_calls, kept))
        kept = None  # what the outline kept beyond the units' boundaries goes
        results, bad = self._search(session, pairs)
        self._update(paddle64=())  # what the probes read is no longer needed; the boundaries spare the sweep work
        outputs = self.state.outputs
        if bad is None:
            # no unit's boundary is over the end-to-end budget, yet a difference whose effect stays
            # within it (a LayerNorm epsilon of 1e-7 against 1e-5, a bug below bf16 noise) is over its
            # own layer's budget: every layer is judged against its own, a few units at a time
            results, bad, self.state = sweep(session, self.state, pairs, t_calls, p_calls, self.swept)
        self._update(boundaries=None)
        state, notes = self.state, list(self.state.notes)
        if state.spill_reads:
            held = readable_size(sum(spill.nbytes for spill in state.spills))
            notes.append(f"the outline pass's activations ({held}) were kept on disk in "
                         f"{state.spills[0].folder} and read back {state.spill_reads} time(s) instead of capture "
                         "passes")
        inside = state.inside
        return StrategyResult(results, bad, outputs, state.passes, notes,
                              None if inside is None else inside.calls, None if inside is None else inside.pairs)

    swept = ("binary search: no unit's boundary is over the end-to-end budget; every layer was then judged "
             "against its own budget, {units} units in {captures} capture(s)")  # the sweep's note

    def _outline(self, session: Session) -> tuple[dict, dict, tuple | None]:
        """The outline pass: every module's order, type and output shapes, both sides at once
        (torch's calls, paddle's); where the model has blocks, what it kept (torch's and paddle's
        calls with their tensors, the free-running float64 model's outputs from a pass beside it)
        at the modules that may be its units (unit_candidates), within `limit_bytes`, so that the
        units' boundaries need no pass of their own (_boundaries); None where not kept."""
        t_keep = unit_candidates(torch_side, session.torch_model, _torch_blocks(session.torch_model))
        p_keep = unit_candidates(paddle_side, session.paddle_model, _paddle_blocks(session.paddle_model))
        if t_keep and p_keep:
            allowance = Allowance(self.limit_bytes)  # torch's and paddle's kept tensors
            let_go(session)
            try:
                with self._spilling() as spills, TorchWorker(session) as side:
                    rt = side.submit(capture_torch, session, None, t_keep, allowance, None, spills[0])
                    free = side.submit(free_references, session, sorted(t_keep), None, Allowance(self.limit_bytes))
                    rp = capture_paddle(session, None, p_keep, allowance, None, spills[1])
                    t_calls, p_calls = rt.result().calls, rp.calls
                    outline = outline_only(t_calls), outline_only(p_calls)
                    try:
                        return (*outline, (t_calls, p_calls, free.result()))
                    except CaptureTooLarge:  # the float64 outputs do not fit: the boundaries take a pass
                        return (*outline, None)
            except CaptureTooLarge as exc:
                if isinstance(exc, PassComplete):
                    raise
        with self._spilling() as spills:
            return (*_capture(session, keep=False, spills=spills), None)  # an outline alone

    @contextlib.contextmanager
    def _spilling(self):
        """Spills for an outline pass (torch's, paddle's; spill.py): kept for the captures after it
        (the state's spills) where the block ends with both complete, closed otherwise."""
        spills = Spill(torch_side), Spill(paddle_side)
        try:
            yield spills
            if all(spill.complete for spill in spills):
                self._update(spills=spills)
                spills = ()
        finally:
            for spill in spills:
                spill.close()

    def _boundaries(self, session: Session, t_calls, kept) -> tuple[dict, dict, dict] | None:
        """Every unit's outputs, torch's, paddle's and the free-running float64 model's, where they
        fit in `limit_bytes` (estimated from the outline pass's shapes, `t_calls`): the probes read
        them instead of running passes of their own. Taken from what the outline pass `kept` where
        it kept them at every unit; else from one paired pass and one float64 pass. None where they
        do not fit: each probe then records its unit alone."""
        draws = len(set(session.formats.values()) - {"fp32"}) * ROUNDING_DRAWS
        per_element = 4 + 4 + 8 * (1 + draws)  # torch's and paddle's float32, the float64 references
        units = self.state.units
        elements = sum(int(np.prod(s)) for u in units for s in t_calls[u.torch].shapes)
        # the float64 paddle copy's outputs at every unit, where a probe needs them, fit beside them
        self._update(own64_fits=self.limit_bytes is None or (per_element + 8) * elements <= self.limit_bytes)
        if self.limit_bytes is not None and per_element * elements > self.limit_bytes:
            return None
        # and, for the sweep's last chunk, the units' outputs in their chunks' forced passes (known.py)
        self._update(boundary_bytes=(per_element + (4 + 8) * float64_returned(session)) * elements)
        if kept is not None:
            t_kept, p_kept, free = kept
            if all(u.torch in free and u.torch in t_kept and t_kept[u.torch].outputs and u.paddle in p_kept
                   and p_kept[u.paddle].outputs for u in units):
                return ({u.torch: t_kept[u.torch] for u in units},
                        {u.paddle: p_kept[u.paddle] for u in units}, {u.torch: free[u.torch] for u in units})
        self._update(passes=self.state.passes + 1)
        let_go(session)
        with TorchWorker(session) as side:  # the float64 pass beside both captures, which run in turn
            free = side.submit(free_references, session, [u.torch for u in units])
            p_found = capture_paddle(session, {u.paddle for u in units}).calls
            with side.on_cores_left():
                t_found = capture_torch(session, {u.torch for u in units}).calls
            return t_found, p_found, free.result()

    def _probe(self, session: Session, unit) -> LayerResult:
        """`unit`'s output against the end-to-end budget: from the boundaries recorded at once, or
        one paired pass recording only it."""
        state, paddle64 = self.state, None
        if state.boundaries is None:
            t_calls, p_calls = self._captured({unit.torch}, {unit.paddle}) or \
                _capture(session, {unit.torch}, {unit.paddle}, counts=state.counts)
            self._update(passes=self.state.passes + (state.spills is None))
            free = free_references(session, [unit.torch], state.counts[0])
        else:
            t_calls, p_calls, free = state.boundaries
            if state.own64_fits:
                paddle64 = lambda paths: self._paddle64_boundaries(session)
        t_call, p_call = t_calls[unit.torch], p_calls[unit.paddle]
        return judge_end_to_end(session, unit, t_call.outputs, sliced(unit, p_call.outputs), free[unit.torch],
                                joined("end to end at this unit's output (a binary-search probe)",
                                       calls_said(t_call, p_call)), paddle64=paddle64)

    def _paddle64_boundaries(self, session: Session) -> dict | None:
        """The float64 paddle copy's outputs at every unit, from one pass of it, made when a probe
        first needs paddle's own drift and kept with the boundaries where they fit beside them in
        the capture limit: one pass of the copy for every probe, not one each."""
        if not self.state.paddle64:
            self._update(paddle64=(session.paddle64_outputs([u.paddle for u in self.state.units]),))
        return self.state.paddle64[0]

    def _search(self, session: Session, pairs):
        """The binary search over the units (search.py): (the found unit's results, the first bad
        layer), or (the probes, None) when no unit's boundary is over budget. Sets the state's
        outputs, the model's own probe (the last unit) where it was probed."""
        units = self.state.units
        probes: dict[int, LayerResult] = {}
        bad_at: dict[int, bool] = {}  # index -> its probe over budget, for every unit probed

        def probe(index: int) -> bool:
            probes[index] = self._probe(session, units[index])
            bad_at[index] = probes[index].verdict is Verdict.FAIL
            return bad_at[index]
        found = first_bad_unit(len(units), probe)
        self._update(outputs=probes.get(len(units) - 1))  # the model itself: the last unit
        if found is None:
            return [probes[i] for i in sorted(probes)], None
        found = self._earliest(session, found, bad_at, probe)
        results, bad = self._inside(session, units[found])
        while bad is None:
            # nothing inside the unit is over budget, nor its own code: the error came in with its
            # inputs, from an earlier unit that the units between do not read (T5's decoder starts
            # on its own embedding and reads the encoder only in its cross-attention). Badness
            # does not persist there, so the earlier units not yet probed are probed in order.
            earlier = first_bad_in_order((i for i in range(found) if i not in probes), probe)
            if earlier is None:
                own = next((r for r in results if r.torch == units[found].torch), None)
                if own is not None and own.verdict is Verdict.PASS:  # judged on torch's inputs, and within budget
                    bad = self._between(pairs, found, probes[found])
                else:  # the unit's own output could not be judged inside it (a fused layer, a NaN): its boundary
                    bad = dataclasses.replace(probes[found], note=joined(
                        "over budget at this unit's boundary, with no layer inside it over budget", probes[found].note))
                results = results + [bad]
                break
            found = earlier
            results, bad = self._inside(session, units[found])
        return results, bad

    def _earliest(self, session: Session, found: int, bad_at: dict, probe) -> int:
        """The first unit over budget once clean probes clear only the units they read (search.look_back):
        a unit that starts over from the model's inputs (T5's decoder, on its own embedding) is clean
        whatever came before it, so the earlier units it does not read are probed, in order."""
        if found == 0:
            return found
        try:  # torch alone, no activations kept: not counted with the paired passes
            flow = trace(session, [u.torch for u in self.state.units])
        except Exception as exc:  # noqa: BLE001 - a model that fails here failed in no paired pass: the search
            session.skip("the dataflow trace that checks the earlier units the culprit reads (the search's answer "
                         "stands unchecked)", exc)  # keeps its own supposition rather than lose its answer
            return found
        return look_back(found, bad_at, flow.cleared_by, probe)

    def _between(self, pairs, found: int, probe: LayerResult) -> LayerResult:
        """The answer when unit `found` is over budget at its boundary, nothing inside it is, and
        every earlier unit it may read is within budget: its inputs came from code between the
        units, the own code of the nearest paired module holding it and the unit before it (a
        scale applied between two layers of a model's forward), which full capture names too."""
        paired = {p.torch: p for p in pairs}
        here = self.state.units[found].torch
        holder = parent(here) if found == 0 else common_parent([self.state.units[found - 1].torch, here])
        while holder not in paired and holder:
            holder = parent(holder)
        pair = paired.get(holder)
        if pair is None:  # no paired module holds it: the unit's own boundary is the answer
            return dataclasses.replace(probe, note=joined(f"over budget at this unit's boundary (ratio {probe.ratio:.3g}), "
                                                          "with no layer inside it over budget", probe.note))
        return dataclasses.replace(
            probe, torch=pair.torch, paddle=pair.paddle, type=pair.torch_type, paddle_type=pair.paddle_type,
            note=f"{here or '<model>'} is over budget at its boundary (ratio {probe.ratio:.3g}) with nothing inside it "
                 "over budget, and every earlier unit it reads is within budget: what it receives comes from "
                 f"{holder or '<model>'}'s own code between the units")

    def _inside(self, session: Session, unit):
        """Full capture of one unit: (its results, the first over budget or None)."""
        paths = ({p for p, _ in torch_side.named_layers(session.torch_model) if is_under(p, module_path(unit.torch))},
                 {p for p, _ in paddle_side.named_layers(session.paddle_model) if is_under(p, module_path(unit.paddle))})
        inside = FullCapture().capture(session, paths, self.state.counts, self._captured(*paths))
        self._update(inside=inside, passes=self.state.passes + inside.passes)
        return inside.results, first_bad(inside.results)

    def _captured(self, t_paths, p_paths) -> tuple[dict, dict] | None:
        """The calls at `t_paths` and `p_paths` as the outline pass recorded them (sweep.captured)."""
        calls, self.state = captured(self.state, t_paths, p_paths)
        return calls


class ChunkedCapture(BinarySearch):
    """The full strategy where every layer's activations do not fit at once: every layer judged
    against its own budget a few units at a time (the sweep, without the search), and the final
    outputs end to end; it stops at the first chunk with a layer over budget."""

    name = "full"

    def _search(self, session: Session, pairs):
        self._update(outputs=self._probe(session, self.state.units[-1]))  # the model itself: the last unit
        return [], None

    swept = ("full capture in chunks: every layer judged against its own budget, {units} units in {captures} "
             "capture(s), as their activations at once do not fit in the memory available")
