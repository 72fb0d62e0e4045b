"""A verification of two model directories in the terms their user edits: config.json.

Where PADDLE_DIR's config.json holds another value than HF_DIR's config.json translates to
(hf.config.translate_config, as convert-weights HF_DIR OUT_DIR writes it), the report says so in
a note, and a diagnosis whose cause names both values (an epsilon, an activation) has its hint
name the field to set: a user who edits config.json, not a layer's constructor, knows where."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..diagnosis import Diagnosis
from ..errors import UserError
from .config import BOOKKEEPING, translate_config

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NOT_READ = frozenset({"architectures", "dtype", "torch_dtype", "model_type"}) | BOOKKEEPING


@dataclass(frozen=True)
class FieldApart:
    """A config.json field whose value in PADDLE_DIR (`paddle`) is not what HF_DIR's translates to (`hf`)."""

    name: str
    paddle: object
    hf: object

    def said(self) -> str:
        return f"{self.name} {self.paddle!r} (HF_DIR's gives {self.hf!r})"

    def named_by(self, text: str) -> bool:
        """Whether `text` (a diagnosis's cause) names both values: as numbers, or as words."""
        if _plain_number(self.paddle) and _plain_number(self.hf):
            said = [float(n) for n in _NUMBER.findall(text)]
            return any(_close(n, self.paddle) for n in said) and any(_close(n, self.hf) for n in said)
        if isinstance(self.paddle, str) and isinstance(self.hf, str):  # a word, alone or the last of a dotted
            words = set(re.findall(r"[\w-]+", text))  # name (paddle.nn.functional.relu)
            return self.paddle in words and self.hf in words
        return False


def fields_apart(hf_config: dict, paddle_config: dict, library: str) -> list[FieldApart]:
    """The fields PADDLE_DIR's config.json holds with another value than HF_DIR's translates to for
    `library` ("paddlenlp" or "paddleformers"); none where HF_DIR's has no translation."""
    try:
        translated = translate_config(hf_config, force=True, target=library).config
    except UserError:  # a config family the library lacks: the run itself says so
        return []
    return [FieldApart(name, paddle_config[name], value) for name, value in translated.items()
            if name not in _NOT_READ and name in paddle_config and paddle_config[name] != value]


def in_config_terms(report, apart: list[FieldApart]):
    """`report` (a PortReport) with a note naming the fields apart, and the hint of each forward
    diagnosis whose cause names a field's two values naming the field."""
    if not apart:
        return report
    forward = report.forward
    diagnosis = [_with_field(d, apart) for d in forward.diagnosis]
    note = "PADDLE_DIR's config.json differs from what HF_DIR's translates to: " + "; ".join(a.said() for a in apart)
    forward = dataclasses.replace(forward, diagnosis=diagnosis, notes=[*forward.notes, note])
    return dataclasses.replace(report, forward=forward)


def _with_field(d: Diagnosis, apart: list[FieldApart]) -> Diagnosis:
    named = [a for a in apart if a.named_by(d.cause)]
    if not named:
        return d
    fields = ", ".join(f"{a.name} to {a.hf!r}" for a in named)
    return dataclasses.replace(d, hint=f"{d.hint}; in the directories: set {fields} in PADDLE_DIR's config.json, as "
                                        "HF_DIR's translates (or convert HF_DIR again)")


def _plain_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b)) or (a == b)
