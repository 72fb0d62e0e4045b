"""Strategies that find the first layer over budget.

* FullCapture: record every layer on both sides once, then one forced pass per side
  (see forced.py) gives every pair's local error and reference.
* BinarySearch: for models whose activations do not fit. One outline pass finds the
  sequence of top-level units (the repeated blocks and what sits around them); then each
  probe tests one unit's boundary on both sides against the end-to-end budget (fp32 noise
  measured against a float64 run of the torch model). Every unit's boundary is recorded in
  one paired pass and one float64 pass where they fit in the capture limit (else each probe
  records its own). Errors persist from unit to unit, so the first bad unit is found in
  ceil(log2 L) probes; a last full capture of that unit alone (two paired passes) names the
  smallest module over budget inside it. At most ceil(log2 L) + 3 paired passes; the unit
  boundaries and O(1) units' insides held. A pass that records some units alone ends once they
  have run (capture.stop_when_done, counted from the outline pass's calls). Where no unit's
  boundary is over budget, every layer is judged against its own budget a few units at a time
  (the sweep); the units before a chunk return their recorded boundaries there instead of
  running (compare/known.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..compare.align import align, shapes_fit
from .analyze import (Passes, analyze_all, end_to_end_until, laid_out, matmul_stats_all, outputs_of,
                      unmasked)
from ..compare.forced import forced_paddle, paddle_own_errors, torch_references
from ..compare.fused import sliced
from ..compare.known import Recorded, float64_returned, recording_forced, returning_recorded
from ..compare.overlap import TorchWorker
from ..compare.budget import budget_from_error, make_budget
from ..frameworks import paddle_side, torch_side
from ..compare.capture import (Allowance, CaptureTooLarge, PassComplete, call_counts, capture_calls, capture_paddle,
                               capture_torch, wanted_calls)
from ..compare.memory import readable_size
from ..compare.spill import Spill
from ..compare.stream import _paddle_blocks
from ..compare.widen import _blocks as _torch_blocks
from ..compare.matching import masked_alike, masked_by_torch, pair_outputs
from ..compare.metrics import compare, rms, rms_over
from ..compare.precision import ROUNDING_DRAWS
from ..compare.replay import to_numpy_list
from ..errors import UserError
from ..paths import common_parent, is_inside, is_under, parent
from .report import LayerResult
from ..results import Verdict


class Bisector:
    """Finds the first index in [0, n) whose probe is bad, given that badness persists."""

    def __init__(self, n: int):
        self.lo, self.hi = 0, n  # the answer lies in [lo, hi]; hi == n means none is bad
        self.n = n
        self.steps = 0

    def next(self) -> int:
        return (self.lo + self.hi) // 2

    def step(self, bad: bool) -> None:
        mid = self.next()
        self.steps += 1
        if bad:
            self.hi = mid
        else:
            self.lo = mid + 1

    def stop(self) -> bool:
        return self.lo >= self.hi

    @property
    def found(self) -> int | None:
        return self.lo if self.lo < self.n else None


class LinearMarker:
    """Finds the first of `candidates` whose probe is bad, probing them in order: where badness
    does not persist (a unit that starts over from the model's inputs), a bisection cannot."""

    def __init__(self, candidates):
        self.candidates = list(candidates)
        self.at = 0
        self.found: int | None = None
        self.steps = 0

    def next(self) -> int:
        return self.candidates[self.at]

    def step(self, bad: bool) -> None:
        self.steps += 1
        if bad:
            self.found = self.candidates[self.at]
        else:
            self.at += 1

    def stop(self) -> bool:
        return self.found is not None or self.at >= len(self.candidates)


@dataclass
class StrategyResult:
    """What a strategy found: the rows it judged, the first over budget, the final outputs' row
    (end to end, against their own budget; None where not judged), its paired passes and notes,
    and the calls and pairs of its last full capture (for the diagnosis; None where none ran)."""

    results: list[LayerResult]
    first_bad: LayerResult | None
    outputs: LayerResult | None
    passes: int
    notes: list[str] = field(default_factory=list)
    calls: tuple[dict, dict] | None = None
    pairs: list | None = None


class Strategy(Protocol):
    name: str

    def run(self, session) -> StrategyResult: ...


def _capture(session, torch_paths=None, paddle_paths=None, keep=True, counts: tuple[dict, dict] | None = None,
             spills: tuple = (None, None)):
    """Both sides' calls at the paths given (every module's where None), the two captures at once
    (paddle computes on one core on CPU); `counts` (per side, path -> the calls a forward makes, from
    a pass that ran it whole): each forward ends once the calls at its paths have completed;
    `spills` (torch's, paddle's): every call's tensors written there too (spill.py)."""
    t_counts, p_counts = counts or (None, None)
    let_go(session)
    with TorchWorker(session) as side:
        rt = side.submit(capture_torch, session, torch_paths, keep, None, wanted_calls(torch_paths, t_counts),
                         spills[0])
        rp = capture_paddle(session, paddle_paths, keep, None, wanted_calls(paddle_paths, p_counts), spills[1])
        return rt.result().calls, rp.calls


def let_go(session, sides=("torch", "paddle", "float64")) -> None:
    """The blocks of the session's trees held block by block (the float64 reference; the models whose
    weights are streamed) dropped, and no thread's last block held any longer: called where no
    thread runs those trees, before a pass group, so that a block the main thread read last is not
    held beside the blocks the worker thread runs (widen.BlockTensors.let_go)."""
    trees = {side: s.tensors for side, s in getattr(session, "streams", {}).items()}
    reference = getattr(session, "reference64", None)
    if reference is not None:
        trees["float64"] = reference.tensors
    for side in sides:
        if side in trees:
            trees[side].let_go()


def first_bad(results: list[LayerResult]) -> LayerResult | None:
    return next((r for r in results if r.within_budget is False), None)


class FullCapture:
    name = "full"

    def __init__(self, limit_bytes=None):
        self.limit_bytes = limit_bytes

    def run(self, session) -> StrategyResult:
        found = self.capture(session)
        return StrategyResult(found.results, first_bad(found.results), found.outputs, found.passes,
                              calls=found.calls, pairs=found.pairs)

    def capture(self, session, paths: tuple[set, set] | None = None,
                counts: tuple[dict, dict] | None = None, captured: tuple[dict, dict] | None = None) -> StrategyResult:
        """Results for every pair (only the torch and paddle layers at `paths` when given), and,
        for the whole model, its final outputs' row; its first_bad is left for the caller.
        `counts` (per side, path -> the calls a forward makes, from a pass that ran it whole): every
        pass ends once the calls it records have completed (see capture.stop_when_done).
        `captured`: torch's and paddle's calls at `paths` as an earlier pass recorded them (read
        back from a spill), in place of the capture pass."""
        t_paths, p_paths = paths or (None, None)
        t_counts, p_counts = counts or (None, None)
        whole = paths is None
        allowance = Allowance(self.limit_bytes)  # what both captures may hold between them
        let_go(session)
        # the captures run at once (paddle computes on one core on CPU); then torch work that
        # needs no paddle result runs beside the paddle passes, on the cores paddle leaves free
        outputs = None
        with TorchWorker(session) as side:
            if captured is None:
                rt = side.submit(lambda: capture_torch(session, t_paths, True, allowance,
                                                       wanted_calls(t_paths, t_counts)).calls)
            else:
                rt = side.submit(lambda: captured[0])
            paddle_captured = threading.Event()  # paddle's first pass, the capture or the forced pass, has ended
            matmul = {}  # S2 and K of the torch matmul modules: the worker's until paddle's first pass ends
            matmul_first = side.submit(lambda: matmul_stats_all(session, rt.result(), matmul, paddle_captured.is_set))
            try:
                p_found = captured[1] if captured is not None else \
                    capture_paddle(session, p_paths, True, allowance, wanted_calls(p_paths, p_counts)).calls
            finally:
                if captured is None:
                    paddle_captured.set()
            passes = Passes(rt.result(), p_found, [], matmul=matmul)
            if whole:
                same_outputs(session, passes.t_calls[""], passes.p_calls[""])
            passes.pairs = align(passes.t_calls, passes.p_calls, session.plan)
            t_paired, p_paired = [p.torch for p in passes.pairs], [p.paddle for p in passes.pairs]
            references = side.submit(torch_references, session, t_paired, passes.t_calls, side.widen_when_alone,
                                     wanted_calls(t_paired, t_counts))
            free = side.submit(free_references, session, [""]) if whole else None
            try:
                passes.forced_p = forced_paddle(session, passes.pairs, passes.t_calls, wanted_calls(p_paired, p_counts))
            finally:
                paddle_captured.set()
            passes.paddle_err = paddle_own_errors(session, passes)
            matmul_first.result()
            let_go(session, ("torch",))  # the worker is done with the torch model: its last block goes
            with side.on_cores_left():
                matmul_stats_all(session, passes.t_calls, matmul)  # the rest
            end_to_end_until(session, passes, references.done)
            passes.forced_64, passes.rounded_64 = references.result()
            results = analyze_all(session, passes, free and free.result)  # beside the free-running float64 pass
            side.main_done()
            if free is not None:
                root = next(p for p in passes.pairs if p.torch == "")
                reference = passes.forced_64.get("")  # an elementwise last step's condition is the model's
                outputs = judge_end_to_end(session, root, passes.t_calls[""].outputs, passes.p_calls[""].outputs,
                                           free.result()[""], FINAL_OUTPUTS, reference and reference.condition,
                                           passes.t_calls)
        # two paired passes: the capture (none where the calls were captured before), then the forced pass
        # (paddle forced, torch forced in float64)
        return StrategyResult(results, None, outputs, 1 if captured is not None else 2,
                              calls=(passes.t_calls, passes.p_calls),
                              pairs=passes.pairs)


def unit_candidates(side, model, blocks: list) -> set[str]:
    """The paths top_level_units may take, from the module tree alone, before any pass: every
    module no deeper than the model's blocks (the children of its largest module lists, see
    widen._blocks), the model itself included; none for a model without blocks. `side` is the
    framework's adapter."""
    ids = {id(b) for b in blocks}
    depth = lambda path: path.count(".") + 1 if path else 0
    named = list(side.named_layers(model))
    deepest = max((depth(path) for path, m in named if id(m) in ids), default=None)
    return set() if deepest is None else {path for path, _ in named if depth(path) <= deepest}


def _outline_only(calls: dict) -> dict:
    """Calls as an outline pass records them: order, type and output shapes, no tensors held."""
    return {path: dataclasses.replace(c, args=(), kwargs={}, outputs=[], returned=None) for path, c in calls.items()}


def top_level_units(pairs, t_calls) -> list:
    """Top-level units in execution order: the children of the module list that holds the most
    paired modules (a model's blocks, not the experts inside one block), and the modules that sit
    beside it or beside its ancestors."""
    paths = [p.torch for p in pairs]
    children: dict[str, list[str]] = {}
    for p in paths:
        if p:
            children.setdefault(parent(p), []).append(p)
    listlike = lambda c: all(child.rsplit(".", 1)[-1].isdigit() for child in children[c])
    held = lambda c: sum(is_inside(p, c) for p in paths)
    container = max(children, key=lambda c: (listlike(c), held(c), -c.count(".")), default="")
    ancestors = [""]
    if container:
        parts = container.split(".")
        ancestors += [".".join(parts[: i + 1]) for i in range(len(parts))]
    units = []
    for pair in pairs:
        p = pair.torch
        if p and p not in ancestors and parent(p) in ancestors:
            units.append(pair)
    units.append(next(pair for pair in pairs if pair.torch == ""))
    return sorted(units, key=lambda pair: t_calls[pair.torch].end)


FINAL_OUTPUTS = "the final outputs, end to end (free-running), against the torch model's own drift from float64"


def same_outputs(session, t_call, p_call) -> None:
    """Both models must return the same structure (keys of the same type in the same order, the
    same positions; lists and tuples alike) holding at least one floating tensor, and the same
    tensors: an output on one side only is never compared, so it is bad input, not a pass."""
    t_said, p_said = session.returned.get("torch", "?"), session.returned.get("paddle", "?")
    cut = lambda said: said if len(said) <= 160 else said[:157] + "..."
    if not t_call.shapes and not p_call.shapes:
        raise UserError(f"neither model returns a floating tensor: torch_model() returns {cut(t_said)}, paddle_model() "
                        f"returns {cut(p_said)}; verify-port compares floating outputs: make both forwards return "
                        "their output tensors")
    if shapes_fit(t_call, p_call):
        if t_said != p_said:
            raise UserError(f"the two models return different structures: torch_model() returns {cut(t_said)}, "
                            f"paddle_model() returns {cut(p_said)}; make both return the same structure (the same "
                            "keys, of the same type, in the same order), or wrap one model to return what the other does")
        return
    a, b = t_call.shapes, p_call.shapes
    said = lambda shapes: f"{len(shapes)} floating tensor(s) {', '.join(str(list(s)) for s in shapes) or ''}".strip()
    raise UserError(f"the two models return different outputs: torch_model() gives {said(a)}, paddle_model() gives "
                    f"{said(b)}; make both return the same tensors in the same order (HF models: use_cache=False, "
                    "no hidden states or attentions; or wrap one model to return what the other does)")


def free_reference(session, paths, fmt: str | None = None, draw: int = 0, counts: dict | None = None,
                   allowance: Allowance | None = None) -> dict[str, list[np.ndarray]]:
    """Per path in `paths` that the forward calls, the float64 torch model's outputs there,
    free-running (nothing forced), in one pass, with matmul inputs rounded to `fmt` if given (see
    precision.torch_rounding for `draw`); `counts` (torch path -> the calls a forward makes): the
    pass ends once those at `paths` have completed; `allowance`: bounds what the pass holds."""
    ref = capture_calls(torch_side, session.torch64, lambda: session.run_torch64(fmt, draw), set(paths),
                        allowance=allowance, until=wanted_calls(paths, counts))
    return {path: to_numpy_list(ref.calls[path].outputs, "torch") for path in paths if path in ref.calls}


def free_references(session, paths, counts: dict | None = None,
                    allowance: Allowance | None = None) -> dict[str, dict]:
    """Per path, free_reference in float64 (key None), and per lower-precision format in use, a
    list of ROUNDING_DRAWS draws; one float64 pass per draw for all the paths; `counts` and
    `allowance`: as in free_reference."""
    out = {path: {None: outputs} for path, outputs in free_reference(session, paths, counts=counts,
                                                                     allowance=allowance).items()}
    for f in sorted(set(session.formats.values()) - {"fp32"}):
        for draw in range(ROUNDING_DRAWS):
            for path, outputs in free_reference(session, paths, f, draw, counts, allowance).items():
                out[path].setdefault(f, []).append(outputs)
    return out


RUN_TO_RUN_SHARE = 0.25  # two torch runs may differ by this share of the budget and still count as one
DRIFT_SUSPECT = 1e-3  # rms fp32 drift from float64, relative to the output's rms, that arithmetic alone rarely gives


def _implausible_drift(y32: np.ndarray, y64: np.ndarray) -> bool:
    scale, drift = rms(y64), rms(y32, y64)
    return not np.isfinite(drift) or drift > DRIFT_SUSPECT * scale


def _torch_deterministic(session, path: str, y_t: np.ndarray, pairs, shapes, budget) -> str:
    """A torch forward that gives other values on the same inputs (dropout left on) makes every
    budget meaningless, since each is measured against torch's own run: that is bad input. Two
    runs that differ within the budget are the kernels' own noise (some CPUs' bf16 and threaded
    kernels do not sum in a fixed order; dropout moves outputs by their own size): a note."""
    again = capture_torch(session, {path})
    y_again = laid_out(to_numpy_list(pairs.of_torch(again.calls[path].outputs), "torch"), shapes)
    if np.array_equal(y_again, y_t, equal_nan=True):
        return ""
    diff = np.abs(np.nan_to_num(y_again - y_t, nan=np.inf)) if y_t.size else np.zeros(0, np.float32)
    ratio, _ = budget.ratio(diff)
    worst = float(diff.max()) if diff.size else 0.0
    if ratio <= RUN_TO_RUN_SHARE:
        return (f"torch's own two runs differ by up to {worst:.3g} (ratio {ratio:.2g} of the budget): the kernels' "
                "summation order, not randomness")
    raise UserError(f"torch_model() gives other outputs on the same inputs (max abs {worst:.3g} between two runs "
                    f"at {path or 'the model'}): something random is active, such as dropout in training mode or "
                    "F.dropout(..., training=True); call eval() and pass training=self.training, then verify again")


def _finite_reference(session, unit, y_t, y_p, y64, t_calls: dict | None = None) -> tuple:
    """The outputs to compare, where torch's own float32 run is a reference: a NaN or Inf there
    that its float64 run does not give too (float32 overflowed: inputs of 1e38) is bad input,
    named where it first appears; an infinity all three give alike (a mask of -inf the model
    means) is no error and is left out, as masked positions are. Paddle's NaN or Inf where torch's
    value is finite stays in: over any budget."""
    if np.isfinite(y_t).all() and np.isfinite(y64).all():
        return y_t, y_p, y64
    with np.errstate(invalid="ignore"):
        meant = ~np.isfinite(y_t) & (y_t == y64)
    wrong = ~np.isfinite(y_t) & ~meant
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        first = _first_non_finite(t_calls) if t_calls is not None else None
        at = f"; the first module whose output is not finite: {first or '<model>'}" if first is not None else ""
        raise UserError(f"torch_model()'s own float32 run gives {y_t.flat[i]} at element {i} of "
                        f"{'its outputs' if unit.torch == '' else repr(unit.torch) + ' outputs'}, where its float64 "
                        f"run gives {y64.flat[i]:.4g}{at}: with no finite reference there is nothing to compare the "
                        "port with; give inputs of a smaller scale (float32 holds up to 3.4e38), or fix the torch model")
    out = []
    for a in (y_t, y_p, y64):
        a = np.array(a, copy=True)
        a[meant & (y_p == y_t)] = 0  # the same infinity on every side
        out.append(a)
    y_t, y_p, y64 = out
    y64[~np.isfinite(y64)] = y_t[~np.isfinite(y64)]  # float64 overflowed where float32 did not: no drift known
    return y_t, y_p, y64


def _first_non_finite(t_calls: dict) -> str | None:
    """The first torch module, in completion order, whose recorded floating output holds a NaN or Inf."""
    for call in sorted(t_calls.values(), key=lambda c: c.end):
        if any(not np.isfinite(a).all() for a in to_numpy_list(call.outputs, "torch")):
            return call.path
    return None


def judge_end_to_end(session, unit, t_out: list, p_out: list, references: dict, note: str,
                     condition: np.ndarray | None = None, t_calls: dict | None = None,
                     paddle64=None) -> LayerResult:
    """`unit`'s outputs as both models computed them, free-running, against the end-to-end
    budget: the torch model's own fp32 drift from float64 there (observed), grown by the
    formats each side uses (the rms effect of rounding matmul inputs to them), on both sides,
    and by the last op's condition where the unit is elementwise (see forced._condition).
    `paddle64`: what gives the float64 paddle copy's outputs at paddle paths (by default
    session.paddle64_outputs)."""
    # the model's own outputs pair by position (same_outputs checked their structures): by value,
    # a port that swaps two outputs would pass
    pairs = pair_outputs([tuple(a.shape) for a in t_out], [tuple(b.shape) for b in p_out]) if unit.torch == "" \
        else outputs_of(t_out, p_out)
    shapes = pairs.shapes

    def row(*notes, **judged) -> LayerResult:
        return LayerResult(unit.torch, unit.paddle, unit.torch_type, unit.paddle_type, shapes[0] if shapes else (),
                           formats=dict(session.formats), note="; ".join(filter(None, (note,) + notes)), **judged)
    if not shapes or len(shapes) != len(t_out):
        return row(f"outputs differ: torch {[list(a.shape) for a in t_out]}, paddle {[list(b.shape) for b in p_out]}",
                   ratio=float("inf"))
    y_t = laid_out(to_numpy_list(pairs.of_torch(t_out), "torch"), shapes)
    y_p = laid_out(to_numpy_list(pairs.of_paddle(p_out), "paddle"), shapes)
    y64 = laid_out(pairs.of_torch(references[None]), shapes)
    masked = masked_alike(y_t, y_p)  # positions both sides mask (a position bias that carries its mask)
    y_t, y_p, y64 = unmasked(masked, y_t, y_p, y64)
    y64 = np.where(masked_by_torch(y_t, y64), y_t, y64)  # a mask on torch's side only: no drift known there
    y_t, y_p, y64 = _finite_reference(session, unit, y_t, y_p, y64, t_calls)
    m = compare(y_t, y_p)
    rounding = {f: rms_over([unmasked(masked, laid_out(pairs.of_torch(r), shapes))[0] - y64 for r in draws])
                for f, draws in references.items() if f is not None}
    if condition is not None and (len(shapes) != 1 or condition.size != y_t.size):
        condition = None
    condition = None if condition is None else laid_out([condition], shapes).reshape(y_t.shape)
    budget = make_budget(session.formats, y_t, y64, None, rounding, condition)
    drift = _torch_deterministic(session, unit.torch, y_t, pairs, shapes, budget) if _implausible_drift(y_t, y64) else ""
    diff = np.abs(np.nan_to_num(y_p - y_t, nan=np.inf))
    ratio, tolerance = budget.ratio(diff)
    if ratio > 1:  # the budget took paddle's drift to be torch's: measure paddle's own, as its kernels sum
        own = (paddle64 or session.paddle64_outputs)([unit.paddle])
        if own is not None:
            y_p64 = laid_out(pairs.of_paddle(sliced(unit, own[unit.paddle])), shapes)
            e_paddle = unmasked(masked, np.subtract(y_p, y_p64, dtype=np.float64).astype(np.float32))[0]
            e_torch = np.subtract(y_t, y64, dtype=np.float64).astype(np.float32)
            budget = budget_from_error(session.formats, y_t, e_torch, None, rounding, condition, e_paddle)
            ratio, tolerance = budget.ratio(diff)
            drift = "; ".join(filter(None, (drift, PADDLE_DRIFT)))
    return row(drift, max_abs=m.max_abs, mean_abs=m.mean_abs, max_rel=m.max_rel, cosine=m.cosine, nan=m.nan,
               inf=m.inf, worst_index=m.worst_index, ratio=ratio, budget=tolerance)


PADDLE_DRIFT = "budgeted with paddle's own drift from float64, measured on a float64 copy of the paddle model"


class BinarySearch:
    name = "binary"

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes  # what one sweep's captures may hold (see _sweep)

    def run(self, session) -> StrategyResult:
        self.passes, self.notes, self.inside, self._own64, self.boundary_bytes = 1, [], None, {}, 0
        self._recorded = None  # what the sweep's chunks return instead of running (known.Recorded)
        self._spills = None  # every call of the outline pass, torch's and paddle's, on disk (spill.py)
        self._spill_reads = 0  # the captures read back from it
        try:
            return self._run(session)
        finally:
            for spill in self._spills or ():
                spill.close()
            self._spills = None

    def _run(self, session) -> StrategyResult:
        t_calls, p_calls, kept = self._outline(session)
        self._outline_calls = t_calls, p_calls
        self.counts = call_counts(t_calls), call_counts(p_calls)  # the calls of a whole forward: later passes
        # that record some modules end once theirs have completed
        same_outputs(session, t_calls[""], p_calls[""])
        pairs = align(t_calls, p_calls, session.plan)
        # a unit with no floating outputs (ids, buckets) has nothing a probe could judge: its error
        # shows in the units that read it
        self.units = [u for u in top_level_units(pairs, t_calls) if u.torch == "" or t_calls[u.torch].shapes]
        self.boundaries = self._boundaries(session, t_calls, kept)
        kept = None  # what the outline kept beyond the units' boundaries goes
        results, bad = self._search(session, pairs)
        self._own64 = {}  # what the probes read is no longer needed; the boundaries spare the sweep work
        outputs = self.outputs
        if bad is None:
            # no unit's boundary is over the end-to-end budget, yet a difference whose effect stays
            # within it (a LayerNorm epsilon of 1e-7 against 1e-5, a bug below bf16 noise) is over its
            # own layer's budget: every layer is judged against its own, a few units at a time
            results, bad = self._sweep(session, pairs, t_calls, p_calls)
        self.boundaries, self._recorded = None, None
        if self._spill_reads:
            held = readable_size(sum(spill.nbytes for spill in self._spills))
            self.notes.append(f"the outline pass's activations ({held}) were kept on disk in "
                              f"{self._spills[0].folder} and read back {self._spill_reads} time(s) instead of capture "
                              "passes")
        inside = self.inside
        return StrategyResult(results, bad, outputs, self.passes, self.notes,
                              None if inside is None else inside.calls, None if inside is None else inside.pairs)

    def _sweep(self, session, pairs, t_calls, p_calls):
        """Full captures of the units in execution order, as many at once as `limit_bytes` holds
        (estimated from the outline pass's shapes, less the boundaries held), and of the modules
        holding them (their own code, between the units) with the last, which records every
        earlier unit's own module too (their outputs alone): the code between the units is judged
        on the same calls as one capture of every unit records, whatever the chunks; (every row
        judged, the first over budget). Where the boundaries were recorded, the units before a
        chunk return their recorded outputs in its passes instead of running (known.py); in the
        last, which forces every unit, what they returned in their own chunks' forced passes."""
        units = [u for u in self.units if u.torch != ""]
        holders = [p for p in pairs if p.torch not in {u.torch for u in units}
                   and not any(is_under(p.torch, u.torch) for u in units)]
        size = lambda calls, root: sum(4 * 2 * int(np.prod(s)) for c in calls.values()
                                       if is_under(c.path, root) for s in c.shapes)
        limit = None if self.limit_bytes is None else self.limit_bytes - self.boundary_bytes
        chunks, chunk, held = [], [], 0
        for unit in units:
            need = size(t_calls, unit.torch) + size(p_calls, unit.paddle)
            if chunk and limit is not None and held + need > limit:
                chunks.append(chunk)
                chunk, held = [], 0
            chunk, held = chunk + [unit], held + need
        chunks.append(chunk)
        results = []
        for i, chunk in enumerate(chunks):
            t_paths = {p for p in t_calls if any(is_under(p, u.torch) for u in chunk)}
            p_paths = {p for p in p_calls if any(is_under(p, u.paddle) for u in chunk)}
            before, last = units[:units.index(chunk[0])] if chunk else [], i == len(chunks) - 1  # no units: []
            if last:
                t_paths |= {h.torch for h in holders} | {u.torch for u in units}
                p_paths |= {h.paddle for h in holders} | {u.paddle for u in units}
            with self._returned(session, before, chunk, last):
                self.inside = FullCapture().capture(session, (t_paths, p_paths), self.counts,
                                                    self._captured(t_paths, p_paths))
            self.passes += self.inside.passes
            judged = {r.torch for r in results}  # an earlier unit, recorded again for the code around it
            found = [r for r in self.inside.results if r.torch not in judged]
            results += found
            bad = first_bad(found)
            if bad is not None:
                break
        self.notes.append(self._swept(len(units), i + 1))
        return results, bad

    def _swept(self, units: int, captures: int) -> str:
        return (f"binary search: no unit's boundary is over the end-to-end budget; every layer was then judged "
                f"against its own budget, {units} units in {captures} capture(s)")

    @contextlib.contextmanager
    def _returned(self, session, before, chunk, last: bool):
        """The context of a sweep chunk's capture: the units `before` it return what they returned
        where that was recorded (known.returning_recorded: their boundaries; in the `last` chunk,
        which forces them, their own chunks' forced outputs, which the others keep); every unit runs
        where the boundaries were not recorded."""
        if self.boundaries is None:
            yield
            return
        if self._recorded is None:
            self._recorded = Recorded(*self.boundaries, self.counts)
        recorded = self._recorded
        units = [u for u in before if recorded.returnable(u, forced=last)]
        with returning_recorded(session, units, recorded, forced=last), \
                (contextlib.nullcontext() if last else recording_forced(session, chunk, recorded)):
            yield

    def _outline(self, session) -> tuple[dict, dict, tuple | None]:
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
                    outline = _outline_only(t_calls), _outline_only(p_calls)
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
        (self._spills) where the block ends with both complete, closed otherwise."""
        spills = Spill(torch_side), Spill(paddle_side)
        try:
            yield spills
            if all(spill.complete for spill in spills):
                self._spills, spills = spills, ()
        finally:
            for spill in spills:
                spill.close()

    def _boundaries(self, session, t_calls, kept) -> tuple[dict, dict, dict] | None:
        """Every unit's outputs, torch's, paddle's and the free-running float64 model's, where they
        fit in `limit_bytes` (estimated from the outline pass's shapes, `t_calls`): the probes read
        them instead of running passes of their own. Taken from what the outline pass `kept` where
        it kept them at every unit; else from one paired pass and one float64 pass. None where they
        do not fit: each probe then records its unit alone."""
        draws = len(set(session.formats.values()) - {"fp32"}) * ROUNDING_DRAWS
        per_element = 4 + 4 + 8 * (1 + draws)  # torch's and paddle's float32, the float64 references
        elements = sum(int(np.prod(s)) for u in self.units for s in t_calls[u.torch].shapes)
        # the float64 paddle copy's outputs at every unit, where a probe needs them, fit beside them
        self._own64["fits"] = self.limit_bytes is None or (per_element + 8) * elements <= self.limit_bytes
        if self.limit_bytes is not None and per_element * elements > self.limit_bytes:
            return None
        # and, for the sweep's last chunk, the units' outputs in their chunks' forced passes (known.py)
        self.boundary_bytes = (per_element + (4 + 8) * float64_returned(session)) * elements
        if kept is not None:
            t_kept, p_kept, free = kept
            if all(u.torch in free and u.torch in t_kept and t_kept[u.torch].outputs and u.paddle in p_kept
                   and p_kept[u.paddle].outputs for u in self.units):
                return ({u.torch: t_kept[u.torch] for u in self.units},
                        {u.paddle: p_kept[u.paddle] for u in self.units}, {u.torch: free[u.torch] for u in self.units})
        self.passes += 1
        let_go(session)
        with TorchWorker(session) as side:  # the float64 pass beside both captures, which run in turn
            free = side.submit(free_references, session, [u.torch for u in self.units])
            p_found = capture_paddle(session, {u.paddle for u in self.units}).calls
            with side.on_cores_left():
                t_found = capture_torch(session, {u.torch for u in self.units}).calls
            return t_found, p_found, free.result()

    def _probe(self, session, unit) -> tuple[bool, LayerResult]:
        """`unit`'s output against the end-to-end budget: from the boundaries recorded at once, or
        one paired pass recording only it."""
        paddle64 = None
        if self.boundaries is None:
            t_calls, p_calls = self._captured({unit.torch}, {unit.paddle}) or \
                _capture(session, {unit.torch}, {unit.paddle}, counts=self.counts)
            self.passes += self._spills is None
            free = free_references(session, [unit.torch], self.counts[0])
        else:
            t_calls, p_calls, free = self.boundaries
            if self._own64["fits"]:
                paddle64 = lambda paths: self._paddle64_boundaries(session)
        result = judge_end_to_end(session, unit, t_calls[unit.torch].outputs, sliced(unit, p_calls[unit.paddle].outputs),
                                  free[unit.torch], "end to end at this unit's output (a binary-search probe)",
                                  paddle64=paddle64)
        return result.verdict is Verdict.FAIL, result

    def _paddle64_boundaries(self, session) -> dict | None:
        """The float64 paddle copy's outputs at every unit, from one pass of it, made when a probe
        first needs paddle's own drift and kept with the boundaries where they fit beside them in
        the capture limit: one pass of the copy for every probe, not one each."""
        if "units" not in self._own64:
            self._own64["units"] = session.paddle64_outputs([u.paddle for u in self.units])
        return self._own64["units"]

    def _mark(self, session, marker, probes: dict) -> int | None:
        """Probes the units `marker` asks for, into `probes`, until it stops; the unit it found."""
        while not marker.stop():
            index = marker.next()
            bad, probes[index] = self._probe(session, self.units[index])
            marker.step(bad)
        return marker.found

    def _search(self, session, pairs):
        """The binary search over self.units: (the found unit's results, the first bad layer), or
        (the probes, None) when no unit's boundary is over budget. Sets self.outputs, the model's
        own probe (the last unit) where it was probed."""
        units = self.units
        probes = {}
        found = self._mark(session, Bisector(len(units)), probes)
        self.outputs = probes.get(len(units) - 1)  # the model itself: the last unit
        if found is None:
            return [probes[i] for i in sorted(probes)], None
        found = self._earliest(session, found, probes)
        results, bad = self._inside(session, units[found])
        while bad is None:
            # nothing inside the unit is over budget, nor its own code: the error came in with its
            # inputs, from an earlier unit that the units between do not read (T5's decoder starts
            # on its own embedding and reads the encoder only in its cross-attention). Badness
            # does not persist there, so the earlier units not yet probed are probed in order.
            earlier = self._mark(session, LinearMarker(i for i in range(found) if i not in probes), probes)
            if earlier is None:
                own = next((r for r in results if r.torch == self.units[found].torch), None)
                if own is not None and own.verdict is Verdict.PASS:  # judged on torch's inputs, and within budget
                    bad = self._between(pairs, found, probes[found])
                else:  # the unit's own output could not be judged inside it (a fused layer, a NaN): its boundary
                    bad = dataclasses.replace(probes[found], note="over budget at this unit's boundary, with no "
                                              "layer inside it over budget")
                results = results + [bad]
                break
            found = earlier
            results, bad = self._inside(session, units[found])
        return results, bad

    def _earliest(self, session, found: int, probes: dict) -> int:
        """The first unit over budget once clean probes clear only the units they read: a unit
        that starts over from the model's inputs (T5's decoder, on its own embedding) is clean
        whatever came before it, so the earlier units it does not read are probed, in order."""
        if found == 0:
            return found
        from .dataflow import trace
        try:  # torch alone, no activations kept: not counted with the paired passes
            flow = trace(session, [u.torch for u in self.units])
        except Exception:  # noqa: BLE001 - a model that fails here failed in no paired pass:
            return found  # the search keeps its own supposition rather than lose its answer
        while found > 0:
            cleared = set()
            for i, result in probes.items():
                if i < found and result.verdict is not Verdict.FAIL:
                    reads = flow.cleared_by(i)
                    cleared |= set(range(i + 1)) if reads is None else reads | {i}
            earlier = self._mark(session, LinearMarker(j for j in range(found) if j not in cleared), probes)
            if earlier is None:
                return found
            found = earlier
        return found

    def _between(self, pairs, found: int, probe: LayerResult) -> LayerResult:
        """The answer when unit `found` is over budget at its boundary, nothing inside it is, and
        every earlier unit it may read is within budget: its inputs came from code between the
        units, the own code of the nearest paired module holding it and the unit before it (a
        scale applied between two layers of a model's forward), which full capture names too."""
        paired = {p.torch: p for p in pairs}
        here = self.units[found].torch
        holder = parent(here) if found == 0 else common_parent([self.units[found - 1].torch, here])
        while holder not in paired and holder:
            holder = parent(holder)
        pair = paired.get(holder)
        if pair is None:  # no paired module holds it: the unit's own boundary is the answer
            return dataclasses.replace(probe, note=f"over budget at this unit's boundary (ratio {probe.ratio:.3g}), "
                                       "with no layer inside it over budget")
        return dataclasses.replace(
            probe, torch=pair.torch, paddle=pair.paddle, type=pair.torch_type, paddle_type=pair.paddle_type,
            note=f"{here or '<model>'} is over budget at its boundary (ratio {probe.ratio:.3g}) with nothing inside it "
                 "over budget, and every earlier unit it reads is within budget: what it receives comes from "
                 f"{holder or '<model>'}'s own code between the units")

    def _inside(self, session, unit):
        """Full capture of one unit: (its results, the first over budget or None)."""
        paths = ({p for p, _ in torch_side.named_layers(session.torch_model) if is_under(p, unit.torch)},
                 {p for p, _ in paddle_side.named_layers(session.paddle_model) if is_under(p, unit.paddle)})
        self.inside = FullCapture().capture(session, paths, self.counts, self._captured(*paths))
        self.passes += self.inside.passes
        return self.inside.results, first_bad(self.inside.results)

    def _captured(self, t_paths, p_paths) -> tuple[dict, dict] | None:
        """The calls at `t_paths` and `p_paths` as the outline pass recorded them, read back from
        its spills; None where it kept none (a capture pass records them)."""
        if self._spills is None:
            return None
        (t_spill, p_spill), (t_calls, p_calls) = self._spills, self._outline_calls
        self._spill_reads += 1
        return t_spill.revive(t_calls, t_paths), p_spill.revive(p_calls, p_paths)


class ChunkedCapture(BinarySearch):
    """The full strategy where every layer's activations do not fit at once: every layer judged
    against its own budget a few units at a time (BinarySearch's sweep, without its search), and
    the final outputs end to end; it stops at the first chunk with a layer over budget."""

    name = "full"

    def _search(self, session, pairs):
        self.outputs = self._probe(session, self.units[-1])[1]  # the model itself: the last unit
        return [], None

    def _swept(self, units: int, captures: int) -> str:
        return (f"full capture in chunks: every layer judged against its own budget, {units} units in {captures} "
                "capture(s), as their activations at once do not fit in the memory available")


def choose(strategy: str, limit_bytes: int) -> Strategy:
    if strategy == "binary":
        return BinarySearch(limit_bytes)
    return FullCapture(limit_bytes if strategy == "auto" else None)

