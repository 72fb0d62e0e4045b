"""Report files of the commands, written like converted weights (atomic, checked against every
input and output first, never clobbering without --force), and their strict JSON. Importing this
module imports no numpy: convert-weights sets numpy's thread count before numpy loads."""

from __future__ import annotations

import json

from .results import finite_or_null


def check_outputs(outputs: dict[str, str | None], inputs: list[str | None], force: bool) -> None:
    """Every output (option name -> path; None: not asked for) checked before anything is written:
    it may be written, it is no input, and no two are the same file (see io/atomic.py)."""
    from .io.atomic import check_outputs as check
    check(outputs, inputs, force)


def write_outputs(texts: dict[str | None, str], force: bool) -> None:
    """Report files (path -> text; a None path is skipped) written together: all of them or, when
    one fails (a full disk, text that cannot be encoded), none."""
    from .io.atomic import write_texts
    write_texts(texts, force)


def json_text(body: dict) -> str:
    """Strict JSON: NaN and infinite numbers (a ratio over every budget, an output that is NaN)
    are null, since parsers other than Python's refuse NaN and Infinity; the rows' verdicts say
    what they meant."""
    return json.dumps(finite_or_null(body), indent=1, default=str, allow_nan=False) + "\n"
