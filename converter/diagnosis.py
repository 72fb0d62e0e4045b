"""A diagnosis: what a check found wrong in a port (the layer, the cause, what to do), as data.
The per-layer-type families make them, the checks above collect and report them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Diagnosis:
    layer: str
    cause: str
    hint: str

    def to_json(self) -> dict:
        return {"layer": self.layer, "cause": self.cause, "hint": self.hint}
