"""Walking nested values: a model's outputs, a call's arguments, a spec's inputs.

One rule for the containers walked, in one order, for every walker in the package:

- a dict (any subclass: OrderedDict, an HF or PaddleNLP ModelOutput): its values in key order;
  rebuilt as a copy of the same type with the same keys, so a layer that checks its input with
  isinstance still accepts it;
- a namedtuple, a tuple, a list: by position; rebuilt in the same type;
- a dataclass instance (that is no dict): its fields in declaration order; rebuilt as a copy of
  the same type with the fields set;
- anything else that is not a leaf: no leaves, kept as it is.

Containers are walked at most MAX_DEPTH inside one another: a value nested deeper (a tuple inside
a tuple 3000 times) is a UserError saying so, never a RecursionError.

Which values are leaves is the caller's `is_leaf`; the rule for the tensors verification
compares is `is_float_tensor` (a floating tensor of either framework, of any width: a float16
or bfloat16 output is compared, not dropped). Neither framework is imported here: a value
can only be one of their tensors once its framework is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any, Callable

Leaf = Callable[[Any], bool]

MAX_DEPTH = 100  # containers inside containers: a model's outputs nest a few deep (HF's caches: 3)


def _too_deep() -> Exception:
    from .errors import UserError
    return UserError(f"a model's output, a call's arguments or a spec's inputs nest containers (tuples, lists, "
                     f"dicts, dataclasses) more than {MAX_DEPTH} deep; return tensors nested at most {MAX_DEPTH} deep")

PADDLE_FLOATS = ("float16", "bfloat16", "float32", "float64")  # the float dtypes paddle's tensors convert from


def is_torch_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_paddle_tensor(value) -> bool:
    paddle = sys.modules.get("paddle")
    return paddle is not None and isinstance(value, paddle.Tensor)


def is_tensor(value) -> bool:
    """A tensor of either framework."""
    return is_torch_tensor(value) or is_paddle_tensor(value)


def is_float_tensor(value) -> bool:
    """A floating tensor of either framework, of any width: the leaves verification compares."""
    if is_torch_tensor(value):
        return value.is_floating_point()
    return is_paddle_tensor(value) and str(value.dtype).rpartition(".")[2] in PADDLE_FLOATS


def _children(value) -> list | None:
    """The (key, child) pairs of a container, or None for a value that is none."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (tuple, list)):
        return list(enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def _rebuild(value, items: list):
    """A container of `value`'s type holding `items`, the (key, child) pairs _children gave."""
    if isinstance(value, dict):
        if type(value) is dict:
            return dict(items)
        new = copy.copy(value)  # OrderedDict, defaultdict, ModelOutput: type, keys and attributes kept
        for k, v in items:
            new[k] = v
        return new
    if isinstance(value, (tuple, list)):
        children = [v for _, v in items]
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*children)
        return type(value)(children)
    new = copy.copy(value)  # a dataclass: copied, not rebuilt through __init__ (init=False fields, frozen ones)
    for k, v in items:
        object.__setattr__(new, k, v)
    return new


def flatten(value, is_leaf: Leaf = is_float_tensor) -> list:
    """The leaves of a nested value, in the walk's order."""
    out: list = []

    def walk(v, on_path: frozenset) -> None:
        if is_leaf(v):
            out.append(v)
            return
        children = _children(v)
        if children is None or id(v) in on_path:  # a container holding itself: walked once
            return
        if len(on_path) >= MAX_DEPTH:
            raise _too_deep()
        inside = on_path | {id(v)}
        for _, child in children:
            walk(child, inside)

    walk(value, frozenset())
    return out


def map_leaves(value, fn: Callable[[Any], Any], is_leaf: Leaf = is_float_tensor, copy: bool = False):
    """`value` with each leaf replaced by fn(leaf), in flatten's order; a container with a changed
    leaf inside rebuilt in its own type, everything else kept as it is (the same object), unless
    `copy`: then every container is rebuilt."""
    def walk(v, on_path: frozenset):
        if is_leaf(v):
            return fn(v)
        children = _children(v)
        if children is None or id(v) in on_path:
            return v
        if len(on_path) >= MAX_DEPTH:
            raise _too_deep()
        inside = on_path | {id(v)}
        items = [(k, walk(c, inside)) for k, c in children]
        if not copy and all(new is old for (_, new), (_, old) in zip(items, children)):
            return v  # nothing inside changed: the container itself, not a copy
        return _rebuild(v, items)

    return walk(value, frozenset())


def replace(value, new: dict | list, is_leaf: Leaf = is_float_tensor):
    """`value` with its leaf number k (in flatten's order) replaced by new[k]: a dict gives some
    of them (the rest kept), a list gives all of them, one each, in order."""
    if isinstance(new, list):
        if len(new) != len(flatten(value, is_leaf)):
            raise ValueError(f"{len(new)} replacements for {len(flatten(value, is_leaf))} leaves")
        new = dict(enumerate(new))
    count = iter(range(sys.maxsize))
    return map_leaves(value, lambda leaf: new.get(next(count), leaf), is_leaf)


def containers_copied(value, is_leaf: Leaf = is_float_tensor):
    """`value` with every list, dict and other container in it copied, its leaves and other values the
    same objects: a snapshot of a structure that its owner may change later (DenseNet hands each
    layer the list of features that it appends to afterwards)."""
    return map_leaves(value, lambda leaf: leaf, is_leaf, copy=True)


def model_copy(model, memo: dict | None = None):
    """copy.deepcopy(model, memo), with the functions set on its objects copied too. deepcopy shares
    functions, and one set on an instance (`model.forward = lambda x: forward(x) * 2`, a spec's way to
    change what a model returns) closes over the original's methods: the copy would run the original's
    layers (a float64 copy, the float32 ones). Such a function is rebuilt with its closure's contents
    copied through the same memo, a bound method of an original object bound to that object's copy."""
    import types
    memo = {} if memo is None else memo
    copied = copy.deepcopy(model, memo)
    for obj in _objects(copied):
        for name, value in list(vars(obj).items()):
            if isinstance(value, types.FunctionType) and value.__closure__:
                cells = tuple(types.CellType(_copied_cell(c.cell_contents, memo)) for c in value.__closure__)
                fresh = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, cells)
                object.__setattr__(obj, name, fresh)
    return copied


def _objects(model) -> list:
    """The model and its layers (torch's modules(), paddle's sublayers(include_self=True))."""
    if hasattr(model, "modules"):
        return list(model.modules())
    return model.sublayers(include_self=True) if hasattr(model, "sublayers") else [model]


def _copied_cell(value, memo: dict):
    """A closure's content as the copy's: a bound method of an original object bound to that object's
    copy (the class's method: the copy's instance attribute is the function being rebuilt); a
    function as it is; anything else deep-copied through `memo`."""
    import types
    if isinstance(value, types.MethodType) and id(value.__self__) in memo:
        return types.MethodType(value.__func__, memo[id(value.__self__)])
    if isinstance(value, types.FunctionType):
        return value
    return copy.deepcopy(value, memo)
