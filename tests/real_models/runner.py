"""Run one real-model case through verify-port's public entry point and judge the answer.

The command is invoked as the CLI invokes it (click's CliRunner on
`converter.cli.verify_port`, `--json FILE`), and only the JSON report is read:
`verdict`, `first_bad_layer.torch`, `diagnosis`, and the rows' verdicts (`within_budget`) and notes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field

from cases import Case

STRATEGIES = ("auto", "full", "binary")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Outcome:
    case: Case
    strategy: str
    exit_code: int
    seconds: float
    verdict: str | None = None
    named: str | None = None  # first_bad_layer.torch
    causes: list = field(default_factory=list)
    unjudged: int = 0  # compared pairs without a verdict
    largest: tuple[float, str] | None = None  # the largest finite ratio of a row, and its torch layer
    notes: list = field(default_factory=list)  # distinct row and report notes
    error: str = ""  # stderr, or the output when no JSON was written

    def problems(self) -> list[str]:
        """What is wrong with this answer; empty when it is the right one."""
        case, out = self.case, []
        if self.verdict is None:
            return [f"no report (exit {self.exit_code}): {self.error.strip()[-300:]}"]
        if self.unjudged:  # every compared pair gets a verdict
            out.append(f"{self.unjudged} compared pairs carry no verdict")
        if case.clean:
            if self.exit_code != 0 or self.verdict != "pass":
                out.append(f"clean pair: exit {self.exit_code}, verdict {self.verdict}, named {self.named!r}")
            return out
        if self.exit_code != 1 or self.verdict != "fail":
            out.append(f"exit {self.exit_code}, verdict {self.verdict} (expected exit 1, fail)")
        if self.named != case.culprit:
            out.append(f"named {self.named!r}, expected {case.culprit!r}")
        if self.strategy != "binary" and not self.diagnosed():
            out.append(f"no diagnosis says {case.diagnosis!r}")
        return out

    def diagnosed(self) -> bool:
        return any(self.case.diagnosis.lower() in cause.lower() for cause in self.causes)


def verify_args(case: Case, strategy: str, json_path: str) -> list[str]:
    emulate = [a for value in case.emulate for a in ("--emulate", value)]
    return ["--spec", case.spec_path, "--bisect", "--device", "cpu", "--strategy", strategy, *emulate, "--json", json_path]


def command_line(case: Case, strategy: str) -> str:
    spec = os.path.relpath(case.spec_path, ROOT)
    emulate = "".join(f" --emulate {value}" for value in case.emulate)
    return f"verify-port --spec {spec} --bisect --device cpu --strategy {strategy}{emulate}"


def run_case(case: Case, strategy: str) -> Outcome:
    from click.testing import CliRunner

    from converter.cli import verify_port
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        start = time.perf_counter()
        result = CliRunner().invoke(verify_port, verify_args(case, strategy, path))
        seconds = time.perf_counter() - start
        outcome = Outcome(case, strategy, result.exit_code, seconds)
        if not os.path.exists(path):
            outcome.error = (result.stderr or "") + (result.stdout or "") + (repr(result.exception) if result.exception else "")
            return outcome
        with open(path) as f:
            report = json.load(f)
    outcome.verdict = report.get("verdict")
    outcome.named = (report.get("first_bad_layer") or {}).get("torch")
    outcome.causes = [d.get("cause", "") for d in report.get("diagnosis") or []]
    rows = report.get("layers") or []
    # a row's verdict, not its ratio: the JSON writes an infinite ratio (over every budget) as null
    outcome.unjudged = sum(1 for row in rows if row.get("within_budget") is None)
    ratios = [(row["ratio"], row.get("torch") or "<model>") for row in rows if row.get("ratio") is not None]
    outcome.largest = max(ratios, default=None)
    notes = [row["note"] for row in rows if row.get("note")] + list(report.get("notes") or [])
    outcome.notes = list(dict.fromkeys(notes))
    outcome.error = result.stderr or ""
    return outcome
