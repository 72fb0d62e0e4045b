"""torch.nn <-> paddle.nn knowledge, one entry per layer family, one file per family.

A `Family` holds everything the project knows about one kind of layer, for both
commands: its weight rules (`convert`), whether a lower-precision format rounds its
inputs and what its sum of squared products and reduction length are (`products`,
for the matmul budget), which layers it pairs with when it has no weights (`kind`),
what its epsilon is called on either side (`epsilon`), and its what-if diagnoses
(`what_ifs`). Entries are keyed by torch class name, and a torch class may be
registered once. A layer type that no entry covers still converts (its parameters
keep their names) and is still verified, with the generic budget.

Adding a layer type is one file here: every module of this package is imported, and each
registers its families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


@dataclass
class PortedLayer:
    """A torch module and the paddle layer it was ported to, and the rules found for them."""

    torch_path: str
    paddle_path: str
    torch_module: object
    paddle_layer: object
    rules: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    measured: list = field(default_factory=list)  # rules.orient.Measured: layouts found from the two layers

    def torch_key(self, name: str) -> str:
        return f"{self.torch_path}.{name}" if self.torch_path else name

    def paddle_key(self, name: str) -> str:
        return f"{self.paddle_path}.{name}" if self.paddle_path else name

    def torch_keys(self) -> list[str]:
        """This module's own state-dict entries (parameters and persistent buffers)."""
        return torch_own_keys(self.torch_module)

    def _add(self, kind: str, name: str, transpose: bool = False, **fields) -> None:
        """A `kind` rule for this module's own tensor `name` where it has one, and its transpose where asked."""
        if name not in self.torch_keys():
            return
        self.rules.append({"kind": kind, "key": self.torch_key(name), **fields})
        if transpose:
            self.rules.append({"kind": "transpose", "key": self.torch_key(name)})

    def rename(self, name: str, paddle_name: str | None = None, transpose: bool = False) -> None:
        self._add("rename", name, transpose, to=self.paddle_key(paddle_name or name))

    def reshape(self, name: str, shape: list[int]) -> None:
        self._add("reshape", name, shape=list(shape))

    def split(self, name: str, paddle_names: list[str], axis: int = 0, transpose: bool = False) -> None:
        self._add("split", name, transpose, to=[self.paddle_key(n) for n in paddle_names], axis=axis)

    def drop(self, name: str) -> None:
        self._add("drop", name)

    def unsupported(self, what: str) -> None:
        self.problems.append(f"torch '{self.torch_path}' ({type(self.torch_module).__name__}): {what}")


def same_weight_and_bias(pair: PortedLayer) -> None:
    """The rules of a layer whose weight and bias keep their names and layouts on both sides."""
    pair.rename("weight")
    pair.rename("bias")


def torch_own_keys(module) -> list[str]:
    """State-dict names of a torch module's own parameters and persistent buffers."""
    skip = getattr(module, "_non_persistent_buffers_set", set())
    names = [n for n, _ in module.named_parameters(recurse=False)]
    names += [n for n, _ in module.named_buffers(recurse=False) if n not in skip]
    return names


def paddle_own_keys(layer) -> list[str]:
    """State-dict names of a paddle layer's own parameters and persistable buffers."""
    return [k for k in layer.state_dict(include_sublayers=False)]


class Products(Protocol):
    def __call__(self, module, args: tuple, weight2, square: Callable) -> tuple:
        """(S2, K) of one call: S2 = sum over the reduction of (x_k w_k)^2 per output element,
        from `square(input)` and the squared weight `weight2`; K the reduction length."""


class WhatIf(Protocol):
    def __call__(self, ctx, where: str, torch_module, paddle_layer) -> list:
        """Diagnoses (verify.report.Diagnosis) for one pair inside the first layer over budget
        (`where` is its torch path; ctx the diagnosis context, see verify/diagnose.py)."""


class OutputReading(Protocol):
    """How a paddle layer's outputs read as its torch module's (align.LayerPair.part): the slice
    of a fused layer's output one module computes (compare/fused.py Slice), or a family's reading
    (a gate's logits as a router's softmax and top-k weights; a BatchNorm whose activation paddle
    applies inside it). Classes subclass it for the defaults of `of` and `of_torch`."""

    # whether torch's outputs are read too (not linear: the references' errors are then carried
    # through the reading rather than read off torch's raw outputs)
    reads_torch = False

    @property
    def note(self) -> str:
        """The reading in words, for the row's note."""

    def of(self, outputs: list) -> list:
        """Paddle's outputs (tensors or numpy arrays) as the torch module gives them."""
        return outputs

    def of_torch(self, outputs: list) -> list:
        """torch's outputs (tensors or numpy arrays) as they are compared."""
        return outputs


@dataclass(frozen=True)
class Family:
    name: str
    torch_types: tuple[str, ...]
    paddle_types: tuple[str, ...]
    convert: Callable[[PortedLayer], None] | None = None  # weight rules for one pair
    products: Products | None = None  # a matmul/convolution: a format rounds its inputs
    kind: str | None = None  # layers without weights pair with layers of the same kind
    epsilon: tuple[str, ...] = ()  # its epsilon's attribute names, on either side
    what_ifs: tuple[WhatIf, ...] = ()
    owns_children: bool = False  # paddle builds internal sublayers (RNN cells) that the entry covers
    # the entry covers its torch types only where the paddle layer is one of its paddle types (a torch
    # Linear ported as PaddleFormers' LMHead): it stands beside the torch type's own entry
    paddle_specific: bool = False
    # how the paddle layer's outputs read as the torch module's (an OutputReading), made from the torch module
    # and the paddle layer; None where they compare as they are
    reads: Callable[[object, object], OutputReading | None] | None = None


REGISTRY: dict[str, Family] = {}  # torch class name -> family
BY_PADDLE_TYPE: dict[str, Family] = {}  # paddle class name -> the first family that names it
BY_PAIR: dict[tuple[str, str], Family] = {}  # (torch class name, paddle class name) -> a paddle-specific family


def register(family: Family) -> Family:
    """Add `family` to the registry: by torch type, or (paddle_specific) by torch and paddle type;
    a key registered twice is refused."""
    if family.paddle_specific:
        table, keys = BY_PAIR, [(t, p) for t in family.torch_types for p in family.paddle_types]
        said = lambda key: f"torch type {key[0]} with paddle type {key[1]}"
    else:
        table, keys, said = REGISTRY, list(family.torch_types), lambda key: f"torch type {key}"
    for key in keys:
        if key in table:
            raise ValueError(f"{said(key)} is registered twice ({table[key].name} and {family.name})")
        table[key] = family
    for paddle_type in family.paddle_types:
        BY_PADDLE_TYPE.setdefault(paddle_type, family)
    return family


def lookup(torch_module, paddle_layer=None) -> Family | None:
    """The family of a torch module, by its class or the nearest registered base class; where the
    paddle layer it is ported to is given, a family for that pair of classes first."""
    if paddle_layer is not None and BY_PAIR:
        for cls in type(torch_module).__mro__:
            for p_cls in type(paddle_layer).__mro__:
                family = BY_PAIR.get((cls.__name__, p_cls.__name__))
                if family is not None:
                    return family
    for cls in type(torch_module).__mro__:
        family = REGISTRY.get(cls.__name__)
        if family is not None:
            return family
    return None


def lookup_paddle(paddle_layer) -> Family | None:
    """The family of a paddle layer, by its class or the nearest registered base class."""
    for cls in type(paddle_layer).__mro__:
        family = BY_PADDLE_TYPE.get(cls.__name__)
        if family is not None:
            return family
    return None


def kind_of(type_name: str) -> str:
    """The pairing kind of a layer type on either side (its own name, lower case, if no family
    names it): a ReLU ported as ReLU6 is paired, compared and diagnosed rather than lost."""
    family = REGISTRY.get(type_name) or BY_PADDLE_TYPE.get(type_name)
    return (family.kind or family.name) if family is not None else type_name.lower()


def paddle_type_fits(family: Family, paddle_layer) -> bool:
    names = {cls.__name__ for cls in type(paddle_layer).__mro__}
    return any(t in names for t in family.paddle_types)


def _load_families() -> None:
    """Import every module of this package, in name order (a torch type registered twice is an
    error whatever the order)."""
    import importlib
    import pkgutil
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")


_load_families()

__all__ = ["PortedLayer", "Family", "REGISTRY", "register", "same_weight_and_bias", "lookup", "lookup_paddle", "kind_of",
           "paddle_type_fits"]
