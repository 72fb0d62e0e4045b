"""Lazy, quiet imports of the two frameworks."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings

from .errors import UserError


def import_torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UserError(
            f"torch is not installed ({exc}); install it with: pip install -c constraints.txt '.[cpu]'"
        ) from None
    return torch


def import_paddle():
    if "paddle" in sys.modules:
        return sys.modules["paddle"]
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        # paddle warns about ccache and prints set-up notes on import; keep our output clean.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            import paddle
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UserError(
            f"paddle is not installed ({exc}); install it with: pip install -c constraints.txt '.[cpu]'"
        ) from None
    return paddle
