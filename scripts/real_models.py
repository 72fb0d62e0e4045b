"""verify-port on real model pairs: every case of tests/real_models/cases.py, under each strategy,
printed as a table (case, strategy, expected culprit, culprit named, verdict, rows without a verdict, the
largest ratio of a row, time, diagnosis), and the largest ratio over the clean pairs' rows (the budget's
tightness).
A wrong answer that a case's known verifier defect explains is marked "known"; a right one where
that defect was expected, "fixed?". Exit 1 when any answer is wrong and not known, or known and right.

HF transformers models (torch) against PaddleNLP 2.8.1's ports; both are never dependencies of
this project, so run it in the side environment:

    PY=$(scripts/side_env.sh) && "$PY" scripts/real_models.py [--strategy auto] [--case gpt2]
"""

import argparse
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "real_models"))
warnings.filterwarnings("ignore")

from converter.lazy import import_paddle  # noqa: E402

import_paddle()  # quietly, before PaddleNLP imports it

from cases import CASES  # noqa: E402
from runner import STRATEGIES, command_line, run_case  # noqa: E402


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def mark(outcome) -> str:
    wrong, known = bool(outcome.problems()), outcome.case.defect(outcome.strategy) is not None
    return {(False, False): "ok", (True, False): "WRONG", (True, True): "known", (False, True): "fixed?"}[wrong, known]


def row(outcome) -> str:
    case = outcome.case
    expected = "(pass)" if case.clean else case.culprit
    named = outcome.named or "-"
    diagnosis = short("; ".join(outcome.causes), 60) or "-"
    verdict = f"{outcome.verdict or 'error'} (exit {outcome.exit_code})"
    largest = f"{outcome.largest[0]:.2f}" if outcome.largest else "-"
    return (f"{case.name:34s} {outcome.strategy:6s} {expected:48s} {named:48s} {verdict:14s} "
            f"{outcome.unjudged:8d} {largest:>7s} {outcome.seconds:5.1f}s {mark(outcome):6s} {diagnosis}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", action="append", choices=STRATEGIES, help="(repeatable; default: all three)")
    parser.add_argument("--case", action="append", help="run the cases whose name contains this (repeatable)")
    parser.add_argument("--notes", action="store_true", help="print each run's row notes")
    parser.add_argument("--clean", action="store_true", help="only the clean pairs")
    args = parser.parse_args()
    strategies = args.strategy or list(STRATEGIES)
    cases = [c for c in CASES if (not args.case or any(part in c.name for part in args.case))
             and (c.clean or not args.clean)]
    print(f"{'case':34s} {'strat.':6s} {'expected culprit':48s} {'culprit named':48s} {'verdict':14s} "
          f"{'no verd.':>8s} {'largest':>7s} {'time':>6s} {'':6s} diagnosis")
    wrong, known, clean = [], [], []
    for case in cases:
        for strategy in [s for s in strategies if s in case.strategies]:
            outcome = run_case(case, strategy)
            print(row(outcome), flush=True)
            if case.clean and outcome.largest:
                clean.append(outcome)
            if args.notes and outcome.notes:
                for note in outcome.notes:
                    print(f"    note: {short(note, 160)}")
            if mark(outcome) == "known":
                known.append(outcome)
            elif mark(outcome) != "ok":
                defect = outcome.case.defect(outcome.strategy)
                wrong.append((outcome, outcome.problems() or [f"right, though expected wrong by: {defect.what}"]))
    runs = sum(1 for case in cases for s in strategies if s in case.strategies)
    print(f"\n{runs - len(wrong) - len(known)} of {runs} runs right, {len(known)} wrong by a known defect")
    if clean:  # tightness: how close the budget comes to a clean pair's own error
        top = max(clean, key=lambda o: o.largest[0])
        print(f"largest ratio of a clean pair's row: {top.largest[0]:.2f} ({top.case.name}, {top.strategy}, "
              f"{top.largest[1]}), over {len(clean)} clean runs")
    for outcome, problems in wrong:
        print(f"  {command_line(outcome.case, outcome.strategy)}: {'; '.join(problems)}")
    for outcome in known:
        print(f"  known: {command_line(outcome.case, outcome.strategy)}: {'; '.join(outcome.problems())}")
    for defect in dict.fromkeys(o.case.defect(o.strategy) for o in known):
        cases = sorted({o.case.name for o in known if o.case.defect(o.strategy) is defect})
        print(f"  defect ({', '.join(cases)}): {defect.what}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
