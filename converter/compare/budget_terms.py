"""The named terms an expected-error budget is the sum of, and how they add up.

A budget's variance per output element is a sum of parts. Each part is one array (or one
constant) times a coefficient, and the coefficient is the sum of the shares of the named terms
that scale that array: a matmul's S2 carries each side's accumulation and input rounding, the
output's square each side's stored format, torch's observed error the sides that take it as
their own. The shares are kept by name and side, so a budget can say which term dominated at
its worst element; the parts are added in the order, and the shares summed in the grouping, of
the calibrated arithmetic (see budget.py), so the figures are those of the model itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


ACCUMULATION = "accumulation"  # a matmul's fp32 sums over its reduction
INPUT_ROUNDING = "input rounding"  # products' inputs rounded to a side's format (modelled, or its measured effect)
STORED_FORMAT = "stored format"  # the result rounded to the format it is stored in
OBSERVED = "observed error"  # a side's own fp32 error against float64, measured
STAND_IN = "observed error, torch's standing in"  # paddle's error taken to be torch's (not measured there)
CONDITION = "condition"  # one unit of float32 rounding at the op's input, carried through the op
CONVENTION = "convention"  # a difference both sides have by design (training: BatchNorm's variance, ...)
FLOOR = "floor"  # float32's smallest normal value: a budget is never 0


@dataclass(frozen=True)
class Share:
    """One named term's share of a part's coefficient: `scale` times the part's array (squared)."""

    term: str
    side: str  # "torch", "paddle", or "" for neither side alone
    scale: float


@dataclass(frozen=True, eq=False)
class Addend:
    """One addend of the variance per element: coefficient * source (squared where `squared`), or
    the coefficient alone where `source` is None. `groups`: the shares, grouped as the calibrated
    arithmetic sums them (each group's scales first, then the groups, in order). `width`: the
    float type the part is computed in before it is added (None: the budget's)."""

    source: np.ndarray | None
    squared: bool
    groups: tuple[tuple[Share, ...], ...]
    width: type | None = None

    @property
    def coefficient(self) -> float:
        return sum(sum(share.scale for share in group) for group in self.groups)

    def base_at(self, index: int) -> float:
        """What the coefficient multiplies at element `index` (flat, row-major)."""
        if self.source is None:
            return 1.0
        a = np.asarray(self.source)
        value = float(a.flat[index if a.size > 1 else 0])
        return value * value if self.squared else value


def one_group(term: str, sides, scale: float) -> tuple[tuple[Share, ...], ...]:
    """The groups of a part that each side in `sides` scales by `scale` under one term."""
    return tuple((Share(term, side, scale),) for side in sides)


def summed(parts: tuple[Addend, ...], n: int, dt) -> np.ndarray:
    """The variance per element (flat, n of them, of type dt): the parts added in order."""
    uses: dict[int, int] = {}
    for part in parts:
        if part.source is not None and part.squared:
            uses[id(part.source)] = uses.get(id(part.source), 0) + 1
    squares: dict[tuple, np.ndarray] = {}  # a source squared once for the parts that share it
    var = None
    for part in parts:
        coef = part.coefficient
        width = part.width or dt
        if part.source is None:
            if var is None:
                var = np.zeros(n, dt)
            var += width(coef)
            continue
        key = (id(part.source), width)
        uses[id(part.source)] = left = uses.get(id(part.source), 1) - 1
        if part.squared:
            with np.errstate(over="ignore"):
                a = squares.pop(key, None) if left == 0 else squares.get(key)
                if a is None:
                    a = np.square(np.asarray(part.source, dtype=width).ravel())
                    if left > 0:
                        squares[key] = a
            fresh = left == 0
        else:
            a = np.asarray(part.source, dtype=width).ravel()
            fresh = False
        if coef != 1:
            a = np.multiply(a, width(coef), out=a if fresh else None)
            fresh = True
        if var is None:
            var = a if fresh and a.dtype == dt and a.size == n else np.array(np.broadcast_to(a, (n,)), dtype=dt)
        else:
            var += a
    return np.zeros(n, dt) if var is None else var


def shares_at(parts: tuple[Addend, ...], index: int) -> dict[tuple[str, str], float]:
    """Each named term's variance at element `index`, by (term, side)."""
    out: dict[tuple[str, str], float] = {}
    for part in parts:
        base = part.base_at(index)
        for group in part.groups:
            for share in group:
                if share.scale:
                    out[(share.term, share.side)] = out.get((share.term, share.side), 0.0) + share.scale * base
    return out


@dataclass(frozen=True)
class Breakdown:
    """A budget's terms at one element (its worst): (term, side, share of the variance there),
    largest first; the smallest matter too (what the budget would be without the largest)."""

    terms: tuple[tuple[str, str, float], ...] = ()

    @classmethod
    def of(cls, shares: dict[tuple[str, str], float], total: float) -> Breakdown:
        if not total > 0 or not math.isfinite(total):
            return cls()
        return cls(tuple(sorted(((t, s, v / total) for (t, s), v in shares.items() if v > 0), key=lambda r: -r[2])))

    @property
    def dominant(self) -> tuple[str, str] | None:
        return (self.terms[0][0], self.terms[0][1]) if self.terms else None

    def share_of(self, *terms: str) -> float:
        return sum(f for t, _, f in self.terms if t in terms)


def term_words(term: str, side: str, formats: dict) -> str:
    """A term in words, as a report says it."""
    fmt = formats.get(side, next(iter(formats.values()), "fp32") if len(set(formats.values())) == 1 else "fp32")
    who = f"{side}'s" if side else "both sides'"
    if term == INPUT_ROUNDING:
        return f"{who} rounding of products' inputs to {fmt.upper()}" if fmt != "fp32" else f"{who} input rounding"
    if term == STORED_FORMAT:
        return f"{who} output stored in {fmt.upper() if fmt in ('bf16', 'fp16') else 'float32'}"
    return _WORDS.get(term, "terms added by the caller").format(who=who)


_WORDS = {ACCUMULATION: "{who} fp32 accumulation of the matmul sums",  # the other terms in words (term_words)
          OBSERVED: "{who} own fp32 error against float64, measured",
          STAND_IN: "{who} fp32 error, taken to be torch's (not measured there)",
          CONDITION: "{who} rounding at the op's input, carried through its condition",
          CONVENTION: "conventions that differ by design", FLOOR: "float32's smallest normal value"}


def breakdown_words(breakdown: Breakdown, formats: dict, most: int = 2) -> str:
    """The largest terms in words with their shares: "paddle's rounding of ... (97%), ..."; a term
    on both sides is said once, for both (its shares summed), where both sides use one format."""
    by_term: dict[str, list] = {}
    for t, s, f in breakdown.terms:
        by_term.setdefault(t, []).append((s, f))
    one_format = len(set(formats.values())) <= 1
    said = []
    for t, sides in by_term.items():
        if len(sides) > 1 and (one_format or t not in (INPUT_ROUNDING, STORED_FORMAT)):
            said.append((sum(f for _, f in sides), term_words(t, "", formats)))
        else:
            said += [(f, term_words(t, s, formats)) for s, f in sides]
    said.sort(key=lambda x: -x[0])
    return ", ".join(f"{words} ({_percent(f)})" for f, words in said[:most] if f >= 0.01)


def _percent(f: float) -> str:
    return "over 99%" if f > 0.99 else f"{100 * f:.0f}%"
