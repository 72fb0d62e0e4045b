"""The expected-error budget of one layer.

Each side's expected error per output element is modelled from the arithmetic it
used, then the two sides are combined in quadrature:

* matmul layers (Linear, Conv, HF Conv1D), with products p_k = x_k w_k over a
  reduction of length K and S2 = sum_k p_k^2 computed from the real inputs and
  weights ((x*x) @ (w*w)):
      input rounding to unit u_f:   sqrt(2) * 0.42 * u_f * sqrt(S2)
      fp32 accumulation:            kappa * 0.42 * u32 * sqrt(K/2) * sqrt(S2)
  kappa calibrates the accumulation term to this machine: it is the observed
  error of the torch layer in fp32 against a float64 run on the same inputs,
  divided by the model's prediction (never below KAPPA_FLOOR, since the other
  side's kernels may sum in another order).
* every other layer (elementwise, norms, attention blocks, whole sub-networks):
      fp32 arithmetic:              the observed error of the torch layer in fp32 against
                                    float64 (its rms, and the element's own), and u32 * |y|
                                    for the output rounding
      input rounding to u_f:        the rms change of the float64 output when the
                                    layer's matmul inputs and weights are rounded to f
* the tolerance on the worst element is TAIL(N) * MARGIN standard deviations,
  TAIL(N) = sqrt(2 ln N) (the expected maximum of N normal errors, at least 2.5)
  and MARGIN = 2. ratio = max_i |d_i| / (TAIL * MARGIN * sigma_i): over budget when > 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .precision import U32, UNIT_ROUNDOFF

C_ROUND = 0.42  # rms relative rounding error of a real value, in units of u
KAPPA_FLOOR = 0.3
MARGIN = 2.0
MIN_TAIL = 2.5


def tail(n: int) -> float:
    return max(math.sqrt(2.0 * math.log(max(n, 2))), MIN_TAIL)


@dataclass
class MatmulStats:
    """What the analytic model needs of a matmul layer: S2 per output element and K."""

    s2: np.ndarray
    k: float


@dataclass
class Budget:
    sigma: np.ndarray  # expected error std per output element, both sides combined
    formats: dict  # side -> format used for it
    detail: dict = field(default_factory=dict)

    @property
    def tolerance(self) -> np.ndarray:
        return self.sigma * tail(self.sigma.size) * MARGIN

    def ratio(self, diff: np.ndarray) -> tuple[float, float]:
        """(ratio, budget at the worst element) for an elementwise |difference|."""
        diff = np.abs(np.asarray(diff, dtype=np.float64)).reshape(self.sigma.shape)
        if diff.size == 0:
            return 0.0, 0.0
        tol = self.tolerance
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(diff == 0, 0.0, diff / tol)
        r = np.where(np.isnan(r), np.inf, r)
        if not r.any():
            return 0.0, self.scalar()
        worst = int(np.argmax(r))
        return float(r.ravel()[worst]), float(tol.ravel()[worst])

    def scalar(self) -> float:
        """A typical tolerance: the rms sigma times the tail factor, for reports."""
        return float(np.sqrt(np.mean(self.sigma ** 2)) * tail(self.sigma.size) * MARGIN)


def side_sigma(fmt: str, y64: np.ndarray, e_ref: np.ndarray, e_ref_rms: float, matmul: MatmulStats | None,
               kappa: float, rounding_rms: float | None) -> np.ndarray:
    """Expected error std per element for one side computing in `fmt`."""
    out_round = U32 * np.abs(y64)
    if matmul is not None:
        root = np.sqrt(matmul.s2)
        acc = kappa * C_ROUND * U32 * math.sqrt(max(matmul.k, 1.0) / 2.0) * root
        inp = math.sqrt(2.0) * C_ROUND * UNIT_ROUNDOFF[fmt] * root
        return np.sqrt(acc ** 2 + inp ** 2 + out_round ** 2)
    inp = rounding_rms if (fmt != "fp32" and rounding_rms is not None) else 0.0
    # where the torch layer's own fp32 error is large (ill-conditioned elements, late time steps
    # of a recurrence), the other side's is expected to be large too
    return np.sqrt(e_ref_rms ** 2 + e_ref ** 2 + inp ** 2 + out_round ** 2)


def make_budget(formats: dict, y32: np.ndarray, y64: np.ndarray, matmul: MatmulStats | None,
                rounding_rms: dict | None = None) -> Budget:
    """Combine both sides. `formats` maps side -> format; `rounding_rms` maps format -> the rms
    change of the float64 output under that format's rounding (non-matmul layers)."""
    y32 = np.asarray(y32, dtype=np.float64)
    y64 = np.asarray(y64, dtype=np.float64)
    e_ref = y32 - y64
    e_ref_rms = float(np.sqrt(np.mean(e_ref ** 2))) if e_ref.size else 0.0
    kappa = 1.0
    if matmul is not None:
        model = C_ROUND * U32 * math.sqrt(max(matmul.k, 1.0) / 2.0) * np.sqrt(matmul.s2)
        model_rms = float(np.sqrt(np.mean(model ** 2))) if model.size else 0.0
        kappa = max(e_ref_rms / model_rms, KAPPA_FLOOR) if model_rms > 0 else 1.0
    rounding_rms = rounding_rms or {}
    sides = {side: side_sigma(fmt, y64, e_ref, e_ref_rms, matmul, kappa, rounding_rms.get(fmt))
             for side, fmt in formats.items()}
    sigma = np.sqrt(sum(s ** 2 for s in sides.values()))
    sigma = np.maximum(sigma, np.finfo(np.float64).tiny)
    detail = {"kappa": kappa, "fp32_observed_rms": e_ref_rms, "model": "matmul" if matmul is not None else "observed",
              "sigma_rms": {side: float(np.sqrt(np.mean(s ** 2))) for side, s in sides.items()}}
    return Budget(sigma, dict(formats), detail)
