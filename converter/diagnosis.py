"""A diagnosis: what a check found wrong in a port (the layer, the cause, what to do), as data.
The per-layer-type families make them, the checks above collect and report them.

`kind` says which pitfall it is, for programs ("epsilon", "transpose", "activation", "tf32",
"own forward", ...): the check that makes a diagnosis sets it, and diagnoses are told apart by
kind and layer, never by their wording. The JSON holds all four."""

from __future__ import annotations

from dataclasses import dataclass

NOT_RECORDED = ""  # the kind of a diagnosis read back from JSON that does not hold one


@dataclass
class Diagnosis:
    layer: str
    cause: str
    hint: str
    kind: str

    def to_json(self) -> dict:
        return {"layer": self.layer, "kind": self.kind, "cause": self.cause, "hint": self.hint}

    @classmethod
    def from_json(cls, body: dict) -> Diagnosis:
        return cls(body["layer"], body["cause"], body["hint"], body.get("kind", NOT_RECORDED))
