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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .precision import STORED_UNIT, U32, UNIT_ROUNDOFF

C_ROUND = 0.42  # rms relative rounding error of a real value, in units of u
KAPPA_FLOOR = 0.3
SEQUENTIAL_KAPPA = 2.0  # the other side's accumulation: a sequential sum's tail (see above)
MARGIN = 2.0
MIN_TAIL = 2.5


def tail(n: int) -> float:
    return max(math.sqrt(2.0 * math.log(max(n, 2))), MIN_TAIL)


@dataclass
class MatmulStats:
    """What the analytic model needs of a matmul layer: S2 per output element and K."""

    sum_sq: np.ndarray  # S2: per output element, the sum over the reduction of (x_k w_k)^2
    k: float


@dataclass
class Budget:
    var: np.ndarray  # expected error variance per output element, both sides combined (float32)
    formats: dict  # side -> format used for it

    @property
    def factor(self) -> float:
        return tail(self.var.size) * MARGIN

    def ratio(self, diff: np.ndarray) -> tuple[float, float]:
        """(ratio, budget at the worst element) for an elementwise |difference|."""
        diff = np.asarray(diff).reshape(self.var.shape)
        with np.errstate(over="ignore"):
            return self.ratio_of_squares(np.square(diff, dtype=self.var.dtype))

    def ratio_of_squares(self, q: np.ndarray) -> tuple[float, float]:
        """The same from the squared differences (float32 or var's dtype, laid out as var), which it
        overwrites."""
        if q.size == 0:
            return 0.0, 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            np.divide(q, self.var, out=q)
        worst = int(np.argmax(q))  # the first NaN, when there is one: over any budget
        top = float(q.flat[worst])
        if top == 0:
            return 0.0, self.scalar()
        ratio = float("inf") if math.isnan(top) else math.sqrt(top) / self.factor
        return ratio, float(math.sqrt(self.var.flat[worst])) * self.factor

    def scalar(self) -> float:
        """A typical tolerance: the rms sigma times the tail factor, for reports."""
        return float(math.sqrt(float(np.mean(self.var, dtype=np.float64)))) * self.factor


def make_budget(formats: dict, y32: np.ndarray, y64: np.ndarray, matmul: MatmulStats | None,
                rounding: dict | None = None, condition: np.ndarray | None = None) -> Budget:
    """Combine both sides. `formats` maps side -> format; `rounding` maps format -> the change of
    the float64 output, per element (laid out as y64), under that format's rounding (non-matmul
    layers)."""
    e_ref = np.subtract(y32, y64, dtype=np.float64).astype(np.float32)
    return budget_from_error(formats, y32, e_ref, matmul, rounding, condition)


def budget_from_error(formats: dict, y: np.ndarray, e_ref: np.ndarray, matmul: MatmulStats | None,
                      rounding: dict | None = None, condition: np.ndarray | None = None,
                      e_other: np.ndarray | None = None) -> Budget:
    """The same, given the torch layer's observed fp32 error e_ref = y32 - y64 (float32 is plenty).
    `condition` (elementwise layers): per element, how far the float64 output moves when the
    input moves by one unit of float32 rounding; each side's implementation may round there
    (torch's own observed error is one draw of that, and may be near 0 by chance). `e_other`
    (non-matmul layers): the other side's own observed fp32 error where it was measured (its
    kernels may reduce in another order); torch's stands in for it otherwise."""
    # means from float32 dot products and sums: a few units of u32, plenty for a budget. Squares
    # of values above about 1.8e19 overflow float32 (an infinite budget passes anything): there,
    # and where S2 itself overflowed, the budget is computed in float64
    s2_peak = _peak(matmul.sum_sq) if matmul is not None else 0.0
    if not math.isfinite(s2_peak):
        matmul = None  # the analytic model has no S2 to work with: the observed error stands in
    shape = np.shape(matmul.sum_sq) if matmul is not None else np.shape(e_ref)
    e_ref, y = np.ravel(e_ref), np.ravel(y)
    n = max(e_ref.size, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        # a value above WIDE puts the sum of the squares above WIDE^2 / 2 (or at inf) in any width: the
        # peaks are looked at only then
        e = e_ref.astype(np.float32, copy=False)
        e_sum = float(np.dot(e, e))
        wide = ((e_sum > WIDE * WIDE / 2 and _peak(e_ref) > WIDE) or (_sum_sq(y) > WIDE * WIDE / 2 and _peak(y) > WIDE)
                or (matmul is not None and s2_peak > WIDE * WIDE))
    dt = np.float64 if wide else np.float32
    if wide:
        e = e_ref.astype(dt, copy=False)
        e_sum = float(np.dot(e, e))
    e_ms = e_sum / n
    y2 = np.square(y, dtype=dt)
    rounding = rounding or {}
    if matmul is not None:
        s2 = matmul.sum_sq.astype(dt, copy=False).ravel()
        s2_mean = _mean(s2)
        acc_unit = C_ROUND * U32 * math.sqrt(max(matmul.k, 1.0) / 2.0)
        model_ms = acc_unit ** 2 * s2_mean
        kappa = max(math.sqrt(e_ms / model_ms), KAPPA_FLOOR) if model_ms > 0 else 1.0
        coef = 0.0
        for side, fmt in formats.items():
            k_side = kappa if side == "torch" else max(kappa, SEQUENTIAL_KAPPA)
            coef += (k_side * acc_unit) ** 2 + (math.sqrt(2.0) * C_ROUND * UNIT_ROUNDOFF[fmt]) ** 2
        var = np.multiply(s2, dt(coef), dtype=dt)
        const = 0.0
        # its result stored in each side's format (bf16 under AMP: measured on a GPU)
        y2 *= dt(sum(STORED_UNIT[fmt] ** 2 for fmt in formats.values()))
    else:
        var, const = _observed(formats, e, e_ms, y2, dt, rounding, condition, e_other)
        y2 *= dt(U32 * U32 * len(formats))
    var += y2
    var += dt(const + float(np.finfo(np.float32).tiny))  # never 0: no division by it
    return Budget(var.reshape(shape), dict(formats))


def _observed(formats: dict, e: np.ndarray, e_ms: float, y2: np.ndarray, dt, rounding: dict, condition,
              e_other) -> tuple[np.ndarray, float]:
    """(variance per element, constant) of a layer budgeted from observed errors: each side's own
    observed error squared, and its mean square (torch's e, mean square e_ms; the other side's e_other
    where it was measured), the condition per side, and the effect of a side's rounding in another
    format. Where the torch layer's own fp32 error is large (ill-conditioned elements, late time steps
    of a recurrence), the other side's is expected to be large too."""
    n = max(e.size, 1)
    other = None
    if e_other is not None and np.size(e_other) == e.size:
        other = np.asarray(e_other, dtype=dt).ravel()
    # how many sides take torch's error as their own, and how many their own measured one
    mine = sum(1 for side in formats if side == "torch" or other is None)
    theirs = len(formats) - mine
    var, const = None, 0.0
    if mine:
        var = np.square(e, dtype=dt)
        if mine > 1:
            var *= dt(mine)
        const += mine * e_ms
    if theirs:
        sq = np.square(other)
        if theirs > 1:
            sq *= dt(theirs)
        const += theirs * float(np.dot(other, other)) / n
        var = sq if var is None else np.add(var, sq, out=var)
    if var is None:
        var = np.zeros(e.shape, dt)
    if condition is not None:  # once per side
        cond2 = np.square(np.asarray(condition, dtype=dt).ravel())
        cond2 *= dt(len(formats))
        var += cond2
    y_ms = None
    for fmt in formats.values():  # a side in another format: its rounding's effect, per element and rms
        effect = rounding.get(fmt) if fmt != "fp32" else None
        if effect is None:
            continue
        with np.errstate(over="ignore"):
            sq = np.square(np.asarray(effect, dtype=dt).ravel())
        ms = float(np.mean(sq, dtype=np.float64)) if sq.size else 0.0
        const += ms
        if sq.size == var.size:
            var += sq
            # and in proportion to each element's own size, at the tensor's ratio of the two: a few
            # draws per element may all come out small where the effect is large (a probability
            # near 1), and it scales with the value it rounds
            if y_ms is None:
                y_ms = float(np.mean(y2, dtype=np.float64)) if y2.size else 0.0
            if y_ms > 0 and math.isfinite(ms / y_ms):
                var += y2 * dt(ms / y_ms)
    return var, const


WIDE = 1e18  # above this magnitude, squares and their sums may overflow float32


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
