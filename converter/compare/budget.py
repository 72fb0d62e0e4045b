"""The expected-error budget of one layer.

Each side's expected error per output element is modelled from the arithmetic it
used, then the two sides are combined in quadrature:

* matmul layers (Linear, Conv, HF Conv1D), with products p_k = x_k w_k over a
  reduction of length K and S2 = sum_k p_k^2 computed from the real inputs and
  weights ((x*x) @ (w*w)):
      input rounding to unit u_f:   sqrt(2) * 0.42 * u_f * sqrt(S2)
      fp32 accumulation:            kappa * 0.42 * u32 * sqrt(K/2) * sqrt(S2)
      result rounding:              u_s * |y|, u_s the unit of the format the result is stored
                                    in (fp32 for TF32; bf16/fp16 kernels return their format)
  kappa calibrates the accumulation term: for torch's side it is the observed error
  of the torch layer in fp32 against a float64 run on the same inputs, divided by the
  model's prediction (never below KAPPA_FLOOR); the other side's kernels are not
  observed and may sum in another order, so its kappa is at least SEQUENTIAL_KAPPA:
  a sequential sum's rms is the model's own (kappa 1.0, measured 0.997 at K = 1536;
  blocked kernels give 0.26 at K = 6144), but its worst element lies further out than
  a normal error's (over 6144 elements, 18 draws of normal inputs at K = 256, 1536 and
  6144: 6.0 to 9.8 model units, where a normal error would reach 4.2), since each
  element's error grows with its own partial sums; at 2.0 the worst of them stays at
  0.58 of the budget, whatever torch's own kappa.
* every other layer (elementwise, norms, attention blocks, whole sub-networks):
      fp32 arithmetic:              the observed error of the torch layer in fp32 against
                                    float64 (its rms, and the element's own), and u32 * |y|
                                    for the output rounding
      input rounding to u_f:        the change of the float64 output when every product in
                                    the layer rounds its inputs to f, per element and its rms
                                    (a softmax passes a logit's error on in proportion to the
                                    probability: the effect is far from uniform)
* the tolerance on the worst element is TAIL(N) * MARGIN standard deviations,
  TAIL(N) = sqrt(2 ln N) (the expected maximum of N normal errors, at least 2.5)
  and MARGIN = 2. ratio = max_i |d_i| / (TAIL * MARGIN * sigma_i): over budget when > 1.

A Budget holds these terms by name (budget_terms.py): `budget_for` picks them for each kind of
row (a layer's own output, an input a parent's code computed, outputs end to end, a training
comparison), and the Budget says which of them dominated at its worst element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .budget_terms import (ACCUMULATION, CONDITION, CONVENTION, FLOOR, INPUT_ROUNDING, OBSERVED, STAND_IN,
                           STORED_FORMAT, Breakdown, Addend, Share, one_group, shares_at, summed)
from .precision import STORED_UNIT, U32, UNIT_ROUNDOFF

C_ROUND = 0.42  # rms relative rounding error of a real value, in units of u
KAPPA_FLOOR = 0.3
SEQUENTIAL_KAPPA = 2.0  # the other side's accumulation: a sequential sum's tail (see above)
MARGIN = 2.0
MIN_TAIL = 2.5
WIDE = 1e18  # above this magnitude, squares and their sums may overflow float32

# the kinds of row a budget is made for (budget_for)
LAYER = "layer"  # a layer's own (teacher-forced) output
INPUT = "input"  # an input a parent's own code computed for its child
END_TO_END = "end to end"  # outputs as both models computed them, free-running
TRAINING = "training"  # a training comparison: a loss, a gradient, a parameter after a step
ROWS = (LAYER, INPUT, END_TO_END, TRAINING)


def tail(n: int) -> float:
    return max(math.sqrt(2.0 * math.log(max(n, 2))), MIN_TAIL)


@dataclass
class MatmulStats:
    """What the analytic model needs of a matmul layer: S2 per output element and K."""

    sum_sq: np.ndarray  # S2: per output element, the sum over the reduction of (x_k w_k)^2
    k: float


@dataclass(frozen=True)
class Judgement:
    """A difference judged against a budget: the ratio, the tolerance at the worst element, and
    the budget's terms there."""

    ratio: float
    tolerance: float
    terms: Breakdown = Breakdown()


class Budget:
    """The expected error per output element of one row, as a sum of named terms (`parts`, see
    budget_terms.py) for the formats each side used; `var` is their sum per element (both sides
    combined), `observed` torch's own fp32 error against float64 as the budget was given it. Its
    attributes are set once, and `var` is read-only: a further term is one of budget_for's."""

    __slots__ = ("parts", "formats", "observed", "var")

    def __init__(self, parts, formats: dict, shape, dtype, observed: np.ndarray | None = None):
        parts = tuple(parts)
        for name, value in (("parts", parts), ("formats", dict(formats)), ("observed", observed),
                            ("var", summed(parts, int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape))):
            object.__setattr__(self, name, value)
        self.var.setflags(write=False)

    def __setattr__(self, name, value):
        raise AttributeError(f"a Budget's {name} is set once, when it is made")

    def __delattr__(self, name):
        raise AttributeError(f"a Budget's {name} is set once, when it is made")

    @property
    def factor(self) -> float:
        return tail(self.var.size) * MARGIN

    def ratio(self, diff: np.ndarray) -> tuple[float, float]:
        """(ratio, budget at the worst element) for an elementwise |difference|."""
        judged = self.judge(diff)
        return judged.ratio, judged.tolerance

    def judge(self, diff: np.ndarray) -> Judgement:
        """The Judgement of an elementwise |difference|: ratio, tolerance and the terms at the worst element."""
        diff = np.asarray(diff).reshape(self.var.shape)
        with np.errstate(over="ignore"):
            return self.judge_squares(np.square(diff, dtype=self.var.dtype))

    def judge_squares(self, q: np.ndarray) -> Judgement:
        """judge() from the squared differences (float32 or var's dtype, laid out as var), which it overwrites."""
        ratio, tolerance, worst = self._worst(q)
        return Judgement(ratio, tolerance, self.terms_at(worst) if worst is not None else Breakdown())

    def _worst(self, q: np.ndarray) -> tuple[float, float, int | None]:
        if q.size == 0:
            return 0.0, 0.0, None
        with np.errstate(over="ignore", invalid="ignore"):
            np.divide(q, self.var, out=q)
        worst = int(np.argmax(q))  # the first NaN, when there is one: over any budget
        top = float(q.flat[worst])
        if top == 0:
            return 0.0, self.scalar(), None
        ratio = float("inf") if math.isnan(top) else math.sqrt(top) / self.factor
        return ratio, float(math.sqrt(self.var.flat[worst])) * self.factor, worst

    def scalar(self) -> float:
        """A typical tolerance: the rms sigma times the tail factor, for reports."""
        return float(math.sqrt(float(np.mean(self.var, dtype=np.float64)))) * self.factor

    def terms_at(self, index: int) -> Breakdown:
        """Each named term's share of the variance at element `index` (flat), largest first."""
        return Breakdown.of(shares_at(self.parts, index), float(self.var.flat[index]))


def budget_for(row: str, formats: dict, y: np.ndarray, e_ref: np.ndarray, matmul: MatmulStats | None = None,
               rounding: dict | None = None, condition: np.ndarray | None = None, e_other: np.ndarray | None = None,
               conventions=None) -> Budget:
    """The budget of one row of kind `row` (ROWS), its terms picked from what was measured:
    `formats` side -> format; `y` torch's value; `e_ref` torch's fp32 error against float64 (either
    sign); `matmul` (a layer's own output): S2 and K, for the analytic terms; `rounding`: format ->
    the change of the float64 value per element (laid out as y) under that format's rounding;
    `condition`: per element, how far the float64 value moves when its input moves by one unit of
    float32 rounding (each side's implementation may round there: torch's own observed error is one
    draw of that, and may be near 0 by chance); `e_other`: the other side's own fp32 error where it
    was measured (its kernels may reduce in another order; torch's stands in for it otherwise).
    TRAINING rows add the condition's mean square to every element (a reference that is not
    float64 inside: one draw per element) and `conventions`, a further sigma per element (or one for
    every element) for conventions that differ by design."""
    if row not in ROWS:
        raise ValueError(f"a budget is made for one of {', '.join(ROWS)} rows, not {row!r}")
    if matmul is not None and row != LAYER:
        raise ValueError(f"the analytic matmul terms are a layer's own output's, not a {row} row's")
    # means from float32 dot products and sums: a few units of u32, plenty for a budget. Squares
    # of values above about 1.8e19 overflow float32 (an infinite budget passes anything): there,
    # and where S2 itself overflowed, the budget is computed in float64
    s2_peak = _peak(matmul.sum_sq) if matmul is not None else 0.0
    if not math.isfinite(s2_peak):
        matmul = None  # the analytic model has no S2 to work with: the observed error stands in
    shape = np.shape(matmul.sum_sq) if matmul is not None else np.shape(e_ref)
    flat_e, flat_y = np.ravel(e_ref), np.ravel(y)
    n = max(flat_e.size, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        # a value above WIDE puts the sum of the squares above WIDE^2 / 2 (or at inf) in any width: the
        # peaks are looked at only then
        e = flat_e.astype(np.float32, copy=False)
        e_sum = float(np.dot(e, e))
        wide = ((e_sum > WIDE * WIDE / 2 and _peak(flat_e) > WIDE)
                or (_sum_sq(flat_y) > WIDE * WIDE / 2 and _peak(flat_y) > WIDE)
                or (matmul is not None and s2_peak > WIDE * WIDE))
    dt = np.float64 if wide else np.float32
    if wide:
        e = flat_e.astype(dt, copy=False)
        e_sum = float(np.dot(e, e))
    e_ms = e_sum / n
    if matmul is not None:
        parts, constants = _matmul_terms(formats, matmul, e_ms, flat_y, dt)
    else:
        parts, constants = _observed_terms(formats, e, e_ms, flat_y, dt, rounding or {}, condition, e_other)
    parts.append(Addend(None, False, tuple((c,) for c in constants)
                      + ((Share(FLOOR, "", float(np.finfo(np.float32).tiny)),),)))  # never 0: no division by it
    if row == TRAINING:
        parts += _training_terms(formats, condition, conventions)
    return Budget(parts, formats, shape, dt, observed=e_ref)


def _matmul_terms(formats: dict, matmul: MatmulStats, e_ms: float, y: np.ndarray, dt) -> tuple[list, list]:
    """A matmul layer's parts: each side's accumulation and input rounding on S2 (torch's
    accumulation calibrated by its observed error, the other side's at least SEQUENTIAL_KAPPA),
    and its result stored in each side's format (bf16 under AMP: measured on a GPU)."""
    s2_mean = _mean(matmul.sum_sq.astype(dt, copy=False).ravel())
    acc_unit = C_ROUND * U32 * math.sqrt(max(matmul.k, 1.0) / 2.0)
    model_ms = acc_unit ** 2 * s2_mean
    kappa = max(math.sqrt(e_ms / model_ms), KAPPA_FLOOR) if model_ms > 0 else 1.0
    kappas = {side: kappa if side == "torch" else max(kappa, SEQUENTIAL_KAPPA) for side in formats}
    on_s2 = tuple((Share(ACCUMULATION, side, (kappas[side] * acc_unit) ** 2),
                   Share(INPUT_ROUNDING, side, (math.sqrt(2.0) * C_ROUND * UNIT_ROUNDOFF[fmt]) ** 2))
                  for side, fmt in formats.items())
    stored = tuple((Share(STORED_FORMAT, side, STORED_UNIT[fmt] ** 2),) for side, fmt in formats.items())
    return [Addend(matmul.sum_sq, False, on_s2), Addend(y, True, stored)], []


def _observed_terms(formats: dict, e: np.ndarray, e_ms: float, y: np.ndarray, dt, rounding: dict, condition,
                    e_other) -> tuple[list, list]:
    """(parts, constant shares) of a row budgeted from observed errors: each side's own observed
    error squared, and its mean square (torch's e, mean square e_ms; the other side's e_other
    where it was measured), the condition per side, and the effect of a side's rounding in another
    format, per element and in proportion to each element's own size; the output's float32
    rounding per side. Where the torch layer's own fp32 error is large (ill-conditioned elements,
    late time steps of a recurrence), the other side's is expected to be large too."""
    n = max(e.size, 1)
    other = None
    if e_other is not None and np.size(e_other) == e.size:
        other = np.asarray(e_other, dtype=dt).ravel()
    # the sides that take torch's error as their own, and those with their own measured one
    mine = [side for side in formats if side == "torch" or other is None]
    theirs = [side for side in formats if side not in mine]
    parts, constants = [], []
    if mine:
        parts.append(Addend(e, True, tuple((Share(OBSERVED if side == "torch" else STAND_IN, side, 1.0),)
                                         for side in mine)))
        constants += [Share(OBSERVED if side == "torch" else STAND_IN, side, e_ms) for side in mine]
    if theirs:
        parts.append(Addend(other, True, one_group(OBSERVED, theirs, 1.0)))
        constants += [Share(OBSERVED, side, float(np.dot(other, other)) / n) for side in theirs]
    if condition is not None:  # once per side
        parts.append(Addend(np.ravel(condition), True, one_group(CONDITION, formats, 1.0)))
    y_ms = None
    for side, fmt in formats.items():  # a side in another format: its rounding's effect, per element and rms
        effect = rounding.get(fmt) if fmt != "fp32" else None
        if effect is None:
            continue
        with np.errstate(over="ignore"):
            sq = np.square(np.asarray(effect, dtype=dt).ravel())
        ms = float(np.mean(sq, dtype=np.float64)) if sq.size else 0.0
        constants.append(Share(INPUT_ROUNDING, side, ms))
        if sq.size == e.size:
            parts.append(Addend(np.ravel(effect), True, one_group(INPUT_ROUNDING, [side], 1.0)))
            # and in proportion to each element's own size, at the tensor's ratio of the two: a few
            # draws per element may all come out small where the effect is large (a probability
            # near 1), and it scales with the value it rounds
            if y_ms is None:
                y_ms = float(np.mean(np.square(y, dtype=dt), dtype=np.float64)) if y.size else 0.0
            if y_ms > 0 and math.isfinite(ms / y_ms):
                parts.append(Addend(y, True, one_group(INPUT_ROUNDING, [side], ms / y_ms)))
    parts.append(Addend(y, True, one_group(STORED_FORMAT, formats, U32 * U32)))
    return parts, constants


def _training_terms(formats: dict, condition, conventions) -> list:
    """What a training row adds, in float32: the condition's mean square to every element, once
    per side (one draw per element, as e_ref's mean square joins every element), and the
    conventions' sigma per element."""
    parts = []
    if condition is not None and np.size(condition):
        ms = float(np.mean(np.square(condition, dtype=np.float64)))
        parts.append(Addend(None, False, one_group(CONDITION, formats, ms), np.float32))
    if conventions is not None:
        conventions = np.asarray(conventions, dtype=np.float32)
        if conventions.ndim or conventions:
            parts.append(Addend(conventions, True, one_group(CONVENTION, [""], 1.0), np.float32))
    return parts


def make_budget(formats: dict, y32: np.ndarray, y64: np.ndarray, matmul: MatmulStats | None,
                rounding: dict | None = None) -> Budget:
    """A layer's budget from torch's fp32 and float64 outputs (see budget_for). `rounding` maps
    format -> the change of the float64 output, per element (laid out as y64), under that
    format's rounding (non-matmul layers)."""
    e_ref = np.subtract(y32, y64, dtype=np.float64).astype(np.float32)
    return budget_for(LAYER, formats, y32, e_ref, matmul, rounding)


def own_errors(reference_error, difference) -> dict[str, float | None]:
    """Each side's largest error against the float64 reference, from `reference_error` (float64
    less torch's float32) and `difference` (paddle's value less torch's): torch's is the first,
    paddle's the difference less it (None where the two do not fit). Elements that are not finite
    are left out."""
    r = np.asarray(reference_error)
    d = np.asarray(difference)
    with np.errstate(invalid="ignore", over="ignore"):
        paddle = _finite_peak(np.subtract(d, r.reshape(d.shape))) if d.size == r.size else None
    return {"torch": _finite_peak(r), "paddle": paddle}


def _finite_peak(a: np.ndarray) -> float:
    """max |a| over its finite elements (0 where there are none)."""
    peak = _peak(a)
    if math.isfinite(peak):
        return peak
    a = a[np.isfinite(a)]
    return _peak(a)


def _peak(a) -> float:
    """max |a| (inf or nan where a holds one), without a temporary the size of a."""
    a = np.asarray(a)
    return max(float(np.max(a)), -float(np.min(a))) if a.size else 0.0


def _sum_sq(a: np.ndarray) -> float:
    """The sum of the squares of `a`'s elements, in its width (float32 at least): inf where one overflows."""
    a = a if a.dtype in (np.float32, np.float64) else a.astype(np.float32)
    return float(np.dot(a, a)) if a.size else 0.0


def _mean(a: np.ndarray) -> float:
    return float(np.add.reduce(a, dtype=a.dtype)) / a.size if a.size else 0.0
