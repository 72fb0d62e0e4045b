"""Each 2-D weight's layout in the port, measured from the two layers rather than named.

A layer family says how its weight is laid out on paddle's side (`paddle.nn.Linear`: [in, out],
torch's transposed). Ports do not always follow it: `paddle.compat.nn.Linear` (what PaConvert
writes for `nn.Linear`) keeps torch's [out, in], and hand-written layers hold either. So each
renamed 2-D weight is checked against the paddle tensor it fills:

* where the shapes decide (one layout fits the paddle tensor's shape, the other does not), the
  shape's layout is taken;
* where they cannot (a square weight), the paddle layer is run once on a probe input with each
  candidate layout, and the layout that reproduces the torch module's output on the same input is
  taken. A symmetric weight, or a layer that cannot be run alone, keeps the family's layout.

Every layout that differs from the family's rule is said in a note; one decided by running the
layer where the paddle layer is of the family's own class (a port whose paddle Linear computes
with torch's layout) is a finding: a checkpoint converted by that family's rules would not fit it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..families.probe import Weights, measure

MAX_SQUARE = 3  # square weights of one layer measured together (2**3 runs at most)


def _family_class_holds(pair, family) -> bool:
    """Whether the paddle layer is of a class the family was written for (not a look-alike of the
    same name from another package)."""
    return family is not None and any(cls.__name__ in family.paddle_types and cls.__module__.startswith("paddle.nn.")
                                      for cls in type(pair.paddle_layer).__mro__)


@dataclass(frozen=True)
class Measured:
    """A weight whose layout in the port differs from its family's rule, and how that was found."""

    key: str  # torch's key
    paddle_key: str
    transposed: bool  # the layout taken: torch's transposed, or as is
    how: str  # "its shape" or "running the layer"
    against_class: bool  # the paddle layer is of the family's own class, which stores the other layout


def orient(pair, family=None) -> None:
    """Correct the transposes among `pair.rules` to the layout each 2-D paddle tensor really takes
    (see the module docstring); each one changed is added to `pair.measured`."""
    weights = Weights(pair)
    square, decided = [], {}
    for name in weights.two_d():
        as_is, turned = weights.fits(name)
        if as_is and turned:
            if not weights.symmetric(name):
                square.append(name)
        elif as_is or turned:
            decided[name] = (turned, "its shape")
    if square and len(square) <= MAX_SQUARE:
        measured = measure(weights, square)
        if measured is not None:
            decided.update({n: (n in measured, "running the layer") for n in square})
    for name, (transpose, how) in decided.items():
        key = pair.torch_key(name)
        if transpose == (key in weights.transposed):
            continue
        if transpose:
            pair.rules.append({"kind": "transpose", "key": key})
        else:
            pair.rules[:] = [r for r in pair.rules if not (r["kind"] == "transpose" and r["key"] == key)]
        pair.measured.append(Measured(key, pair.paddle_key(weights.renames[name]), transpose, how,
                                      how == "running the layer" and _family_class_holds(pair, family)))


def describe(measured: list[Measured], shown: int = 3) -> list[str]:
    """Notes on the layouts measured: one line per kind of change (count and the first few keys), and
    one per weight whose layer's class stores the other layout (a finding)."""
    notes = []
    groups: dict[tuple[bool, str], list[Measured]] = {}
    for m in measured:
        groups.setdefault((m.transposed, m.how), []).append(m)
    for (transposed, how), items in groups.items():
        held = "transposed" if transposed else "in torch's layout (no transpose)"
        first = ", ".join(f"'{m.key}'" for m in items[:shown]) + (", ..." if len(items) > shown else "")
        notes.append(f"layout measured: {len(items)} weight(s) held {held} in the port, found by {how}, "
                     f"where their layer family's rule says otherwise: {first}")
    for m in measured:
        if m.against_class:
            notes.append(f"finding: paddle '{m.paddle_key}' computes with torch's '{m.key}' "
                         f"{'transposed' if m.transposed else 'as is'}, against the layout its class stores: "
                         "a checkpoint converted by the class's usual rules (as shipped rule sets write it) "
                         "would not fit this port")
    return notes
