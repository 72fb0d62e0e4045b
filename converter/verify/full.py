"""The full strategy, and what every strategy shares: the result a strategy gives, its interface,
and a full capture of every layer (or of the layers at some paths) on both sides at once, then one
forced pass per side (see compare/forced.py) that gives every pair's local error and reference.
The binary strategy and the full one in chunks (strategies.py) judge their units' insides with it."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Protocol

from ..compare.align import align
from .analyze import Passes, analyze_all, end_to_end_until, forced_pair, matmul_stats_all
from ..compare.forced import forced_paddle, paddle_own_errors, torch_references
from ..compare.overlap import TorchWorker
from ..compare.capture import Allowance, capture_paddle, capture_torch, wanted_calls
from .endtoend import FINAL_OUTPUTS, free_references, judge_end_to_end, same_outputs
from .report import LayerResult

from ..compare.port import Session


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

    def run(self, session: Session) -> StrategyResult: ...


def _capture(session: Session, torch_paths=None, paddle_paths=None, keep=True, counts: tuple[dict, dict] | None = None,
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


def let_go(session: Session, sides=("torch", "paddle", "float64")) -> None:
    """The blocks of the session's trees held block by block (the float64 reference; the models whose
    weights are streamed) dropped, and no thread's last block held any longer: called where no
    thread runs those trees, before a pass group, so that a block the main thread read last is not
    held beside the blocks the worker thread runs (widen.BlockTensors.let_go)."""
    trees = {side: s.tensors for side, s in session.streams.items()}
    reference = session.reference64
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

    def run(self, session: Session) -> StrategyResult:
        found = self.capture(session)
        return StrategyResult(found.results, first_bad(found.results), found.outputs, found.passes,
                              calls=found.calls, pairs=found.pairs)

    def capture(self, session: Session, paths: tuple[set, set] | None = None,
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
            t_found = rt.result()
            if whole:
                same_outputs(session, t_found[""], p_found[""])
            passes = Passes(t_found, p_found, align(t_found, p_found, session.plan), matmul=matmul)
            # the forced passes force a module's first call; a later call of a module called more than
            # once is judged on its own (analyze.py)
            forced = [p for p in passes.pairs if forced_pair(p)]
            t_paired, p_paired = [p.torch for p in forced], [p.paddle for p in forced]
            references = side.submit(torch_references, session, t_paired, passes.t_calls, side.widen_when_alone,
                                     wanted_calls(t_paired, t_counts))
            free = side.submit(free_references, session, [""]) if whole else None
            try:
                forced_p = forced_paddle(session, forced, passes.t_calls, wanted_calls(p_paired, p_counts))
            finally:
                paddle_captured.set()
            passes = dataclasses.replace(passes, forced_p=forced_p)
            passes = dataclasses.replace(passes, paddle_err=paddle_own_errors(session, dataclasses.replace(passes, pairs=forced)))
            matmul_first.result()
            let_go(session, ("torch",))  # the worker is done with the torch model: its last block goes
            with side.on_cores_left():
                matmul_stats_all(session, passes.t_calls, matmul)  # the rest
            end_to_end_until(session, passes, references.done)
            forced_64, rounded_64 = references.result()
            passes = dataclasses.replace(passes, forced_64=forced_64, rounded_64=rounded_64)
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
