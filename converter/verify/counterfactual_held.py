"""Causes found by re-running with another activation in the place of one a layer holds.

A port may choose its activation at construction and keep the function (`self.activation =
getattr(F, config.hidden_act)`): a wrong word there is a wrong function, not a wrong argument. Where
a held function is elementwise on the input it was called with (the same shape out, and the same
values, moved alike, when its input's elements are shuffled into one axis), every function of
`paddle.nn.functional` that measures elementwise on that input (and gives other values than the
held one) is put in its place in turn, nearest first, and the layer re-run: a function under which
paddle's output lands within the layer's budget of torch's is a cause, confirmed by re-running.
Where no held function is, a paddle.nn.functional function the layers call directly on one tensor
(`F.relu(h)`) is searched the same way, in that one call's place.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..diagnosis import GIVES_OUTPUT, Diagnosis, confirmed_cause, went
from .counterfactual_wrapping import held_functions, public_functions, resolved, wrapped

KIND = "held function"
CALLED = "call"  # Replaced.attribute of a function called directly (its k-th call of n: "call k of n")
NAMESPACE = "paddle.nn.functional"
MOST_ELEMENTS = 1 << 16  # a larger input is measured on its first rows: an elementwise function is so on any


@dataclass(frozen=True)
class Replaced:
    path: str  # the layer holding the function
    attribute: str
    was: str  # qualified names
    to: str
    ratio: float

    def diagnosis(self, culprit: str, before: float, other: str = "", gives: str = GIVES_OUTPUT) -> Diagnosis:
        where, short = self.path or "<model>", self.was.rsplit(".", 1)[-1]
        if self.attribute.startswith(CALLED):  # called directly in the layer's forward, as its k-th call of n
            nth = f" ({self.attribute} there)" if self.attribute != CALLED else ""
            what = f"calls {self.was}{nth}"
            hint = f"call {self.to.rsplit('.', 1)[-1]} where {self.path or 'the model'}'s forward calls {short}{nth}"
        else:
            what = f"holds {self.was} as its {self.attribute}"
            hint = f"make {self.path or 'the model'}'s {self.attribute} {self.to} (it holds {short})"
        return Diagnosis(culprit, confirmed_cause(f"paddle's {where} {what}", "re-run on torch's recorded inputs",
                                                  f"{self.to} in its place", gives, went(before, self.ratio)),
                         hint, kind=KIND)


def held_causes(layer, root_path: str, seen, run, judge, runs) -> list[Replaced]:
    """For each elementwise function `layer` or a layer inside it holds and called in the run `seen`
    recorded, the other elementwise functions of paddle.nn.functional put in its place that reproduce
    torch (see the module's docstring), best first; where none does, the same for the functions the
    layers call directly."""
    hits = []
    for places in (_held, _called):
        for x, original, put, replaced in places(layer, root_path, seen):
            values = _sample(x)
            mine = _elementwise(original, values)
            if mine is None:  # not elementwise on its input: no activation to swap
                continue
            for name, f in _others(values, mine):
                if not runs.take():
                    return sorted(hits, key=lambda c: c.ratio)
                with put(f):  # a layer that refuses the function, or its restore, raises: a fault of the search
                    try:
                        ratio = judge(run())
                    except Exception:  # noqa: BLE001 - a function the layer cannot run with is not the cause
                        ratio = None
                if ratio is not None and ratio <= 1.0:
                    hits.append(replaced(f"{NAMESPACE}.{name}", ratio))
        if hits:
            return sorted(hits, key=lambda c: c.ratio)
    return []


def _held(layer, root_path: str, seen):
    """(its input, the function, a context that puts another in its place, the Replaced it makes) for
    each function `layer` or a layer inside it holds and called in the run `seen` recorded."""
    for h in held_functions(layer, root_path):
        x = seen.inputs.get((h.path, h.attribute))
        if x is not None:  # never called: no activation to swap
            replaced = functools.partial(Replaced, h.path, h.attribute, h.function)
            yield x, h.original, functools.partial(_holding, h), replaced


@contextmanager
def _holding(h, f):
    setattr(h.layer, h.attribute, f)
    try:
        yield
    finally:
        setattr(h.layer, h.attribute, h.original)


def _called(layer, root_path: str, seen):
    """_held for the elementwise functions of paddle.nn.functional the layers call directly (`F.relu(h)`
    in a forward): each call re-run with another in its place."""
    for key, x in seen.inputs.items():
        if len(key) != 3:  # a held function's, searched by _held
            continue
        path, function, index = key
        of = sum(1 for c in seen.calls if c.function == function and c.layer == path)
        which = f"{CALLED} {index + 1} of {of}" if of > 1 else CALLED
        change = (function, path, index, None)
        yield (x, resolved(function), lambda f, change=change: wrapped(layer, root_path, (*change, f)),
               functools.partial(Replaced, path, which, function))


def _sample(x) -> np.ndarray:
    """`x`'s values as numpy, its first rows where it is large."""
    values = x.numpy()
    if values.size > MOST_ELEMENTS and values.ndim > 1:
        rows = values.reshape(-1, values.shape[-1])
        values = rows[: max(2, MOST_ELEMENTS // rows.shape[1])]
    return values


def _elementwise(f, values: np.ndarray):
    """`f`'s output on `values` where it is elementwise on them; None elsewhere."""
    y = _applied(f, values)
    if y is None or y.shape != values.shape or y.dtype != values.dtype or values.ndim < 2:
        return None
    order = np.random.RandomState(0).permutation(values.size)
    shuffled = _applied(f, values.ravel()[order])
    if shuffled is None or not np.allclose(shuffled, y.ravel()[order], rtol=1e-6, atol=1e-7, equal_nan=True):
        return None
    return y


def _applied(f, values: np.ndarray) -> np.ndarray | None:
    """`f` on a tensor of `values` alone, as numpy; None where it takes no such call or gives no
    tensor. Paddle's random state is kept: a random function drawn here draws nothing a later run sees."""
    import paddle
    state = paddle.get_rng_state()
    try:
        with warnings.catch_warnings(), paddle.no_grad():
            warnings.simplefilter("ignore")
            y = f(paddle.to_tensor(values))
    except Exception:  # noqa: BLE001 - a function that cannot take the input alone is no activation of it
        return None
    finally:
        paddle.set_rng_state(state)
    return y.numpy() if isinstance(y, paddle.Tensor) else None


def _others(values: np.ndarray, mine: np.ndarray) -> list[tuple[str, object]]:
    """(name, function) of paddle.nn.functional's functions elementwise on `values` whose outputs
    differ from `mine` and from each other's, nearest to `mine` first."""
    found = []  # (distance, name, function, output)
    for name, f in _one_tensor_functions():
        y = _elementwise(f, values)
        if y is None:
            continue
        if np.allclose(y, mine, rtol=1e-6, atol=1e-7, equal_nan=True) or \
                any(np.allclose(y, o, rtol=1e-6, atol=1e-7, equal_nan=True) for *_, o in found):
            continue
        found.append((float(np.nanmax(np.abs(y.astype(np.float64) - mine))), name, f, y))
    return [(name, f) for _, name, f, _ in sorted(found, key=lambda t: t[0])]


@functools.cache
def _one_tensor_functions() -> tuple[tuple[str, object], ...]:
    """(name, function) of paddle.nn.functional's public Python functions a call with one tensor
    alone can take: a first positional parameter, every other one with a default."""
    out = []
    for name, f in public_functions(NAMESPACE):
        try:
            parameters = list(inspect.signature(f).parameters.values())
        except (TypeError, ValueError):  # no signature: what it takes cannot be read
            continue
        if parameters and parameters[0].kind in (parameters[0].POSITIONAL_ONLY, parameters[0].POSITIONAL_OR_KEYWORD) \
                and all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters[1:]):
            out.append((name, f))
    return tuple(out)
