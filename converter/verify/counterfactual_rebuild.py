"""Whole-number settings of a layer that holds weights, tried where measurement says they are not its
structure (verify/counterfactual.py's search).

A layer's whole numbers are either its structure (counts of layers, heads, channels, features) or
how it runs over its input (a stride, a padding, a dilation). Which is which is measured, never read
from names: the layer is built afresh from what it keeps (each constructor argument read back from
the attribute it is stored under, the default for the rest), once as it is and once with the
counterpart's value for the same constructor argument, with no memory for the weights (paddle's
LazyGuard, torch's meta device). Where the first build holds the live layer's weights in their
shapes and the second holds weights of the first's shapes, the setting is not structure and may be
tried; the re-run then sets on the live layer every attribute that differs between the two builds
(paddle's Conv2D reads its padding from an attribute derived from it). A value that changes any
weight's shape is never tried: native kernels trust such counts, and a changed one can crash the
process (an LSTM's num_layers).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from .counterfactual_settings import same as _same, settings

_MISSING = object()


@dataclass(frozen=True)
class Measured:
    """A whole-number setting that is not structure: the attribute, its value, the constructor's
    argument and the value tried for it, and every attribute the changed build sets otherwise."""

    name: str
    was: object
    parameter: str
    to: object
    assigned: tuple  # ((attribute, live value, value under the change), ...)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _kept_value(value) -> bool:
    """A value a constructor argument may be read back from: a scalar, or a short sequence of
    scalars or of pairs (a padding per side)."""
    if _scalar(value):
        return True
    return isinstance(value, (tuple, list)) and len(value) <= 8 and all(
        _scalar(v) or isinstance(v, (tuple, list)) and len(v) <= 4 and all(map(_scalar, v)) for v in value)


def _parameters(layer) -> list | None:
    try:
        return [p for p in list(inspect.signature(type(layer).__init__).parameters.values())[1:]
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return None


MAX_SIZES_UNKEPT = 2  # sizes a layer does not keep (paddle's Linear keeps neither of its features), searched


def _arguments(layer) -> tuple[list, dict] | None:
    """The constructor's parameters and the arguments that build `layer`'s weights in their shapes:
    the values it keeps under the parameters' names (bare or with a leading underscore), the
    defaults for the rest; a parameter without a default that it does not keep (a size) is given,
    in turn, each length of its weights' axes, and kept where the build holds `layer`'s weights in
    their shapes. None where no such arguments are found."""
    parameters = _parameters(layer)
    if parameters is None:
        return None
    kept = vars(layer)
    out, unkept = {}, []
    for p in parameters:
        value = next((kept[k] for k in (p.name, "_" + p.name) if k in kept and _kept_value(kept[k])), _MISSING)
        if value is not _MISSING:
            out[p.name] = value
        elif p.default is p.empty:
            unkept.append(p.name)
    if not unkept:
        return parameters, out
    lengths = sorted({n for shape in _shapes(layer).values() for n in shape})
    if len(unkept) > MAX_SIZES_UNKEPT or not lengths or len(lengths) > 6:
        return None
    from itertools import product
    for sizes in product(lengths, repeat=len(unkept)):
        tried = {**out, **dict(zip(unkept, sizes))}
        try:
            built = _built(layer, tried, parameters)
        except Exception:  # noqa: BLE001 - sizes the constructor refuses are not the layer's
            continue
        if _holds(built, layer) and _holds(layer, built):
            return parameters, tried
    return None


def _built(layer, arguments: dict, parameters: list | None = None):
    """A layer of `layer`'s type built from `arguments`, its weights given shapes and no memory."""
    parameters = parameters if parameters is not None else _parameters(layer)
    args = [arguments[p.name] for p in parameters if p.kind == p.POSITIONAL_ONLY and p.name in arguments]
    kwargs = {p.name: arguments[p.name] for p in parameters if p.kind != p.POSITIONAL_ONLY and p.name in arguments}
    if hasattr(layer, "named_sublayers"):
        import paddle
        with paddle.utils.unique_name.guard(), paddle.LazyGuard():  # its own names: the models' stay as they are
            return type(layer)(*args, **kwargs)
    import torch
    with torch.device("meta"):
        return type(layer)(*args, **kwargs)


def _shapes(layer) -> dict:
    tensors = list(layer.named_parameters()) + list(layer.named_buffers())
    return {name: tuple(t.shape) for name, t in tensors if t is not None}


def _holds(built, layer) -> bool:
    """Whether `built` holds every weight `layer` holds, in its shape (it may hold more: an optional
    weight, a bias, that the live layer was built without and keeps no flag for)."""
    theirs = _shapes(built)
    return all(theirs.get(name) == shape for name, shape in _shapes(layer).items())


class Rebuilder:
    """`layer` built afresh as it is, once, and the settings measured against that build."""

    def __init__(self, layer, framework_keys: frozenset):
        self.layer, self.keys = layer, framework_keys
        self.found = _arguments(layer)
        self._same_build = _MISSING

    def _as_it_is(self):
        if self._same_build is _MISSING:
            self._same_build = None
            if self.found is not None:
                try:
                    built = _built(self.layer, self.found[1])
                except Exception:  # noqa: BLE001 - a layer not built again from what it keeps: its whole numbers stay untried
                    built = None
                if built is not None and _holds(built, self.layer):
                    self._same_build = built
        return self._same_build

    def measured(self, name: str, was, parameter: str, to) -> Measured | None:
        """The setting `name` (the constructor's `parameter`) at `to`, where the layer built with it
        holds weights of the same shapes; None where it is structure, or cannot be told."""
        same = self._as_it_is()
        if same is None:
            return None
        try:
            changed = _built(self.layer, {**self.found[1], parameter: to})
        except Exception:  # noqa: BLE001 - a value the constructor refuses is no candidate
            return None
        if _shapes(changed) != _shapes(same):
            return None
        before, after, live = (settings(x, self.keys) for x in (same, changed, self.layer))
        differ = [k for k in before if k in after and not _same(before[k], after[k])]
        if name not in differ or any(k not in live or not _same(live[k], before[k]) for k in differ):
            return None  # the build does not keep the setting as the live layer does
        return Measured(name, was, parameter, to, tuple((k, live[k], after[k]) for k in differ))

