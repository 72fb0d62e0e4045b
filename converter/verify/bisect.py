"""Strategies that find the first layer over budget.

* FullCapture: record every layer on both sides once, then one forced pass per side
  (see forced.py) gives every pair's local error and reference.
* BinarySearch: for models whose activations do not fit. One outline pass finds the
  sequence of top-level units (the spine: the repeated blocks and what sits around
  them); then each probe records only one unit's boundary on both sides and tests it
  against the end-to-end budget (fp32 noise measured against a float64 run of the
  torch model). Errors persist along the spine, so the first bad unit is found in
  ceil(log2 L) probes; a last full capture of that unit alone (two paired passes) names the
  smallest module over budget inside it. At most ceil(log2 L) + 3 paired passes; O(1)
  units held.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .align import align, parent, under
from .analyze import Passes, analyze_all, end_to_end_until, matmul_stats_all
from .forced import forced_paddle, torch_references
from .overlap import Beside
from .budget import make_budget
from ..frameworks import paddle_side, torch_side
from .capture import Allowance, Recorder, capture_paddle, capture_torch, record
from .metrics import compare, join
from .replay import to_numpy_list
from .report import LayerResult


class Bisector:
    """Finds the first index in [0, n) whose probe is bad, given that badness persists."""

    def __init__(self, n: int):
        self.lo, self.hi = 0, n  # the answer lies in [lo, hi]; hi == n means none is bad
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


def _capture(session, torch_paths=None, paddle_paths=None, keep=True):
    rt = capture_torch(session, torch_paths, keep)
    return rt.calls, capture_paddle(session, paddle_paths, keep).calls


def first_bad(results: list[LayerResult]) -> LayerResult | None:
    return next((r for r in results if r.within_budget is False), None)


class FullCapture:
    name = "full"

    def __init__(self, limit_bytes=None):
        self.limit_bytes = limit_bytes
        self.passes = 0

    def run(self, session, prefix: tuple[str, str] | None = None):
        """Results for every pair (inside one torch/paddle subtree when `prefix` is given)."""
        t_paths = p_paths = None
        if prefix is not None:
            t_paths = {p for p, _ in torch_side.named_layers(session.torch_model) if under(p, prefix[0])}
            p_paths = {p for p, _ in paddle_side.named_layers(session.paddle_model) if under(p, prefix[1])}
        self.passes += 2  # the capture, then the forced pass (paddle forced, torch forced in float64)
        allowance = Allowance(self.limit_bytes)  # what both captures may hold between them
        # the captures run at once (paddle computes on one core on CPU); then torch work that
        # needs no paddle result runs beside the paddle passes, on the cores paddle leaves free
        with Beside(session) as side:
            rt = side.submit(capture_torch, session, t_paths, True, allowance)
            paddle_captured = threading.Event()
            s2 = {}  # S2 of the torch matmul modules: the worker's until paddle's capture ends
            s2_first = side.submit(lambda: matmul_stats_all(session, rt.result().calls, s2, paddle_captured.is_set))
            try:
                rp = capture_paddle(session, p_paths, True, allowance)
            finally:
                paddle_captured.set()
            passes = Passes(rt.result().calls, rp.calls, [], s2=s2)
            passes.pairs = align(passes.t_calls, passes.p_calls, session.plan)
            references = side.submit(torch_references, session, [p.torch for p in passes.pairs], passes.t_calls,
                                     side.between)
            passes.forced_p = forced_paddle(session, passes.pairs, passes.t_calls)
            s2_first.result()
            with side.beside_worker():
                matmul_stats_all(session, passes.t_calls, s2)  # the rest
            end_to_end_until(session, passes, references.done)
            side.main_done()
            passes.forced_64, passes.rounded_64 = references.result()
        self.calls = (passes.t_calls, passes.p_calls)
        self.pairs = passes.pairs
        return analyze_all(session, passes)


def spine(pairs, t_calls) -> list:
    """Top-level units in execution order: the children of the longest module list, and the
    modules that sit beside it or beside its ancestors."""
    paths = [p.torch for p in pairs]
    children: dict[str, list[str]] = {}
    for p in paths:
        if p:
            children.setdefault(parent(p), []).append(p)
    listlike = lambda c: all(child.rsplit(".", 1)[-1].isdigit() for child in children[c])
    container = max(children, key=lambda c: (listlike(c), len(children[c]), -c.count(".")), default="")
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


class BinarySearch:
    name = "binary"

    def __init__(self):
        self.passes = 0

    @staticmethod
    def _reference(session, path: str, fmt: str | None = None) -> np.ndarray:
        """The float64 torch model's output at `path` (matmul inputs rounded to `fmt` if given)."""
        ref = record(torch_side, session.torch64, Recorder({path}))
        try:
            session.run_torch64(fmt)
        finally:
            ref.remove()
        return join(to_numpy_list(ref.calls[path].outputs, "torch"))

    def _probe(self, session, unit) -> tuple[bool, LayerResult]:
        """One paired pass recording only `unit`'s output, against the end-to-end budget."""
        self.passes += 1
        t_calls, p_calls = _capture(session, {unit.torch}, {unit.paddle})
        y_t = join(to_numpy_list(t_calls[unit.torch].outputs, "torch"))
        y_p = join(to_numpy_list(p_calls[unit.paddle].outputs, "paddle"))
        y64 = self._reference(session, unit.torch)
        result = LayerResult(unit.torch, unit.paddle, unit.torch_type, unit.paddle_type, tuple(y_t.shape),
                             formats=dict(session.formats))
        if y_p.size != y_t.size:
            result.ratio = float("inf")
            return True, result
        y_p = y_p.reshape(y_t.shape)
        m = compare(y_t, y_p)
        result.max_abs, result.mean_abs, result.cosine = m.max_abs, m.mean_abs, m.cosine
        y64 = y64.reshape(y_t.shape)
        rounding = {f: float(np.sqrt(np.mean((self._reference(session, unit.torch, f).reshape(y_t.shape) - y64) ** 2)))
                    for f in set(session.formats.values()) - {"fp32"}}
        budget = make_budget(session.formats, y_t, y64, None, rounding)
        ratio, tol = budget.ratio(np.abs(np.nan_to_num(y_p - y_t, nan=np.inf)))
        result.ratio, result.budget = ratio, tol
        result.note = "end to end at this unit's output (a binary-search probe)"
        return ratio > 1.0, result

    def run(self, session):
        self.passes += 1
        t_calls, p_calls = _capture(session, keep=False)
        pairs = align(t_calls, p_calls, session.plan)
        units = spine(pairs, t_calls)
        self.units = units
        search = Bisector(len(units))
        probes = {}
        while not search.stop():
            index = search.next()
            bad, probes[index] = self._probe(session, units[index])
            search.step(bad)
        found = search.lo if search.lo < len(units) else None
        self.probed = [probes[i] for i in sorted(probes)]
        if found is None:
            return self.probed, None
        unit = units[found]
        full = FullCapture()
        results = full.run(session, (unit.torch, unit.paddle))
        self.passes += full.passes
        self.calls, self.pairs = full.calls, full.pairs
        bad = first_bad(results)
        if bad is None:  # the unit's own boundary is over budget though no layer inside is
            bad = probes[found]
            bad.ratio = max(bad.ratio or 0.0, 1.0 + 1e-9)
            results = results + [bad]
        return results, bad


def choose(strategy: str, limit_bytes: int):
    if strategy == "binary":
        return BinarySearch()
    return FullCapture(limit_bytes if strategy == "auto" else None)


def ceil_log2(n: int) -> int:
    return max(math.ceil(math.log2(max(n, 1))), 0)
