"""Where paddle's own computation differs from torch's by design, as data: what differs and the paddle
version it was measured on (tests/unit/train/test_train_user_cases.py measures each again on the
paddle installed). The training checks replay paddle's rule where they budget it, and confirm it by
re-running where it explains a failure; the report says each one it met once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Divergence:
    """One computation paddle does otherwise than torch: `paddle` and `torch` say each side's rule."""

    name: str
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
        """One line of the report's notes."""
        return f"convention: {self.said()}'s {self.name} {self.paddle} (torch's {self.torch})"


BATCHNORM_VARIANCE = Divergence(
    "BatchNorm", "3.3.1", "updates the running variance with the biased batch variance (divided by n)",
    "with the unbiased one, divided by n - 1, over the n values of a channel")
CROSS_ENTROPY_IGNORED = Divergence(
    "cross_entropy", "3.3.1", "with a negative ignore_index (the default -100) and reduction 'mean' divides the "
    "summed loss by every label, the ignored ones included", "by the labels counted")
ADAMAX_EPSILON = Divergence(
    "Adamax", "3.3.1", "adds epsilon to the decayed infinity norm, u = max(beta2 u + eps, |g|)",
    "to the gradient, u = max(beta2 u, |g| + eps)")


def adamax_norm(u, g, beta2: float, eps: float, rule: str):
    """Adamax's infinity norm after a step from `u` on gradient `g` (numpy, float64), under the rule of
    `rule` ("paddle" or "torch")."""
    import numpy as np
    if rule == "paddle":
        return np.maximum(beta2 * u + eps, np.abs(g))
    return np.maximum(beta2 * u, np.abs(g) + eps)
