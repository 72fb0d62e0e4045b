"""torch.nn <-> paddle.nn knowledge, one entry per layer family.

Each family module registers `LayerFamily` entries keyed by torch class name;
every entry has the same signature, `convert(pair)`, which adds rules for the
pair's own parameters and buffers. A torch class may be registered once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable



@dataclass
class LayerPair:
    """A torch module and the paddle layer it was ported to, and the rules found for them."""

    torch_path: str
    paddle_path: str
    torch_module: object
    paddle_layer: object
    rules: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def t(self, name: str) -> str:
        return f"{self.torch_path}.{name}" if self.torch_path else name

    def p(self, name: str) -> str:
        return f"{self.paddle_path}.{name}" if self.paddle_path else name

    def torch_keys(self) -> list[str]:
        """This module's own state-dict entries (parameters and persistent buffers)."""
        return torch_own_keys(self.torch_module)

    def has(self, name: str) -> bool:
        return name in self.torch_keys()

    def rename(self, name: str, paddle_name: str | None = None, transpose: bool = False) -> None:
        if not self.has(name):
            return
        self.rules.append({"kind": "rename", "key": self.t(name), "to": self.p(paddle_name or name)})
        if transpose:
            self.rules.append({"kind": "transpose", "key": self.t(name)})

    def split(self, name: str, paddle_names: list[str], axis: int = 0, transpose: bool = False) -> None:
        if not self.has(name):
            return
        self.rules.append({"kind": "split", "key": self.t(name), "to": [self.p(n) for n in paddle_names], "axis": axis})
        if transpose:
            self.rules.append({"kind": "transpose", "key": self.t(name)})

    def drop(self, name: str) -> None:
        if self.has(name):
            self.rules.append({"kind": "drop", "key": self.t(name)})

    def unsupported(self, what: str) -> None:
        self.problems.append(f"torch '{self.torch_path}' ({type(self.torch_module).__name__}): {what}")


def torch_own_keys(module) -> list[str]:
    """State-dict names of a torch module's own parameters and persistent buffers."""
    skip = getattr(module, "_non_persistent_buffers_set", set())
    names = [n for n, _ in module.named_parameters(recurse=False)]
    names += [n for n, _ in module.named_buffers(recurse=False) if n not in skip]
    return names


def paddle_own_keys(layer) -> list[str]:
    """State-dict names of a paddle layer's own parameters and persistable buffers."""
    return [k for k in layer.state_dict(include_sublayers=False)]


@dataclass(frozen=True)
class LayerFamily:
    name: str
    torch_types: tuple[str, ...]
    paddle_types: tuple[str, ...]
    convert: Callable[[LayerPair], None]
    owns_children: bool = False  # paddle builds internal sublayers (RNN cells) that the entry covers


REGISTRY: dict[str, LayerFamily] = {}


def register(family: LayerFamily) -> LayerFamily:
    for torch_type in family.torch_types:
        if torch_type in REGISTRY:
            raise ValueError(f"torch type {torch_type} is registered twice "
                             f"({REGISTRY[torch_type].name} and {family.name})")
        REGISTRY[torch_type] = family
    return family


def lookup(torch_module) -> LayerFamily | None:
    """The family of a torch module, by its class or the nearest registered base class."""
    for cls in type(torch_module).__mro__:
        family = REGISTRY.get(cls.__name__)
        if family is not None:
            return family
    return None


def paddle_type_fits(family: LayerFamily, paddle_layer) -> bool:
    names = {cls.__name__ for cls in type(paddle_layer).__mro__}
    return any(t in names for t in family.paddle_types)


def _load_families() -> None:
    from . import activation, attention, conv, embedding, linear, norm, rnn  # noqa: F401


_load_families()

__all__ = ["LayerPair", "LayerFamily", "REGISTRY", "register", "lookup", "paddle_type_fits"]
