"""Causes found by re-running: the first layer over budget re-run with an argument of one of the
functional calls its forward makes changed.

A port's forward calls `paddle.nn.functional` (and `paddle.fft`) with arguments its author chose:
an activation's variant, an axis, `align_corners`, a reduction. The culprit is run once on torch's
recorded inputs with those functions wrapped, which records every call (which function, from which
layer, with which arguments, defaults included); then each argument of each call is changed to each
value its signature allows (a flag's opposite, another word its annotation lists, another axis of
its input, other axes of it as many as a tuple names) and the layer re-run with that one call
changed. A change under which paddle's output lands within the layer's budget of torch's is a cause,
confirmed by re-running. Where none is, torch's float64 module is searched the same way against
paddle's output: which argument of a `torch.nn.functional` call makes torch compute what paddle
does. The functions are wrapped only while the culprit runs here, and act on this thread's calls
alone.
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
# the functions searched on each side: the Python functions of these modules. Builtins have no
# signature to bind a call to (torch.nn.functional.gelu, torch.nn.functional.pad and all of torch.fft
# are bound C functions), so their calls pass unrecorded and are never changed.
NAMESPACES = {"paddle": ("paddle.nn.functional", "paddle.fft"), "torch": ("torch.nn.functional", "torch.fft")}
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
    side: str = "paddle"  # whose call was changed

    def diagnosis(self, culprit: str, before: float, other: str = "") -> Diagnosis:
        """`other`: where the change is torch's, the paddle layer that computes otherwise."""
        c = self.call
        was = c.arguments[self.parameter]
        nth = f" (its call {c.index + 1} there)" if c.index else ""
        went = f"ratio {before:.3g} -> {self.ratio:.3g}"
        if self.side == "paddle":
            return Diagnosis(culprit, f"paddle's {c.layer or '<model>'} calls {c.function}(..., {self.parameter}={was!r})"
                             f"{nth}; re-run on torch's recorded inputs with {self.parameter}={self.to!r} it gives torch's "
                             f"output within the budget ({went}): confirmed by re-running",
                             f"pass {self.parameter}={self.to!r} to {c.function.rsplit('.', 1)[-1]} in "
                             f"{c.layer or 'the model'}'s forward", kind=KIND)
        return Diagnosis(culprit, f"paddle's {other or '<model>'} computes what torch's {c.layer or '<model>'} computes with "
                         f"{self.parameter}={self.to!r} in its call {c.function}(..., {self.parameter}={was!r}){nth}: "
                         f"torch's module re-run so gives paddle's output within the budget ({went}): confirmed by "
                         "re-running", f"make paddle's {other or 'model'} compute what torch's "
                         f"{c.function.rsplit('.', 1)[-1]} computes with {self.parameter}={was!r}", kind=KIND)


def _functions(side: str) -> list[tuple[object, str, object]]:
    """(namespace module, name, function) for every public Python function of the side's namespaces."""
    import importlib
    out = []
    for namespace in NAMESPACES[side]:
        module = importlib.import_module(namespace)
        for name in dir(module):
            f = getattr(module, name)
            if not name.startswith("_") and inspect.isfunction(f):
                out.append((module, name, f))
    return out


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):  # axes, sizes
        return 0 < len(value) <= 6 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _tensor(value) -> bool:
    return not _plain(value) and hasattr(value, "ndim") and hasattr(value, "shape")


class _Wrapped:
    """The namespaces' functions wrapped for one run: each call recorded (layer from `where()`), and
    the call picked by `change` ((function, index, parameter, value)) made with that argument changed."""

    def __init__(self, where, change=None):
        self.where, self.change = where, change
        self.thread = threading.get_ident()  # calls from other threads pass straight through
        self.calls: list[Recorded] = []
        self.counts: dict[str, int] = {}
        self.inside = 0  # wrapped functions running: the calls they make are theirs, not the layer's

    def wrap(self, qualified: str, f):
        sig = _signature(f)

        def call(*args, **kwargs):
            if threading.get_ident() != self.thread or self.inside:  # another thread's, or made by a wrapped
                return f(*args, **kwargs)  # function (paddle's fft2 calls fftn): the layer's code made the outer one
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return f(*args, **kwargs)
            k = self.counts.get(qualified, 0)
            self.counts[qualified] = k + 1
            if self.change is not None and self.change[:2] == (qualified, k):
                bound.arguments[self.change[2]] = self.change[3]
                args, kwargs = bound.args, bound.kwargs
            else:
                bound.apply_defaults()
                first = next((v for v in bound.arguments.values() if _tensor(v)), None)
                self.calls.append(Recorded(qualified, k, self.where(), {p: v for p, v in bound.arguments.items()
                                                                        if _plain(v)},
                                           int(first.ndim) if first is not None else 0))
            self.inside += 1
            try:
                return f(*args, **kwargs)
            finally:
                self.inside -= 1
        return call


@contextmanager
def _wrapped(layer, root_path: str, change=None):
    """The namespaces' functions of `layer`'s framework wrapped while the block runs, and hooks on
    its sublayers that say which layer is running; all removed on leaving."""
    stack = [root_path]
    wrapped = _Wrapped(lambda: stack[-1], change)
    handles = []
    paddle = hasattr(layer, "named_sublayers")
    for rel, sub in layer.named_sublayers() if paddle else ((k, m) for k, m in layer.named_modules() if k):
        path = f"{root_path}.{rel}" if root_path else rel
        handles.append(sub.register_forward_pre_hook(lambda _l, _a, path=path: stack.append(path)))
        post = sub.register_forward_post_hook if paddle else sub.register_forward_hook
        handles.append(post(lambda _l, _a, _o: _popped(stack)))
    with _WRAPPING:  # one set of wrappers at a time: two diagnoses would otherwise restore each other's
        originals = _functions("paddle" if paddle else "torch")
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
    """A post-hook's work, returning None: what a post-hook returns replaces the output."""
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
    if isinstance(value, (tuple, list)) and call.ndim and _axes(value, call.ndim):  # axes of its input
        from itertools import combinations
        axes = range(-call.ndim, 0) if all(a < 0 for a in value) else range(call.ndim)
        mine = sorted(a % call.ndim for a in value)
        return [type(value)(c) for c in combinations(axes, len(value)) if sorted(a % call.ndim for a in c) != mine]
    return []


def _axes(value, ndim: int) -> bool:
    """Whether a sequence reads as axes of an input of `ndim` axes: distinct, fewer than it has, each
    one of them, counted from one end."""
    return (len(value) < ndim and all(-ndim <= a < ndim for a in value) and len({a % ndim for a in value}) == len(value)
            and (all(a < 0 for a in value) or all(a >= 0 for a in value)))


def call_causes(layer, root_path: str, run, judge, runs, side: str = "paddle") -> list[CallChange]:
    """The functional calls' changes that reproduce the other side (see the module's docstring),
    best first: `run()` runs `layer` (on torch's recorded inputs) and gives its outputs, `judge(outputs)`
    their ratio against the other side's."""
    try:
        with _wrapped(layer, root_path) as seen:
            before = judge(run())
    except Exception:  # noqa: BLE001 - a layer that cannot re-run on torch's inputs has no call to find
        return []
    if before is not None and before <= 1.0:  # re-run unchanged it is within its budget: nothing to explain here
        return []
    hits = []
    for call in seen.calls:
        for parameter in call.arguments:
            if parameter == "name" or parameter.startswith("_"):  # a call's name; torch's _stacklevel
                continue
            for new in candidates(call, parameter):
                if not runs.take():
                    return sorted(hits, key=lambda c: c.ratio)
                try:
                    with _wrapped(layer, root_path, (call.function, call.index, parameter, new)):
                        ratio = judge(run())
                except Exception:  # noqa: BLE001 - an argument the function refuses is not the cause
                    ratio = None
                if ratio is not None and ratio <= 1.0:
                    hits.append(CallChange(call, parameter, new, ratio, side))
    return sorted(hits, key=lambda c: c.ratio)
