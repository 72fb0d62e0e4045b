"""The calls a layer's forward makes, recorded while it runs once (and one of them changed on a re-run):
the functions of its framework's functional namespaces, the Tensor methods that are functions of
them (`a.softmax(dim=-1)` is `paddle.softmax`), and such functions the layer or a layer inside it
holds as attributes (`self.activation = getattr(F, "gelu")`, set before any wrapping could see it).

Library attributes are replaced through patches.thread_patch: the calling thread runs the wrappers,
every other thread the originals. A layer's own attributes are set on it for the run and put back.
A call is counted per layer and function: the k-th call of `interpolate` the root's own forward
makes is its k-th, whatever its children call. A Tensor method counts only where the code that
calls it is not the framework's (a library layer's internals are not the port's code)."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

# the functions searched on each side: the Python functions of these modules. Builtins have no
# signature to bind a call to (torch.nn.functional.gelu, torch.nn.functional.pad and all of torch.fft
# are bound C functions), so their calls pass unrecorded and are never changed.
NAMESPACES = {"paddle": ("paddle.nn.functional", "paddle.fft"), "torch": ("torch.nn.functional", "torch.fft")}
# where a Tensor method's function is also found: a method recorded is one of these modules' functions
METHOD_NAMESPACES = {"paddle": ("paddle", "paddle.nn.functional"), "torch": ()}
TENSOR = {"paddle": "paddle.Tensor", "torch": "torch.Tensor"}


@dataclass(frozen=True)
class RecordedCall:
    """One call a forward made: which function, its k-th call by that layer's own code, from which layer."""

    function: str  # namespace.name (paddle.Tensor.name for a Tensor method)
    index: int  # among the calls of this function the layer's own code made in one run
    layer: str  # the path of the innermost layer running when it was made
    arguments: dict  # parameter -> the plain value it had (defaults included)
    ndim: int  # the first tensor argument's number of axes (0 when none)
    held: str = ""  # the attribute of `layer` it was called through, where the layer holds the function


@dataclass
class HeldFunction:
    """A function of the framework's namespaces a layer holds as an attribute."""

    path: str  # the holding layer's path
    layer: object
    attribute: str
    function: str  # its qualified name
    original: object = field(repr=False, default=None)


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):  # axes, sizes
        return 0 < len(value) <= 6 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _tensor(value) -> bool:
    return not _plain(value) and hasattr(value, "ndim") and hasattr(value, "shape")


def _first_tensor(arguments: inspect.BoundArguments):
    return next((v for v in arguments.arguments.values() if _tensor(v)), None)


@functools.cache
def _signature(f) -> inspect.Signature:
    """A function's signature, read once: every re-run wraps every function of the namespaces."""
    return inspect.signature(f)


@functools.cache
def _aliases(f) -> dict:
    """alias -> parameter, for a function whose decorator takes another name for a parameter
    (paddle's `mean(dim=...)` is its `axis`): read from the pairs the decorator closes over."""
    names = _signature(f).parameters
    out = {}
    for cell in getattr(f, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell holds nothing to read
            continue
        mapping = getattr(value, "alias_mapping", None)
        if isinstance(mapping, dict):
            out.update({a: p for a, p in mapping.items() if p in names and a not in names})
        elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value):
            if value[0] in names and value[1] not in names:
                out[value[1]] = value[0]
    return out


def bound(f, args, kwargs):
    """The call's arguments bound to `f`'s signature (a parameter's alias read as the parameter);
    None where they do not bind."""
    sig = _signature(f)
    try:
        return sig.bind(*args, **kwargs)
    except TypeError:
        aliases = _aliases(f)
        if not any(k in aliases for k in kwargs):
            return None
    try:
        return sig.bind(*args, **{aliases.get(k, k): v for k, v in kwargs.items()})
    except TypeError:
        return None


DIRECT = "paddle.nn.functional."  # calls whose one tensor input is kept: activations called directly
_PATCHES = frozenset({"converter.patches", __name__})


def _from_library(framework: str) -> bool:
    """Whether the code calling the wrapper (past the dispatch and this module) is the framework's own."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in _PATCHES:
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == framework or name.startswith(framework + ".")


class Wrapped:
    """The calls of one run: each recorded (layer from the running layers' stack), and the call picked
    by `change` ((function, layer, index, parameter, value)) made with that argument changed, or, with
    parameter None, `value` (a function) called on the call's first tensor in its place."""

    def __init__(self, framework: str, root_path: str, change=None):
        self.framework, self.change = framework, change
        self.thread = threading.get_ident()  # calls from other threads pass straight through
        # the layers running, innermost last, below them the root: a function called around its forward is its
        self.stack: list[str] = [root_path]
        self.calls: list[RecordedCall] = []
        # (path, attribute) -> a held function's first tensor input; (layer, function, index) -> that of a
        # paddle.nn.functional call with one tensor argument (an activation called directly)
        self.inputs: dict[tuple, object] = {}
        self.counts: dict[tuple, int] = {}
        self.inside = 0  # wrapped functions running: the calls they make are theirs, not the layer's

    def wrap(self, qualified: str, f, method: bool = False, held: HeldFunction | None = None):
        def call(*args, **kwargs):
            if threading.get_ident() != self.thread or self.inside or \
                    (method and (len(self.stack) < 2 or _from_library(self.framework))):  # another thread's, one
                return f(*args, **kwargs)  # made by a wrapped function (fft2 calls fftn), or a method called
            # outside the forward or by the framework's own code
            arguments = bound(f, args, kwargs)
            if arguments is None:
                return f(*args, **kwargs)
            layer = self.stack[-1]
            k = self.counts.get((layer, qualified), 0)
            self.counts[layer, qualified] = k + 1
            target = f
            picked = self.change is not None and self.change[:3] == (qualified, layer, k)
            if picked and self.change[3] is None:  # another function in this call's place, on its first tensor
                target, args, kwargs = self.change[4], (_first_tensor(arguments),), {}
            elif picked:
                arguments.arguments[self.change[3]] = self.change[4]
                args, kwargs = arguments.args, arguments.kwargs
            else:
                arguments.apply_defaults()
                first = _first_tensor(arguments)
                self.calls.append(RecordedCall(qualified, k, layer, {p: v for p, v in arguments.arguments.items()
                                                                 if _plain(v)},
                                           int(first.ndim) if first is not None else 0,
                                           held.attribute if held is not None else ""))
                keep = first is not None and self.change is None  # inputs are kept from the unchanged run alone
                if keep and held is not None and (held.path, held.attribute) not in self.inputs:
                    self.inputs[held.path, held.attribute] = first.clone()
                elif keep and held is None and qualified.startswith(DIRECT) and \
                        sum(map(_tensor, arguments.arguments.values())) == 1:
                    self.inputs[layer, qualified, k] = first.clone()
            self.inside += 1
            try:
                return target(*args, **kwargs)
            finally:
                self.inside -= 1
        return call


def framework_of(layer) -> str:
    return "paddle" if hasattr(layer, "named_sublayers") else "torch"


def named_layers(layer, root_path: str) -> list[tuple[str, object]]:
    """(path, layer) for `layer` and every layer inside it."""
    inner = layer.named_sublayers() if framework_of(layer) == "paddle" else \
        ((k, m) for k, m in layer.named_modules() if k)
    return [(root_path, layer)] + [(f"{root_path}.{rel}" if root_path else rel, sub) for rel, sub in inner]


@contextmanager
def wrapped(layer, root_path: str, change=None):
    """The calls `layer` makes recorded while the block runs (see the module's docstring), with
    hooks on it and its sublayers that say which layer is running; all removed on leaving."""
    from ..patches import thread_patch
    framework = framework_of(layer)
    seen = Wrapped(framework, root_path, change)
    with ExitStack() as stack:
        for path, sub in named_layers(layer, root_path):
            pre = sub.register_forward_pre_hook(lambda _l, _a, path=path: seen.stack.append(path))
            post = (sub.register_forward_post_hook if framework == "paddle" else sub.register_forward_hook)(
                lambda _l, _a, _o: _popped(seen.stack))
            stack.callback(pre.remove)
            stack.callback(post.remove)
        for namespace in NAMESPACES[framework]:
            for name, _ in public_functions(namespace):
                stack.enter_context(thread_patch(sys.modules[namespace], name).patched(
                    lambda f, q=f"{namespace}.{name}": seen.wrap(q, f)))
        tensor = resolved(TENSOR[framework])
        for name, qualified in _tensor_methods(framework):
            stack.enter_context(thread_patch(tensor, name).patched(
                lambda f, q=qualified: seen.wrap(q, f, method=True)))
        for h in held_functions(layer, root_path):
            setattr(h.layer, h.attribute, seen.wrap(h.function, h.original, held=h))
            stack.callback(setattr, h.layer, h.attribute, h.original)
        yield seen


def _popped(stack: list) -> None:
    """A post-hook's work, returning None: what a post-hook returns replaces the output."""
    stack.pop()


@functools.cache
def public_functions(namespace: str) -> tuple[tuple[str, object], ...]:
    """(name, function) for every public Python function of a module, in the order of their names,
    each as it is without another thread's dispatcher."""
    import importlib
    module = importlib.import_module(namespace)
    out = []
    for name in dir(module):
        f = _unpatched(getattr(module, name, None))
        if not name.startswith("_") and inspect.isfunction(f):
            out.append((name, f))
    return tuple(out)


def _unpatched(f):
    """A library attribute as it is without another thread's dispatcher (patches.py wraps the original)."""
    from .. import patches
    return f.__wrapped__ if inspect.isfunction(f) and f.__code__.co_filename == patches.__file__ else f


def resolved(function: str):
    """The function a qualified name names: a module's function, or a Tensor method's."""
    import importlib
    namespace, name = function.rsplit(".", 1)
    owner = sys.modules.get(namespace)
    if owner is None:  # paddle.Tensor.softmax: a class of a module
        module, cls = namespace.rsplit(".", 1)
        owner = getattr(importlib.import_module(module), cls)
    return _unpatched(getattr(owner, name))


@functools.cache
def _tensor_methods(framework: str) -> tuple[tuple[str, str], ...]:
    """(method, qualified name) for every Tensor method that is a Python function of the framework's
    namespaces with a signature (`paddle.Tensor.softmax` is `paddle.softmax`)."""
    import importlib
    modules = [importlib.import_module(n) for n in METHOD_NAMESPACES[framework]]
    if not modules:
        return ()
    tensor = resolved(TENSOR[framework])
    out = []
    for name in dir(tensor):
        f = _unpatched(getattr(tensor, name, None))
        if name.startswith("_") or not inspect.isfunction(f):
            continue
        if any(getattr(m, name, None) is f for m in modules):
            try:
                _signature(f)
            except (TypeError, ValueError):  # no signature to bind a call to: never recorded
                continue
            out.append((name, f"{TENSOR[framework]}.{name}"))
    return tuple(out)


@functools.cache
def _known(framework: str) -> dict:
    """id of each public Python function of the framework's namespaces -> its qualified name."""
    out = {}
    for namespace in NAMESPACES[framework] + METHOD_NAMESPACES[framework]:
        for name, f in public_functions(namespace):
            out.setdefault(id(f), (f"{namespace}.{name}", f))
    return out


def held_functions(layer, root_path: str) -> list[HeldFunction]:
    """The functions of the framework's namespaces that `layer` and the layers inside it hold as
    attributes of their own (an activation chosen at construction)."""
    known = _known(framework_of(layer))
    out = []
    for path, sub in named_layers(layer, root_path):
        for attribute, value in vars(sub).items():
            hit = known.get(id(value))
            if hit is not None and hit[1] is value:
                out.append(HeldFunction(path, sub, attribute, hit[0], value))
    return out
