"""Hook every module (torch) and layer (paddle), recording each call's inputs and outputs
in execution order. Outputs of any structure (tuple, dict, dataclass) are flattened to
their floating tensors.

A module called more than once in a forward (a pool, an activation, a block shared between places)
gives one Call per call: the first at the module's path, the k-th (k >= 2) at `call_key(path, k)`,
"path@k", so that each call can be paired, compared and judged on its own. A set of paths handed
to a recorder names calls: a module's path stands for every call of it, a call key for that call.

A pass that records only some modules need not run the model to its end: `stop_when_done` ends
the forward once every call of them has completed (counted by an earlier pass that ran it whole),
from a post-hook, with an exception of its own that the pass catches."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from ..tree import containers_copied, flatten, replace

from .port import Session


def call_tensors(args, kwargs, is_tensor) -> list:
    """The tensors a call received: positional, then keyword, each in tree.flatten's order."""
    return flatten((tuple(args), dict(kwargs)), is_tensor)


def replace_call_tensors(args, kwargs, is_tensor, new: dict) -> tuple[tuple, dict]:
    """(args, kwargs) with the call's tensor number k (in call_tensors' order) replaced by new[k]."""
    return replace((tuple(args), dict(kwargs)), new, is_tensor)


CALL_MARK = "@"  # between a module's path and the number of one of its calls: "features.pool@2"


def call_key(path: str, index: int) -> str:
    """The key of the `index`-th call (from 1) of the module at `path`: its path for the first call,
    "path@index" for a later one."""
    return path if index <= 1 else f"{path}{CALL_MARK}{index}"


def _module_name(part: str) -> str:
    """One part of a call key without the number of its call ("pool@2" -> "pool")."""
    head, mark, tail = part.rpartition(CALL_MARK)
    return head if mark and tail.isdigit() else part


def module_path(key: str) -> str:
    """The path of the module whose call `key` is ("a.pool@2" -> "a.pool"; a path is its own)."""
    return ".".join(_module_name(part) for part in key.split("."))


def is_first_call(key: str) -> bool:
    """`key` is a module's first call (its path), not a later one."""
    return module_path(key) == key


@dataclass
class Call:
    """One call of a module: where it sat in execution order, its inputs and outputs."""

    path: str
    type: str
    start: int
    end: int = -1
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    module: object = None  # the module or layer called
    count: int = 1  # how many times the module was called in the forward (so far, while it runs)
    index: int = 1  # which of those calls this one is (from 1); its key is call_key(module path, index)
    returned: object = None  # what it returned, as it returned it (where its outputs are kept as the tensors
    # themselves): the structure that `outputs`, its floating tensors in flatten's order, sit in


class CaptureTooLarge(Exception):
    """Recorded activations passed the memory limit: a low-memory strategy is needed."""


class PassComplete(CaptureTooLarge):
    """Every call a pass wants has completed: raised from a post-hook to end the forward there and
    caught by the pass that armed it (stop_when_done). A kind of CaptureTooLarge, which the
    handling of the model's own errors passes on as it is: both end a forward from this package's
    hooks, and neither is the model's failure."""

    def __init__(self, token):
        super().__init__("every call wanted has completed")
        self.token = token


def wanted_calls(paths, counts: dict | None) -> dict[str, int] | None:
    """module path -> the calls of it a forward makes, for the modules of the calls in `paths` (paths
    or call keys) that `counts` holds (call key -> its module's calls, as a pass that ran the forward
    whole counted them: Call.count; a module it never called is not waited for); None where there
    are no counts or no such call (the forward runs to its end)."""
    if counts is None or paths is None:
        return None
    out: dict[str, int] = {}
    for key in paths:
        if key in counts:
            path = module_path(key)
            out[path] = max(out.get(path, 0), counts[key])
    return out or None


def call_counts(calls: dict) -> dict[str, int]:
    """call key -> how many times its module was called, from a pass's recorded calls."""
    return {key: call.count for key, call in calls.items()}


@contextlib.contextmanager
def stop_when_done(side, model, until: dict[str, int] | None):
    """While the block runs a forward of `model` (on this thread): once every module at a path of
    `until` (path -> the calls of it the forward makes) has completed that many calls, the forward
    ends there (PassComplete from the last one's post-hook, caught here), so that what runs after
    them, which the pass does not record, does not run. A module's post-hooks run in the order they
    were added: arm it after the pass's own hooks, and their call is recorded first. None: the
    forward runs to its end. `side` is the framework's adapter."""
    if not until:
        yield
        return
    token = object()
    left = dict(until)
    layers = dict(side.named_layers(model))
    handles = []

    def done(path):
        def post(layer, args, output):
            if left.get(path, 0) <= 0:
                return
            left[path] -= 1
            if left[path] == 0:
                del left[path]
                if not left:
                    raise PassComplete(token)
        return post
    for path in until:
        if path in layers:
            handles += side.add_hooks(layers[path], post=done(path))
    try:
        yield
    except PassComplete as stop:
        if stop.token is not token:
            raise
    finally:
        for h in handles:
            h.remove()


class Allowance:
    """Bytes that recorders may hold between them (no limit when `limit` is None). Recorders
    that run at once share one: once it is exceeded, every recorder using it stops."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.held = 0
        self.exceeded = False
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            self.held += n
            self.exceeded = self.exceeded or (self.limit is not None and self.held > self.limit)
        if self.exceeded:
            raise CaptureTooLarge(self.held)


class Recorder:
    """Records calls of the modules named in `paths` (all when None; paths and call keys, see the
    module's notes). With keep=False only the order, types and output shapes are kept (an outline);
    with a set of paths, the inputs and outputs of those calls too; `allowance` bounds what is held.
    With every_call=False, a module's first call alone is recorded (its Call counts the others).

    Inputs and outputs are kept as the tensors themselves, not copies, so that holding them costs
    no memory the forward did not already use. An in-place operation after a call (torchvision's
    `out += identity`, `ReLU(inplace=True)`) would change what was recorded: each kept tensor's
    version counter is noted, and `stale()` names the calls whose tensors changed since; the
    paths in `copies` are recorded as copies instead.

    With attached=True (torch, for a backward through the recorded forward) every call's inputs
    are kept as copies detached from the graph and its outputs that require a gradient as the
    tensors themselves, attached to the graph, their gradients retained (`output.grad` after the
    backward); the outputs that require no gradient are not kept.

    With a `spill` (spill.Spill), every recorded call's inputs and outputs are written to it too,
    kept or not, to be read back instead of recording them again."""

    def __init__(self, paths=None, keep=True, allowance: Allowance | None = None, copies=frozenset(),
                 attached: bool = False, spill=None, every_call: bool = False):
        self.paths = paths
        self.every_call = every_call
        self._modules_wanted = None if paths is None else {module_path(key) for key in paths}
        self.keep = keep  # True, False, or the paths whose calls' tensors are kept
        self.attached = attached
        self.allowance = allowance or Allowance()
        self.copies = copies
        self.spill = spill
        self.is_tensor = None  # the framework's, set by record(): which inputs are tensors
        self.modules: dict = {}  # path -> the module or layer recorded there, set by record()
        self.taken = 0
        self.calls: dict[str, Call] = {}
        self.counter = 0
        self.handles = []
        self._versions = []  # (tensor kept, its version counter then, call key)
        self._seen: dict[str, int] = {}  # module path -> its calls so far
        self._of: dict[str, list[Call]] = {}  # module path -> its calls recorded
        self._open: dict[str, list] = {}  # module path -> keys of its calls begun, not ended (None: not recorded)

    def wants(self, path: str) -> bool:
        """Some call of the module at `path` is recorded (its hooks are needed)."""
        return self.paths is None or path in self._modules_wanted

    def _wanted(self, key: str) -> bool:
        return self.paths is None or key in self.paths or module_path(key) in self.paths

    def keeps(self, key: str) -> bool:
        if isinstance(self.keep, bool):
            return self.keep
        return key in self.keep or module_path(key) in self.keep

    def _pre(self, module, type_name, args, kwargs):
        n = self._seen[module] = self._seen.get(module, 0) + 1
        for call in self._of.get(module, ()):
            call.count = n
        path, begun = call_key(module, n), self._open.setdefault(module, [])
        if (n > 1 and not self.every_call) or not self._wanted(path):
            begun.append(None)
            return
        begun.append(path)
        if self.spill is not None:
            self.spill.record_inputs(path, args, kwargs)
        keep = self.keeps(path)
        if keep and self.is_tensor is not None:
            # the structures as they were at the call: a caller may append to a list it handed on
            args, kwargs = containers_copied((tuple(args), dict(kwargs)), self.is_tensor)
            tensors = call_tensors(args, kwargs, self.is_tensor)
            if self.attached or path in self.copies:
                copies = {}  # a tensor passed twice stays one copy
                for t in tensors:
                    if id(t) not in copies:
                        copies[id(t)] = t.detach().clone()
                args, kwargs = replace_call_tensors(args, kwargs, self.is_tensor,
                                                    {k: copies[id(t)] for k, t in enumerate(tensors)})
            else:
                self._versions += [(t, tensor_version(t), path) for t in tensors]
        call = self.calls[path] = Call(path, type_name, self.counter, module=self.modules.get(module),
                                       args=args if keep else (), kwargs=dict(kwargs) if keep else {}, count=n,
                                       index=n)
        self._of.setdefault(module, []).append(call)
        self.counter += 1

    def _post(self, module, output, is_tensor):
        begun = self._open.get(module)
        path = begun.pop() if begun else None  # the key of the module's innermost call begun
        call = None if path is None else self.calls.get(path)
        if call is None or call.end >= 0:
            return
        call.end = self.counter
        self.counter += 1
        tensors = flatten(output, is_tensor)
        call.shapes = [tuple(t.shape) for t in tensors]
        if self.spill is not None:
            self.spill.record_outputs(path, output)
        if self.keeps(path):
            if self.attached:
                call.outputs = [t for t in tensors if t.requires_grad]
                for t in call.outputs:
                    t.retain_grad()
            elif path in self.copies:
                call.outputs = [t.detach().clone() for t in tensors]
            else:
                call.outputs = [t.detach() for t in tensors]
                self._versions += [(t, tensor_version(t), path) for t in call.outputs]
            if not self.attached and path not in self.copies:  # a copy's original is not held for it
                call.returned = output
            nbytes = sum(int(t.numel()) * t.element_size() for t in tensors) * 2  # inputs alike
            self.taken += nbytes
            self.allowance.take(nbytes)

    def stale(self) -> set[str]:
        """Paths of calls whose kept inputs or outputs an in-place operation changed since."""
        return {path for t, version, path in self._versions if version is not None and tensor_version(t) != version}

    def release(self) -> None:
        """Let go of every tensor kept and give back to the allowance what they took (the calls are
        being recorded again)."""
        self.calls.clear()
        self._versions.clear()
        self._seen.clear()
        self._of.clear()
        self._open.clear()
        if self.spill is not None:
            self.spill.reset()
        with self.allowance._lock:
            self.allowance.held -= self.taken
        self.taken = 0

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def record(side, model, recorder: Recorder) -> Recorder:
    """Hooks that record the calls of `model`'s modules into `recorder`; `side` is the
    framework's adapter (frameworks.torch_side or paddle_side). A recorded pass begins: said on the
    progress line where one is drawn."""
    from .. import progress
    progress.forward_pass("torch" if "torch" in getattr(side, "__name__", "") else "paddle")
    recorder.is_tensor = side.is_tensor
    for path, layer in side.named_layers(model):
        if not recorder.wants(path):
            continue
        name = type(layer).__name__
        recorder.modules[path] = layer
        recorder.handles += side.add_hooks(
            layer, pre=lambda lay, args, kwargs, _p=path, _n=name: recorder._pre(_p, _n, args, kwargs),
            post=lambda lay, args, out, _p=path: recorder._post(_p, out, side.is_float_tensor))
    return recorder


def tensor_version(t) -> int | None:
    """A tensor's in-place version counter (torch's `_version`, paddle's `_inplace_version()`),
    shared with the tensors detached from it."""
    try:  # torch's inference tensors keep no version counter, and say so by raising
        version = getattr(t, "_version", None)
        if version is None and callable(getattr(t, "_inplace_version", None)):
            version = t._inplace_version()
    except RuntimeError:
        return None
    return version if isinstance(version, int) else None


def _record_pass(side, model, run, recorder: Recorder, until: dict | None = None) -> Recorder:
    record(side, model, recorder)
    spill = recorder.spill
    try:
        with stop_when_done(side, model, until), (contextlib.nullcontext() if spill is None else spill.watching()):
            run()
    finally:
        recorder.remove()
    if spill is not None:
        spill.finish()
    return recorder


def capture_calls(side, model, run, paths, keep=True, allowance: Allowance | None = None,
                  until: dict | None = None, spill=None) -> Recorder:
    """`run()` once with the calls of `model`'s modules at `paths` (paths and call keys) recorded,
    every call of a module called more than once its own; once more, recording as copies the
    calls whose kept tensors an in-place operation changed afterwards (see Recorder). `until`
    (path -> calls; see stop_when_done): the forward ends once those calls have completed.
    `spill`: every call's tensors written to it too (see Recorder)."""
    made = lambda copies=frozenset(), allowed=allowance: Recorder(paths, keep, allowed, copies=copies, spill=spill,
                                                                   every_call=True)
    recorder = _record_pass(side, model, run, made(), until)
    stale = recorder.stale() if keep is not False else set()
    if stale:  # an in-place operation changed what some calls returned or received: record those as copies
        recorder.release()  # the first pass's tensors go before the second pass holds its own
        recorder = _record_pass(side, model, run, made(frozenset(stale), recorder.allowance), until)
    return recorder


def capture_torch(session: Session, paths=None, keep=True, allowance: Allowance | None = None,
                  until: dict | None = None, spill=None) -> Recorder:
    """One torch forward recording the modules at `paths` (all when None), ending once the calls
    `until` counts have completed (see stop_when_done); `spill`: see Recorder."""
    from ..frameworks import torch_side
    return capture_calls(torch_side, session.torch_model, session.run_torch, paths, keep, allowance, until, spill)


def capture_paddle(session: Session, paths=None, keep=True, allowance: Allowance | None = None,
                   until: dict | None = None, spill=None) -> Recorder:
    """One paddle forward recording the layers at `paths` (all when None), ending as capture_torch."""
    from ..frameworks import paddle_side
    return capture_calls(paddle_side, session.paddle_model, session.run_paddle, paths, keep, allowance, until,
                         spill)
