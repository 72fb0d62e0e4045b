"""Results of the training checks as data, and what their rows say (the layer of a per-layer
backward row, a factor paddle's gradient is torch's times, the backward's culprit); report.py
renders them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..compare.budget import MARGIN
from ..diagnosis import Diagnosis
from ..paths import is_under
from ..results import Verdict, finite_or_null

PHASES = ("structure", "loss", "backward", "lr", "optimizer", "steps")
# a row over budget by no more than the budget's own margin is a marginal failure: the earliest phase
# failing beyond it is the culprit, ahead of an earlier phase that fails only marginally
MARGINAL = MARGIN
FINDINGS_ONLY = ("structure",)  # phases whose rows are findings (none found is a pass), not comparisons
LR_REL = 1e-6  # learning rates are float64 on both sides; a schedule bug moves them by far more
NOT_COMPARED = "not compared"  # how the training JSON spells Verdict.NOT_JUDGED
# what the backward's rows say in their notes
FORWARD_DIFFERS = " (its forward differs too)"
ZERO = "paddle's gradient is zero; "
SCALED = "paddle's gradient is torch's times "  # then the factor and "; "
LOCAL = "local backward of "


def _spelled(verdict: Verdict) -> str:
    return NOT_COMPARED if verdict is Verdict.NOT_JUDGED else verdict.value


def _read_ratio(body: dict) -> float | None:
    """A ratio read back: JSON writes an infinite one as null, and the verdict says it failed."""
    return float("inf") if body["ratio"] is None and body["verdict"] == Verdict.FAIL else body["ratio"]


@dataclass(frozen=True)
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
    def verdict(self) -> Verdict:
        return Verdict.of_ratio(self.ratio)

    @property
    def bad(self) -> bool:
        return self.verdict is Verdict.FAIL

    @property
    def clearly_bad(self) -> bool:
        """Over budget by more than the budget's margin (a NaN or infinite ratio included)."""
        return self.bad and not self.ratio <= MARGINAL

    def __bool__(self) -> bool:
        return bool(self.verdict)

    def to_json(self) -> dict:
        return finite_or_null({"phase": self.phase, "step": self.step, "torch": self.torch, "paddle": self.paddle,
                               "verdict": _spelled(self.verdict), "ratio": self.ratio, "max_abs": self.max_abs,
                               "budget": self.budget, "note": self.note})

    @classmethod
    def from_json(cls, body: dict) -> Row:
        return cls(body["phase"], body["step"], body["torch"], body["paddle"], _read_ratio(body), body["max_abs"],
                   body["budget"], body["note"])


@dataclass(frozen=True)
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
    def verdict(self) -> Verdict:
        """PASS where the loss is within the band and the learning rate is torch's."""
        both = (Verdict.of_ratio(self.ratio), Verdict.of_ratio(self.lr_ratio))
        return Verdict.PASS if all(v is Verdict.PASS for v in both) else Verdict.FAIL

    def __bool__(self) -> bool:
        return bool(self.verdict)

    def to_json(self) -> dict:
        return finite_or_null({"step": self.step, "loss_torch": self.loss_torch, "loss_paddle": self.loss_paddle,
                               "lr_torch": self.lr_torch, "lr_paddle": self.lr_paddle, "band": self.band,
                               "verdict": self.verdict})

    @classmethod
    def from_json(cls, body: dict) -> StepRow:
        """A step read back; a loss JSON wrote as null (NaN or infinite) comes back as NaN."""
        value = lambda key: float("nan") if body[key] is None else body[key]
        return cls(body["step"], value("loss_torch"), value("loss_paddle"), value("lr_torch"), value("lr_paddle"),
                   value("band"))


def scale_in(row) -> str | None:
    """The factor a row's note says paddle's gradient is torch's times, as written there; else None."""
    _, found, rest = row.note.partition(SCALED)
    return rest.partition(";")[0] if found else None


def layer_of(row) -> str:
    """The layer of a row of the per-layer backward ('' for another row)."""
    _, found, layer = row.note.partition(LOCAL)
    return layer.removesuffix(FORWARD_DIFFERS) if found else ""


def culprit(rows: list):
    """The first bad local row in backward order whose layer has no bad paired sublayer (when the
    sublayers agree but their parent does not, the parent's own code is at fault); else the first bad
    row (an end-to-end gradient)."""
    bad = [r for r in rows if r.phase == "backward" and r.bad]
    local = [r for r in bad if layer_of(r)]
    bad_layers = {layer_of(r) for r in local}
    for r in local:
        here = layer_of(r)
        path = "" if here == "<model>" else here
        if not any(o != here and is_under("" if o == "<model>" else o, path) for o in bad_layers):
            return r
    return bad[0] if bad else None




@dataclass(frozen=True)
class PhaseVerdict:
    """One phase judged on its own rows (its own teacher-forced inputs): pass, fail, marginal (every
    row over budget within the budget's margin) or not compared (no rows, where rows are comparisons)."""

    phase: str
    rows: list

    @property
    def verdict(self) -> Verdict:
        judged = [r.verdict for r in self.rows if r.verdict is not Verdict.NOT_JUDGED]
        if not judged:
            return Verdict.PASS if self.phase in FINDINGS_ONLY else Verdict.NOT_JUDGED
        return Verdict.of_all(judged)

    @property
    def marginal(self) -> bool:
        return self.verdict is Verdict.FAIL and not any(r.clearly_bad for r in self.rows)

    @property
    def label(self) -> str:
        return "marginal" if self.marginal else _spelled(self.verdict)

    @property
    def worst(self) -> Row | None:
        rows = [r for r in self.rows if r.ratio is not None]
        return max(rows, key=lambda r: r.ratio) if rows else None

    def to_json(self) -> dict:
        w = self.worst
        return finite_or_null({"phase": self.phase, "verdict": self.label, "checks": len(self.rows),
                               "over_budget": sum(r.bad for r in self.rows),
                               "worst": None if w is None else {"torch": w.torch, "paddle": w.paddle, "step": w.step,
                                                                "ratio": w.ratio}})


@dataclass(frozen=True)
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
    def verdict(self) -> Verdict:
        return Verdict.FAIL if self.first_bad is not None else Verdict.PASS

    def __bool__(self) -> bool:
        return bool(self.verdict)

    @property
    def exit_code(self) -> int:
        return 0 if self else 1

    def worst(self, phase: str) -> Row | None:
        return self.phase(phase).worst

    def phase(self, phase: str) -> PhaseVerdict:
        return PhaseVerdict(phase, [r for r in self.rows if r.phase == phase])

    @property
    def phases(self) -> list:
        """Each phase's own verdict, in PHASES order."""
        return [self.phase(p) for p in PHASES]

    def to_json(self) -> dict:
        fb = self.first_bad
        return {"verdict": self.verdict,
                "first_bad": None if fb is None else {"phase": fb.phase, "torch": fb.torch, "paddle": fb.paddle,
                                                      "step": fb.step, "ratio": finite_or_null(fb.ratio)},
                "phases": [p.to_json() for p in self.phases],
                "steps": [s.to_json() for s in self.steps],
                "diagnosis": [d.to_json() for d in self.diagnosis],
                "checks": [r.to_json() for r in self.rows],
                "optimizer": self.optimizer, "formats": self.formats, "notes": list(self.notes)}

    @classmethod
    def from_json(cls, body: dict) -> TrainReport:
        """The TrainReport its JSON was written from (its optimizer code, which the JSON does not
        hold, stays None)."""
        rows = [Row.from_json(r) for r in body["checks"]]
        said = body["first_bad"]
        first = None
        if said is not None:
            key = (said["phase"], said["torch"], said["paddle"], said["step"])
            first = next((r for r in rows if r.bad and (r.phase, r.torch, r.paddle, r.step) == key), None)
            if first is None:  # a row the JSON names but does not list: as it names it
                first = Row(said["phase"], said["step"], said["torch"], said["paddle"], _read_ratio(
                    {"ratio": said["ratio"], "verdict": Verdict.FAIL}))
        return cls(rows, [StepRow.from_json(s) for s in body["steps"]], first,
                   [Diagnosis.from_json(d) for d in body["diagnosis"]], list(body["notes"]), body["optimizer"],
                   dict(body["formats"]))
