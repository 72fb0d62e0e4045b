"""What every check's results share: a verdict (pass, fail, not judged) and numbers made fit for
JSON. Forward rows, training rows and the reports built from them take their verdict from here.
Importing this module imports no numpy."""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass


class Verdict(enum.StrEnum):
    """A row's or a report's verdict. Only PASS is truthy: a row never judged is not a pass."""

    PASS = "pass"
    FAIL = "fail"
    NOT_JUDGED = "not judged"

    def __bool__(self) -> bool:
        return self is Verdict.PASS

    @classmethod
    def of_ratio(cls, ratio: float | None) -> Verdict:
        """A compared value's verdict from its ratio to its budget: over 1 (or NaN) fails, none is not judged."""
        if ratio is None:
            return cls.NOT_JUDGED
        return cls.FAIL if math.isnan(ratio) or ratio > 1.0 else cls.PASS

    @classmethod
    def of_all(cls, verdicts) -> Verdict:
        """FAIL when any fails, else PASS: a report's verdict over its parts."""
        return cls.FAIL if any(v is cls.FAIL for v in verdicts) else cls.PASS


def finite_or_null(value):
    """`value` with every NaN and infinite float (numpy's too) as None, inside dicts, lists and
    tuples: JSON has no spelling for them (Python writes NaN and Infinity, which strict parsers
    refuse); the rows' verdicts say what they meant."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


@dataclass(frozen=True)
class Skipped:
    """A measurement a check could not take (what stood in for it is said in `what`), and why."""

    what: str
    why: str

    @classmethod
    def of(cls, what: str, exc: BaseException) -> Skipped:
        return cls(what, f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}")


SHOWN_SKIPPED = 3  # skipped measurements named in the note; the rest counted


def skipped_notes(skipped) -> list:
    """The report's note counting the skipped measurements, naming the first few; none when none was."""
    if not skipped:
        return []
    said = "; ".join(f"{s.what} ({s.why})" for s in skipped[:SHOWN_SKIPPED])
    more = f"; and {len(skipped) - SHOWN_SKIPPED} more" if len(skipped) > SHOWN_SKIPPED else ""
    return [f"{len(skipped)} measurement{'s' if len(skipped) > 1 else ''} skipped: {said}{more}"]
