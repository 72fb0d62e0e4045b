"""The search for the first unit over budget, over its probe alone: `probe(i)` is True where unit
i's boundary is over budget. Nothing here runs a model; the binary strategy gives the probe
(strategies.BinarySearch).

* first_bad_unit: a bisection, where badness persists from a unit to every later one (an error
  carries on through the blocks): at most ceil(log2(n + 1)) probes.
* first_bad_in_order: the candidates probed in order, where badness does not persist (a unit that
  starts over from the model's inputs), which a bisection cannot search.
* look_back: the first unit over budget once a clean probe clears only the units it reads.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

Probe = Callable[[int], bool]


def first_bad_unit(n: int, probe: Probe) -> int | None:
    """The first index in [0, n) whose probe is bad, given that badness persists; None where none
    is. Where it does not persist, an index whose probe is bad and whose predecessor's (probed) is
    clean, or 0."""
    lo, hi = 0, n  # the answer lies in [lo, hi]; hi == n means none is bad
    while lo < hi:
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < n else None


def first_bad_in_order(candidates: Iterable[int], probe: Probe) -> int | None:
    """The first of `candidates` (taken as they are when called) whose probe is bad, probing them in
    order and stopping there; None where every one is clean."""
    return next((i for i in list(candidates) if probe(i)), None)


def look_back(found: int, probed: Mapping[int, bool], cleared_by: Callable[[int], set[int] | None],
              probe: Probe) -> int:
    """The first unit over budget, from unit `found` over budget, where a clean probe of unit i
    clears only the units it reads, `cleared_by(i)` (None: every unit up to i): the earlier units
    no clean probe cleared are probed in order, and the first bad one is looked back from in turn.
    `probed`: index -> bad, for every unit probed so far, which `probe` adds to."""
    while found > 0:
        cleared: set[int] = set()
        for i, bad in list(probed.items()):
            if i < found and not bad:
                reads = cleared_by(i)
                cleared |= set(range(i + 1)) if reads is None else reads | {i}
        earlier = first_bad_in_order((j for j in range(found) if j not in cleared), probe)
        if earlier is None:
            return found
        found = earlier
    return found
