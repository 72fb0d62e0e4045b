"""Results of the training checks as data; report.py renders them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..diagnosis import Diagnosis

PHASES = ("structure", "loss", "backward", "lr", "optimizer", "steps")
LR_REL = 1e-6  # learning rates are float64 on both sides; a schedule bug moves them by far more


def number(value: float | None) -> float | None:
    """A number for JSON: NaN and infinities have no JSON spelling (Python writes NaN and Infinity,
    which strict parsers refuse), so they are null; the row's verdict says what they meant."""
    return value if value is None or math.isfinite(value) else None


def verdict_of(ratio: float | None) -> str:
    """A compared value's verdict: within its budget or not; 'not compared' where nothing was."""
    if ratio is None:
        return "not compared"
    return "fail" if math.isnan(ratio) or ratio > 1.0 else "pass"


@dataclass
class Row:
    """One comparison: a tensor or value of one phase (and step), against its budget."""

    phase: str
    step: int | None
    torch: str
    paddle: str
    ratio: float | None
    max_abs: float | None = None
    budget: float | None = None
    note: str = ""

    @property
    def bad(self) -> bool:
        return verdict_of(self.ratio) == "fail"

    def to_json(self) -> dict:
        return {"phase": self.phase, "step": self.step, "torch": self.torch, "paddle": self.paddle,
                "verdict": verdict_of(self.ratio), "ratio": number(self.ratio), "max_abs": number(self.max_abs),
                "budget": number(self.budget), "note": self.note}


@dataclass
class StepRow:
    step: int
    loss_torch: float
    loss_paddle: float
    lr_torch: float
    lr_paddle: float
    band: float

    @property
    def ratio(self) -> float:
        d = abs(self.loss_paddle - self.loss_torch)
        if math.isnan(d):
            return float("inf")
        return d / self.band if self.band > 0 else (0.0 if d == 0 else float("inf"))

    @property
    def lr_ratio(self) -> float:
        return abs(self.lr_paddle - self.lr_torch) / (LR_REL * abs(self.lr_torch) + 1e-15)

    @property
    def verdict(self) -> str:
        """pass where the loss is within the band and the learning rate is torch's."""
        return "pass" if verdict_of(self.ratio) == "pass" and verdict_of(self.lr_ratio) == "pass" else "fail"

    def to_json(self) -> dict:
        return {"step": self.step, "loss_torch": number(self.loss_torch), "loss_paddle": number(self.loss_paddle),
                "lr_torch": number(self.lr_torch), "lr_paddle": number(self.lr_paddle), "band": number(self.band),
                "verdict": self.verdict}


TrainDiagnosis = Diagnosis  # the forward check's: a layer (or parameter), a cause, a hint


@dataclass
class TrainReport:
    rows: list  # every Row, phases in PHASES order, steps in order within a phase
    steps: list  # StepRow per step
    first_bad: Row | None
    diagnosis: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    optimizer: str = ""  # paddle's optimizer, as built
    formats: dict = field(default_factory=dict)
    optimizer_code: str | None = None  # torch's optimizer translated, as paddle code

    @property
    def verdict(self) -> str:
        return "fail" if self.first_bad is not None else "pass"

    @property
    def exit_code(self) -> int:
        return 1 if self.first_bad is not None else 0

    def worst(self, phase: str) -> Row | None:
        rows = [r for r in self.rows if r.phase == phase and r.ratio is not None]
        return max(rows, key=lambda r: r.ratio) if rows else None

    def to_json(self) -> dict:
        fb = self.first_bad
        return {"verdict": self.verdict,
                "first_bad": None if fb is None else {"phase": fb.phase, "torch": fb.torch, "paddle": fb.paddle,
                                                      "step": fb.step, "ratio": number(fb.ratio)},
                "steps": [s.to_json() for s in self.steps],
                "diagnosis": [d.to_json() for d in self.diagnosis],
                "checks": [r.to_json() for r in self.rows],
                "optimizer": self.optimizer, "formats": self.formats, "notes": list(self.notes)}
