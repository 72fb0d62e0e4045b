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
    """paddle, imported quietly, in dynamic-graph mode on the calling thread (see _dynamic)."""
    imported = sys.modules.get("paddle")
    if imported is not None and hasattr(imported, "in_dynamic_mode"):  # not one another thread is importing
        return _dynamic(imported)
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
    return _dynamic(paddle)


def _dynamic(paddle):
    """`paddle`, with the calling thread in dynamic-graph mode. paddle keeps its mode per thread, and
    where paddle was first imported on a thread other than the main one, threads started later begin
    in static-graph mode: a second verification run from a worker thread then fails in the model's
    own forward ("int(Tensor) is not supported in static graph mode")."""
    if not paddle.in_dynamic_mode():
        paddle.disable_static()
    return paddle
