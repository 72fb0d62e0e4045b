"""A custom backward as the cause of a per-layer backward culprit, where re-running says so.

Paddle names each node of the gradient graph it builds; a paddle.autograd.PyLayer's is
"GradNodePyLayer_<class>". Walking the culprit layer's graph from its outputs back to its inputs
(re-run on torch's recorded inputs) finds the custom backwards its gradient runs through: read
from the graph, not from the code. One is named the cause only where the layer's backward, re-run
with each of them applied as its forward under autograd (its own backward left out), gives
torch's gradient within the budget: a correct custom backward beside the real bug (a detach) is
not blamed."""

from __future__ import annotations

import contextlib

from .backward_whatif import culprit_layer

PYLAYER_NODE = "GradNodePyLayer_"  # the name paddle gives a custom backward's node in its gradient graph


class _Context:
    """What a PyLayer's forward is handed in place of paddle's context, run under autograd: what it
    saves is kept, what it marks is left to autograd."""

    def save_for_backward(self, *tensors):
        self.saved = tensors

    def saved_tensor(self):
        return self.saved

    def __getattr__(self, name):  # mark_non_differentiable, set_materialize_grads, ...: autograd decides
        return lambda *args, **kwargs: None


def _classes(names: list[str]) -> list:
    """The PyLayer classes of those names (every subclass, however deep)."""
    import paddle
    out, todo = [], list(paddle.autograd.PyLayer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__name__ in names:
            out.append(cls)
    return out


@contextlib.contextmanager
def _under_autograd(classes: list):
    """Each class's apply, on this thread, its forward run under autograd (patches.thread_patch)."""
    from ..patches import thread_patch
    with contextlib.ExitStack() as stack:
        for cls in classes:
            forward = cls.forward
            stack.enter_context(thread_patch(cls, "apply").patched(
                lambda _original, _f=forward: (lambda *args, **kwargs: _f(_Context(), *args, **kwargs))))
        yield


def _pylayers(nodes: list) -> list[str]:
    found, seen, todo = [], set(), list(nodes)
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = node.name()
        if name.startswith(PYLAYER_NODE) and name[len(PYLAYER_NODE):] not in found:
            found.append(name[len(PYLAYER_NODE):])
        todo.extend(node.next_functions)
    return found


def _in_graph(root, half, local) -> list[str]:
    from ..frameworks import paddle_side
    from ..tree import flatten
    from .local_runs import paddle_call
    args, kwargs, _ = paddle_call(half.unit.call, local.p_calls.get(half.unit.ppath))
    for t in flatten((args, kwargs), paddle_side.is_tensor):
        if paddle_side.is_float_tensor(t):
            t.stop_gradient = False
    outs = flatten(root(*args, **kwargs), paddle_side.is_tensor)
    return _pylayers([o.grad_fn for o in outs if getattr(o, "grad_fn", None) is not None])


def custom_backwards(session, local, fb) -> tuple[list[str], float | None]:
    """(the PyLayer classes in the culprit's gradient graph, the culprit row's ratio with all of them
    run under autograd: within 1 confirms them as the cause); ([], None) where it holds none or
    cannot be re-run."""
    with culprit_layer(session, local, fb) as found:
        if found is None:
            return [], None
        half, root, run = found
        names = _in_graph(root, half, local)
        classes = _classes(names)
        if not classes:
            return names, None
        with _under_autograd(classes):
            mine = run().get((fb.torch, fb.paddle))
        return names, None if mine is None else mine.ratio
