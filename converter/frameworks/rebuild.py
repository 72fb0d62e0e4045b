"""A layer built afresh, with no memory for its weights (paddle's LazyGuard under a name generator of
its own, torch's meta device), from the constructor arguments it keeps, and with one of them
changed: which tensors each build holds, in which shapes, is measured, never read from names.

The arguments are read back from the layer: each constructor argument from the attribute it is
stored under (bare or with a leading underscore), the default for the rest; a size the layer does
not keep (paddle's Linear keeps neither of its features) is searched among its weights' axis
lengths, kept where the build holds the layer's weights in their shapes. An argument is changed to
the values its default, its annotation (the strings of a Literal, resolved in the constructor's
module, also where it is named for type checking only) or the counterpart's same-named setting
suggest, and a boolean to its opposite (`constructor_change`): the change whose build holds the
tensors the layer lacks, in the shapes wanted, names the argument that builds them (a paddle LSTM
built with direction='forward' where torch's is bidirectional, a Linear built with bias_attr=False).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from itertools import product

_MISSING = object()
MAX_SIZES_UNKEPT = 2  # sizes a layer does not keep, searched among its weights' axis lengths
MAX_LENGTHS = 6  # ... where its weights have at most this many distinct axis lengths


def _scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def kept_value(value) -> bool:
    """A value a constructor argument may be read back from: a scalar, or a short sequence of
    scalars or of pairs (a padding per side)."""
    if _scalar(value):
        return True
    return isinstance(value, (tuple, list)) and len(value) <= 8 and all(
        _scalar(v) or isinstance(v, (tuple, list)) and len(v) <= 4 and all(map(_scalar, v)) for v in value)


def parameters(layer) -> list | None:
    """The constructor's named parameters (no *args, **kwargs); None where it has no signature."""
    try:
        return [p for p in list(inspect.signature(type(layer).__init__).parameters.values())[1:]
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return None


def shapes(layer) -> dict:
    """Name -> shape of every entry of the layer's state dict (the tensors a checkpoint fills)."""
    return {name: tuple(t.shape) for name, t in layer.state_dict().items() if t is not None}


def holds(built, layer) -> bool:
    """Whether `built` holds every weight `layer` holds, in its shape (it may hold more), under one
    of the names `layer` gives it (paddle's LSTM names a weight twice, 'weight_ih_l0' and
    '0.cell.weight_ih', and the second name moves with its direction); either may be given as its
    shapes(), where each name is a weight of its own."""
    theirs = built if isinstance(built, dict) else shapes(built)
    if isinstance(layer, dict):
        groups = [((name,), shape) for name, shape in layer.items()]
    else:
        by_tensor: dict = {}
        for name, t in layer.state_dict().items():
            if t is not None:
                by_tensor.setdefault(id(t), ([], tuple(t.shape)))[0].append(name)
        groups = list(by_tensor.values())
    return all(any(theirs.get(name) == shape for name in names) for names, shape in groups)


def built(layer, arguments: dict, params: list | None = None):
    """A layer of `layer`'s type built from `arguments`, its weights given shapes and no memory
    (paddle's LazyGuard under a name generator of its own, torch's meta device)."""
    cls, args, kwargs = _call(layer, arguments, params)
    if hasattr(layer, "named_sublayers"):
        import paddle
        with paddle.utils.unique_name.guard(), paddle.LazyGuard():  # its own names: the models' stay as they are
            return cls(*args, **kwargs)
    import torch
    with torch.device("meta"):
        return cls(*args, **kwargs)


def built_shapes(layer, arguments: dict, params: list | None = None) -> dict:
    """shapes() of `layer`'s type built from `arguments` (see built). A paddle layer whose lazy build
    fails (an RNN packs its weights into one buffer as it is built, which lazy weights cannot be) is
    described in a static program of its own instead: the calling thread alone leaves dynamic mode,
    nothing runs, nothing is allocated, and the shapes are read while the program is alive."""
    try:
        return shapes(built(layer, arguments, params))
    except Exception as lazy_failed:  # noqa: BLE001 - tried again below, raised again where that fails too
        import paddle
        static = getattr(paddle.base.framework, "_dygraph_guard", None) if hasattr(layer, "named_sublayers") else None
        if static is None:
            raise
        cls, args, kwargs = _call(layer, arguments, params)
        try:
            with paddle.utils.unique_name.guard(), static(None), \
                    paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
                return shapes(cls(*args, **kwargs))
        except Exception:  # noqa: BLE001 - the lazy build's error is the one that says why
            raise lazy_failed from None


def _call(layer, arguments: dict, params: list | None) -> tuple:
    """(the class, positional arguments, keyword arguments) that build `layer` from `arguments`."""
    params = params if params is not None else parameters(layer)
    args = [arguments[p.name] for p in params if p.kind == p.POSITIONAL_ONLY and p.name in arguments]
    kwargs = {p.name: arguments[p.name] for p in params if p.kind != p.POSITIONAL_ONLY and p.name in arguments}
    return type(layer), args, kwargs


def arguments(layer) -> tuple[list, dict] | None:
    """The constructor's parameters and the arguments that build `layer`'s weights in their shapes
    (see the module's notes); None where no such arguments are found."""
    params = parameters(layer)
    if params is None:
        return None
    kept = vars(layer)
    out, unkept = {}, []
    for p in params:
        value = next((kept[k] for k in (p.name, "_" + p.name) if k in kept and kept_value(kept[k])), _MISSING)
        if value is None and p.default not in (None, p.empty):
            value = _MISSING  # an attribute of the name left None (a Layer's absent `bias`), not this setting
        if value is not _MISSING:
            out[p.name] = value
        elif p.default is p.empty:
            unkept.append(p.name)
    if not unkept:
        return params, out
    lengths = sorted({n for shape in shapes(layer).values() for n in shape})
    if len(unkept) > MAX_SIZES_UNKEPT or not lengths or len(lengths) > MAX_LENGTHS:
        return None
    for sizes in product(lengths, repeat=len(unkept)):
        tried = {**out, **dict(zip(unkept, sizes))}
        try:
            build = built_shapes(layer, tried, params)
        except Exception:  # noqa: BLE001 - sizes the constructor refuses are not the layer's
            continue
        if holds(build, layer) and holds(layer, build):
            return params, tried
    return None


@functools.lru_cache(maxsize=64)
def _literal_names(module_name: str) -> dict:
    """Name -> the strings of the Literal assigned to it in the module's source (also under `if
    TYPE_CHECKING:`, where the name is not defined when the module runs)."""
    module = sys.modules.get(module_name)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError, SyntaxError):
        tree = None
    out = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            strings = _literal_strings(node.value, {})
            if strings:
                out[node.targets[0].id] = strings
    return out


def _literal_strings(node, names: dict) -> tuple:
    """The strings of every Literal[...] in an annotation's tree, names resolved through `names`."""
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and getattr(n.value, "id", getattr(n.value, "attr", "")) == "Literal":
            found += [c.value for c in ast.walk(n.slice) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        elif isinstance(n, ast.Name) and n.id in names:
            found += names[n.id]
    return tuple(dict.fromkeys(found))


def annotated_choices(layer, parameter) -> tuple:
    """The strings a constructor parameter's annotation allows (its Literal's), in order; () where it
    names none."""
    annotation = parameter.annotation
    if annotation is parameter.empty:
        return ()
    if not isinstance(annotation, str):
        import typing
        args = typing.get_args(annotation)
        nested = [a for a in args if typing.get_args(a)]
        return tuple(dict.fromkeys([a for a in args if isinstance(a, str)]
                                   + [s for a in nested for s in typing.get_args(a) if isinstance(s, str)]))
    try:
        tree = ast.parse(annotation, mode="eval")
    except SyntaxError:
        return ()
    return _literal_strings(tree, _literal_names(getattr(type(layer).__init__, "__module__", "") or ""))


def candidates(layer, parameter, value, counterpart=None) -> list:
    """Other values for `parameter` (now `value`), in the order tried: its default, its annotation's
    choices, the opposite of a boolean, the counterpart module's setting of the same name."""
    out = []
    if parameter.default is not parameter.empty:
        out.append(parameter.default)
    out += annotated_choices(layer, parameter)
    if isinstance(value, bool):
        out.append(not value)
    theirs = getattr(counterpart, parameter.name, _MISSING) if counterpart is not None else _MISSING
    if theirs is not _MISSING and _scalar(theirs):
        out.append(theirs)
    kept = []
    for v in out:
        if not _same(v, value) and not any(_same(v, k) for k in kept):
            kept.append(v)
    return kept


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def constructor_change(layer, wanted: dict, counterpart=None) -> dict | None:
    """{argument: value}: the constructor arguments, changed, whose build of `layer` holds every
    tensor in `wanted` (name -> shape) in that shape and `layer`'s own in theirs, where the build
    from what `layer` keeps holds its own but not all of `wanted`: one argument where one change
    does it, else the changes that each build some of `wanted` together (a LayerNorm built without
    its weight and its bias); None where no such change is found. `counterpart`: the other
    framework's module, whose same-named settings are tried too."""
    found = arguments(layer)
    if found is None:
        return None
    params, kept = found
    try:
        has = built_shapes(layer, kept, params)
    except Exception:  # noqa: BLE001 - a layer not built again from what it keeps: no change can be measured
        return None
    fits = lambda built_: {k for k, s in wanted.items() if built_.get(k) == tuple(s)}
    if not holds(has, layer) or fits(has) == set(wanted):
        return None
    partial = {}  # argument -> the first value whose build holds more of `wanted`
    for p in params:
        value = kept.get(p.name, p.default)
        for to in candidates(layer, p, value, counterpart):
            try:
                theirs = built_shapes(layer, {**kept, p.name: to}, params)
            except Exception:  # noqa: BLE001 - a value the constructor refuses is no candidate
                continue
            if not holds(theirs, layer) or not fits(theirs) > fits(has):
                continue
            if fits(theirs) == set(wanted):
                return {p.name: to}
            partial.setdefault(p.name, to)
    if len(partial) < 2:
        return None
    try:
        together = built_shapes(layer, {**kept, **partial}, params)
    except Exception:  # noqa: BLE001 - changes the constructor refuses together are no answer
        return None
    return partial if holds(together, layer) and fits(together) == set(wanted) else None
