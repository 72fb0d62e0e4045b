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

from functools import cached_property

from ..frameworks.rebuild import arguments, built, holds, shapes
from .counterfactual_settings import same as _same, settings


class Rebuilder:
    """`layer` built afresh as it is, once, and the settings measured against that build
    (frameworks/rebuild.py builds it)."""

    def __init__(self, layer, framework_keys: frozenset):
        self.layer, self.keys = layer, framework_keys
        self.found = arguments(layer)

    @cached_property
    def _as_it_is(self):
        if self.found is None:
            return None
        try:
            build = built(self.layer, self.found[1], self.found[0])
        except Exception:  # noqa: BLE001 - a layer not built again from what it keeps: its whole numbers stay untried
            return None
        return build if holds(build, self.layer) else None

    def measured(self, name: str, parameter: str, to) -> tuple | None:
        """The setting `name` (the constructor's `parameter`) at `to`, where the layer built with it
        holds weights of the same shapes: ((attribute, live value, value under the change), ...) for
        every attribute the changed build sets otherwise; None where it is structure, or cannot be told."""
        same = self._as_it_is
        if same is None:
            return None
        try:
            changed = built(self.layer, {**self.found[1], parameter: to}, self.found[0])
        except Exception:  # noqa: BLE001 - a value the constructor refuses is no candidate
            return None
        if shapes(changed) != shapes(same):
            return None
        before, after, live = (settings(x, self.keys) for x in (same, changed, self.layer))
        differ = [k for k in before if k in after and not _same(before[k], after[k])]
        if name not in differ or any(k not in live or not _same(live[k], before[k]) for k in differ):
            return None  # the build does not keep the setting as the live layer does
        return tuple((k, live[k], after[k]) for k in differ)
