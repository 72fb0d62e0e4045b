"""What verify-port found, composed: the forward check's Report and, when asked, the training
checks' TrainReport, one object with one verdict, rendered to text, JSON and HTML by one
function each, and read back from its JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .results import Verdict, finite_or_null

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from .train.result import TrainReport
    from .verify.report import Report


@dataclass
class PortReport:
    """`forward`, the forward check's Report (every layer against its budget), and `train`, the
    TrainReport of the training checks when they ran (else None). It passes, and is truthy, when
    both pass; `to_json()` is what verify-port --json writes (the forward report, with the training
    one under "train"), and `PortReport.from_json` reads it back."""

    forward: Report
    train: TrainReport | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict.of_all(part.verdict for part in self.parts())

    def parts(self) -> list:
        return [self.forward] + ([self.train] if self.train is not None else [])

    def __bool__(self) -> bool:
        return bool(self.verdict)

    @property
    def exit_code(self) -> int:
        return 0 if self else 1

    def to_json(self) -> dict:
        body = self.forward.to_json()
        return body if self.train is None else dict(body, train=self.train.to_json())

    @classmethod
    def from_json(cls, body: dict) -> PortReport:
        from .train.result import TrainReport
        from .verify.report import Report
        train = body.get("train")
        return cls(Report.from_json(body), None if train is None else TrainReport.from_json(train))


def render_text(report: PortReport, max_rows: int = 60) -> str:
    """The terminal report: the training checks first, as they ran, then the forward table and summary."""
    from .verify.report import render_text as forward_text
    text = forward_text(report.forward, max_rows=max_rows)
    if report.train is None:
        return text
    from .train.report import render_text as train_text
    return f"{train_text(report.train)}\n{text}"


def render_json(report: PortReport) -> str:
    """Strict JSON: NaN and infinite numbers (a ratio over every budget, an output that is NaN)
    are null, since parsers other than Python's refuse NaN and Infinity; the rows' verdicts say
    what they meant."""
    return json.dumps(finite_or_null(report.to_json()), indent=1, default=str, allow_nan=False) + "\n"


def render_html(report: PortReport) -> str:
    """One self-contained page headed by the composed verdict: the forward check's plot, diagnosis
    and table, and the training checks' section; a failed training check's section comes first,
    so that the page leads with the culprit it names."""
    from .verify.report import html_body, html_page
    sections = [html_body(report.forward)]
    if report.train is not None:
        from .train.report import render_html_section
        training = render_html_section(report.train) + "\n"
        sections.insert(0 if report.train.verdict is Verdict.FAIL else 1, training)
    return html_page(report.verdict, "".join(sections))
