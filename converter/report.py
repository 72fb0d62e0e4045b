"""What verify-port found, composed: the forward check's Report and, when asked, the training
checks' TrainReport, one object with one verdict, rendered to text, JSON and HTML by one
function each, and read back from its JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .results import Verdict

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
        """The forward report's body with the composed `verdict` at the top, the forward check's own
        as `forward_verdict`, and the training checks' under "train" (with their own `verdict`)."""
        body = self.forward.to_json()
        if self.train is None:
            return dict(body, forward_verdict=body["verdict"])
        return dict(body, verdict=self.verdict, forward_verdict=body["verdict"], train=self.train.to_json())

    @classmethod
    def from_json(cls, body: dict) -> PortReport:
        from .train.result import TrainReport
        from .verify.report import Report
        train = body.get("train")
        return cls(Report.from_json(body), None if train is None else TrainReport.from_json(train))


FORWARD = "forward check: "  # heads the forward check's own verdict line where training checks ran too


def render_text(report: PortReport, max_rows: int = 60) -> str:
    """The terminal report: the training checks first, as they ran, then the forward table and
    summary; its last line is the composed verdict."""
    from .verify.report import render_text as forward_text
    if report.train is None:
        return forward_text(report.forward, max_rows=max_rows)
    from .train.report import render_text as train_text
    return f"{train_text(report.train)}\n{forward_text(report.forward, max_rows=max_rows, label=FORWARD)}\n" \
        + verdict_line(report)


def verdict_line(report: PortReport) -> str:
    """The composed verdict in one line, naming the checks that failed and where; with the forward
    check alone, its own verdict line."""
    from .verify.report import verdict_line as forward_line
    if report.train is None:
        return forward_line(report.forward)
    from .train.report import first_bad_line
    forward, train = report.forward.verdict, report.train.verdict
    if report.verdict is Verdict.PASS:
        return (f"PASS: the training checks ({len(report.train.steps)} step(s)) and the forward check "
                f"({len(report.forward.layers)} compared layers) are within their expected-error budgets")
    failed = []
    if train is Verdict.FAIL:
        failed.append(f"the training checks fail ({first_bad_line(report.train)})")
    if forward is Verdict.FAIL:
        failed.append(f"the forward check fails ({forward_line(report.forward).removeprefix('FAIL: ')})")
    passed = [said for said, v in (("the training checks pass", train), ("the forward check passes", forward))
              if v is Verdict.PASS]
    return "FAIL: " + "; ".join(failed + passed)


def render_json(report: PortReport) -> str:
    """The report's JSON as strict JSON (cli_common.json_text: NaN and infinite numbers are null)."""
    from .cli_common import json_text
    return json_text(report.to_json())


def render_html(report: PortReport) -> str:
    """One self-contained page headed by the composed verdict: its line and the diagnosis of each
    check that failed lead; then the sections, a failed training check's first, so that the page
    leads with the culprit it names, else the forward check's (plot, closest layers, table) first."""
    from .verify.page import html_body, html_lead, html_page
    failed = [part for part in reversed(report.parts()) if part.verdict is Verdict.FAIL]  # as the text: training first
    lead = html_lead(verdict_line(report), [d for part in failed for d in part.diagnosis])
    if report.train is None:
        return html_page(report.verdict, lead, html_body(report.forward))
    from .train.report import render_html_section
    sections = [html_body(report.forward, label=FORWARD)]
    training = render_html_section(report.train) + "\n"
    sections.insert(0 if report.train.verdict is Verdict.FAIL else 1, training)
    return html_page(report.verdict, lead, "".join(sections))
