"""Whose failure it is: what a model, a loss or a spec function raises while it runs is bad input
(one line saying where it failed); what this package's own code raises inside them (a hook) is an
internal error, never "your model fails"."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

from ..errors import UserError


@contextlib.contextmanager
def model_errors(said, ours: bool = True):
    """What a model (or a loss, in its backward) raises while it runs is bad input: a UserError with
    the line `said(exc)` makes of it. With `ours`, an error raised in this package's own code (a hook)
    is left as it is, an internal error, in the forward check and the training checks alike."""
    from .capture import CaptureTooLarge
    try:
        yield
    except (UserError, CaptureTooLarge, KeyboardInterrupt, MemoryError):
        raise
    except BaseException as exc:  # asyncio.CancelledError, a class of the spec's own deriving from BaseException
        if ours and isinstance(exc, Exception) and _raised_by_us(exc):  # our own hooks failed, not the model:
            raise  # an internal error, not bad input
        raise UserError(said(exc)) from None


def forward_errors(which: str, spec_path: str, hint: str = "fix the model or the inputs", ours: bool = True):
    """A model whose forward raises on the spec's inputs is bad input: one line, where it failed."""
    from ..spec import failure, spec_line

    def said(exc: BaseException) -> str:
        if isinstance(exc, SystemExit):
            return (f"{which} from '{spec_path}' called sys.exit({exc.code!r}) in its forward"
                    f"{spec_line(exc, spec_path)}; a forward must return its outputs")
        return f"{which} from '{spec_path}' fails on inputs(): {failure(exc, spec_path)}; {hint}"
    return model_errors(said, ours)


@contextlib.contextmanager
def spec_call_errors(spec_path: str, name: str):
    """A spec function that raises what is no Exception (asyncio.CancelledError, a class of its own
    deriving from BaseException) fails like one that raises an Exception: one line (the spec's own
    Exceptions and exits are said so where it is called, see spec.call_spec_function).
    KeyboardInterrupt stays an interrupt."""
    try:
        yield
    except (Exception, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        from ..spec import failure
        raise UserError(f"spec '{spec_path}': {name}() failed with {failure(exc, spec_path)}; a spec must return "
                        "its value") from None


# packages whose frames stand between this package's code and the error it made (numpy raising for
# a hook of ours); torch and paddle are not among them: what they raise in a model's forward or in the
# backward of a user's loss is the model's
_BETWEEN = frozenset({"numpy"})


def _raised_by_us(exc: BaseException) -> bool:
    """The exception was raised by this package's own code (not in a model: the bundled example
    ports in converter/examples are models): the innermost frame that is neither the standard
    library's nor numpy's is this package's."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        top = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if top in _BETWEEN or top in sys.stdlib_module_names:
            continue
        where = os.path.abspath(frame.f_code.co_filename)
        return where.startswith(here + os.sep) and not where.startswith(os.path.join(here, "examples") + os.sep)
    return False
