"""What verify-port is doing and how far: one line on stderr that tqdm redraws (the forward passes
of either model so far, the training run and its step), drawn only inside `shown(True)`, which the
command opens on a terminal without --quiet. Elsewhere (the API, a pipe, a file, --quiet) nothing is
drawn and a tick costs one check."""

from __future__ import annotations

import contextlib
import sys
import threading

_LOCK = threading.Lock()
_STATE: dict = {"bar": None, "passes": 0, "said": {}}


@contextlib.contextmanager
def shown(enabled: bool, file=None):
    """Within it, ticks redraw the line on `file` (stderr) where `enabled`; the line is cleared at the end."""
    if not enabled:
        yield
        return
    from tqdm import tqdm
    bar = tqdm(total=None, desc="verify-port: setting up", file=file or sys.stderr, leave=False, dynamic_ncols=True,
               miniters=1, mininterval=0, bar_format="{desc} [{elapsed}]")  # each pass and step drawn
    with _LOCK:
        _STATE.update(bar=bar, passes=0, said={})
    try:
        yield
    finally:
        with _LOCK:
            _STATE["bar"] = None
        bar.close()


def write(line: str, file=None) -> bool:
    """`line` printed above the progress line where one is drawn (True), else nothing done (False)."""
    bar = _STATE["bar"]
    if bar is None:
        return False
    with _LOCK:
        bar.write(line, file=file or bar.fp)
    return True


def forward_pass(side: str) -> None:
    """A forward pass of one model begins (`side`: torch or paddle)."""
    if _STATE["bar"] is None:
        return
    with _LOCK:
        _STATE["passes"] += 1
        _say("passes", f"{_STATE['passes']} forward pass(es), now {side}'s")


def training_step(run: str, k: int, total: int) -> None:
    """Training step `k` (from 0) of `total` in `run` (torch fp32, torch float64, paddle, ...) begins."""
    if _STATE["bar"] is None:
        return
    with _LOCK:
        _say("train", f"training: {run} step {k + 1}/{total}")


def training_done() -> None:
    """The training checks have ended (the forward check's passes follow)."""
    if _STATE["bar"] is None:
        return
    with _LOCK:
        _say("train", "training checks done")


def _say(key: str, text: str) -> None:
    bar = _STATE["bar"]
    if bar is None:
        return
    _STATE["said"][key] = text
    bar.set_description_str("verify-port: " + "; ".join(_STATE["said"].values()), refresh=False)
    bar.update(1)
