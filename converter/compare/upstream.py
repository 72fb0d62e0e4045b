"""Where paddle's own computation differs from torch's by design, as data: what differs and the paddle
version it was measured on (tests/unit/train/test_train_user_cases.py measures each again on the
paddle installed). The checks replay paddle's rule where they budget it, and confirm it by
re-running where it explains a failure; the report says each one it met once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Divergence:
    """One computation paddle does otherwise than torch: `paddle` says what paddle does (a predicate
    of "paddle"), `torch` what torch does instead."""

    version: str  # the paddle version it was measured on
    paddle: str
    torch: str

    def said(self) -> str:
        """'paddle 3.3.1' where that is the version installed; else the installed one, with the version
        this was measured on."""
        from ..lazy import import_paddle
        installed = import_paddle().__version__
        return f"paddle {installed}" if installed == self.version else f"paddle {installed} (measured on {self.version})"

    def line(self) -> str:
        """What it is, in one sentence."""
        return f"{self.said()} {self.paddle} (torch: {self.torch})"


BATCHNORM_VARIANCE = Divergence(
    "3.3.1", "updates BatchNorm's running variance with the biased batch variance",
    "the unbiased one, n/(n-1) times it over the n values of a channel")
CROSS_ENTROPY_IGNORED = Divergence(
    "3.3.1", "divides cross_entropy's summed loss by every label, the ignored ones included, under a negative "
    "ignore_index (the default -100) and reduction 'mean'", "by the labels counted")
ADAMAX_EPSILON = Divergence(
    "3.3.1", "adds Adamax's epsilon to the decayed infinity norm, u = max(beta2 u + eps, |g|)",
    "to the gradient, u = max(beta2 u, |g| + eps)")


def adamax_norm(u, g, beta2: float, eps: float, rule: str):
    """Adamax's infinity norm after a step from `u` on gradient `g` (numpy, float64), under the rule of
    `rule` ("paddle" or "torch")."""
    import numpy as np
    if rule == "paddle":
        return np.maximum(beta2 * u + eps, np.abs(g))
    return np.maximum(beta2 * u, np.abs(g) + eps)
