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


CONFIRMED = "confirmed by re-running"
GIVES_OUTPUT = "it gives torch's output"  # what a forward re-run is judged on, unless on a child's input


def gives_input_of(child: str) -> str:
    """What a forward re-run judged at an input the culprit's code computed for `child` gives."""
    return f"it gives torch's input of {child}"


def confirmed_cause(subject: str, rerun: str, change: str, gives: str, went: str) -> str:
    """The one wording, for the forward and the training checks alike, of a cause that re-running
    bore out: "<subject>; <rerun> with <change> <gives> within the budget (<went>): confirmed by
    re-running", e.g. "paddle's 1 (LocalResponseNorm) has k=1.0; re-run on torch's recorded inputs
    with k=2.0 it gives torch's output within the budget (ratio 4.96e+05 -> 0.108): ..."."""
    return f"{subject}; {rerun} with {change} {gives} within the budget ({went}): {CONFIRMED}"


def went(before: float, after: float) -> str:
    """A re-run's ratio to its budget, before and after the change."""
    return f"ratio {before:.3g} -> {after:.3g}"
