"""Causes found by re-running: the first layer over budget re-run with an argument of one of the
functional calls its forward makes changed.

A port's forward calls `paddle.nn.functional` (and `paddle.fft`) with arguments its author chose:
an activation's variant, an axis, `align_corners`, a reduction. The culprit is run once on torch's
recorded inputs with those functions wrapped, which records every call (which function, from which
layer, with which arguments, defaults included); then each argument of each call is changed to each
value its signature allows (a flag's opposite, another word its annotation lists, another axis of
its input) and the layer re-run with that one call changed. A change under which paddle's output
lands within the layer's budget of torch's is a cause, confirmed by re-running. The functions are
wrapped only while the culprit runs here, and act on this thread's calls alone.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from ..diagnosis import Diagnosis

KIND = "call argument"
NAMESPACES = ("paddle.nn.functional", "paddle.fft")
_WRAPPING = threading.Lock()


@dataclass(frozen=True)
class Recorded:
    """One functional call a forward made: which function, its k-th call, from which layer."""

    function: str  # namespace.name
    index: int  # among the calls of this function in one run
    layer: str  # the path of the innermost layer running when it was made
    arguments: dict  # parameter -> the plain value it had (defaults included)
    ndim: int  # the first tensor argument's number of axes (0 when none)


@dataclass(frozen=True)
class CallChange:
    call: Recorded
    parameter: str
    to: object
    ratio: float

    def diagnosis(self, culprit: str, before: float) -> Diagnosis:
        c = self.call
        was = c.arguments[self.parameter]
        nth = f" (its call {c.index + 1} there)" if c.index else ""
        return Diagnosis(culprit, f"paddle's {c.layer or '<model>'} calls {c.function}(..., {self.parameter}={was!r}){nth}; "
                         f"re-run on torch's recorded inputs with {self.parameter}={self.to!r} it gives torch's output "
                         f"within the budget (ratio {before:.3g} -> {self.ratio:.3g}): confirmed by re-running",
                         f"pass {self.parameter}={self.to!r} to {c.function.rsplit('.', 1)[-1]} in "
                         f"{c.layer or 'the model'}'s forward", kind=KIND)


def _functions() -> list[tuple[object, str, object]]:
    """(namespace module, name, function) for every public Python function of the namespaces."""
    import importlib
    out = []
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        for name in dir(module):
            f = getattr(module, name)
            if not name.startswith("_") and inspect.isfunction(f):
                out.append((module, name, f))
    return out


def _plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


class _Wrapped:
    """The namespaces' functions wrapped for one run: each call recorded (layer from `where()`), and
    the call picked by `change` ((function, index, parameter, value)) made with that argument changed."""

    def __init__(self, where, change=None):
        self.where, self.change = where, change
        self.thread = threading.get_ident()  # calls from other threads pass straight through
        self.calls: list[Recorded] = []
        self.counts: dict[str, int] = {}

    def wrap(self, qualified: str, f):
        sig = _signature(f)

        def call(*args, **kwargs):
            if threading.get_ident() != self.thread:
                return f(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return f(*args, **kwargs)
            k = self.counts.get(qualified, 0)
            self.counts[qualified] = k + 1
            if self.change is not None and self.change[:2] == (qualified, k):
                bound.arguments[self.change[2]] = self.change[3]
                return f(*bound.args, **bound.kwargs)
            bound.apply_defaults()
            first = next((v for v in bound.arguments.values() if hasattr(v, "ndim") and hasattr(v, "place")), None)
            self.calls.append(Recorded(qualified, k, self.where(), {p: v for p, v in bound.arguments.items() if _plain(v)},
                                       int(first.ndim) if first is not None else 0))
            return f(*args, **kwargs)
        return call


@contextmanager
def _wrapped(layer, root_path: str, change=None):
    """The namespaces' functions wrapped while the block runs, and hooks on `layer`'s sublayers that
    say which layer is running; all removed on leaving."""
    stack = [root_path]
    wrapped = _Wrapped(lambda: stack[-1], change)
    handles = []
    for rel, sub in layer.named_sublayers():
        path = f"{root_path}.{rel}" if root_path else rel
        handles.append(sub.register_forward_pre_hook(lambda _l, _a, path=path: stack.append(path)))
        handles.append(sub.register_forward_post_hook(lambda _l, _a, _o: _popped(stack)))
    with _WRAPPING:  # one set of wrappers at a time: two diagnoses would otherwise restore each other's
        originals = _functions()
        try:
            for module, name, f in originals:
                setattr(module, name, wrapped.wrap(f"{module.__name__}.{name}", f))
            yield wrapped
        finally:
            for module, name, f in originals:
                setattr(module, name, f)
            for h in handles:
                h.remove()


def _popped(stack: list) -> None:
    """A post-hook's work, returning None: what a paddle post-hook returns replaces the output."""
    stack.pop()


@functools.cache
def _signature(f) -> inspect.Signature:
    """A function's signature, read once: every re-run wraps every function of the namespaces."""
    return inspect.signature(f)


def _literals(function: str, parameter: str) -> list[str]:
    """The words a parameter's annotation allows: quoted in it, or in a Literal alias it names
    (defined in the function's module, or in paddle._typing)."""
    return list(_words(function, parameter))


@functools.cache
def _words(function: str, parameter: str) -> tuple[str, ...]:
    namespace, name = function.rsplit(".", 1)
    f = getattr(sys.modules[namespace], name)
    annotation = str(_signature(f).parameters[parameter].annotation)
    found = _quoted(annotation)
    sources = [source for source in map(_source, (f.__module__, "paddle._typing", "paddle._typing.layout")) if source]
    for alias in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", annotation):
        for source in sources:
            m = re.search(rf"^\s*{re.escape(alias)}\s*(?::\s*TypeAlias\s*)?=\s*Literal\[(.*?)\]", source, re.M | re.S)
            if m:
                found += _quoted(m.group(1))
    return tuple(dict.fromkeys(found))


def _quoted(text: str) -> list[str]:
    return [a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", text)]


@functools.cache
def _source(module_name: str) -> str:
    """The source of a module imported already, read once; "" where there is none."""
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def candidates(call: Recorded, parameter: str) -> list:
    value = call.arguments[parameter]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, str):
        return [w for w in _literals(call.function, parameter) if w != value]
    if isinstance(value, int) and call.ndim and -call.ndim <= value < call.ndim:  # an axis of its input
        axes = range(-call.ndim, 0) if value < 0 else range(call.ndim)  # counted as the call counts them
        return [a for a in axes if a % call.ndim != value % call.ndim]
    if isinstance(value, float) and 0.0 < value < 1.0:
        return [1.0 - value]
    return []


def call_causes(layer, root_path: str, forced: tuple, judge, runs) -> list[CallChange]:
    """The functional calls' changes that reproduce torch (see the module's docstring), best first."""
    from ..compare.replay import run_paddle
    try:
        with _wrapped(layer, root_path) as seen:
            before = judge(run_paddle(layer, *forced))
    except Exception:  # noqa: BLE001 - a layer that cannot re-run on torch's inputs has no call to find
        return []
    if before is not None and before <= 1.0:  # re-run unchanged it is within its budget: nothing to explain here
        return []
    hits = []
    for call in seen.calls:
        for parameter in call.arguments:
            if parameter == "name":
                continue
            for new in candidates(call, parameter):
                if not runs.take():
                    return sorted(hits, key=lambda c: c.ratio)
                try:
                    with _wrapped(layer, root_path, (call.function, call.index, parameter, new)):
                        ratio = judge(run_paddle(layer, *forced))
                except Exception:  # noqa: BLE001 - an argument the function refuses is not the cause
                    ratio = None
                if ratio is not None and ratio <= 1.0:
                    hits.append(CallChange(call, parameter, new, ratio))
    return sorted(hits, key=lambda c: c.ratio)
