"""What a report says of why its figures are what they are (explain.py measures it): the final
outputs and the layers with the largest local error, each with its difference, each side's error
against float64, its budget's largest terms, and with every side in fp32 the difference measured;
the settings that turn a lower format off on each side; and the answer to a fixed threshold."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..compare.budget_terms import Breakdown, breakdown_words
from ..compare.precision import PADDLE_TF32_FLAGS, UNIT_ROUNDOFF

LISTED = 4  # names listed where a threshold cannot hold at more rows (the JSON lists them all)
OUTPUTS = "the final outputs"
MANTISSA = {"tf32": 10, "bf16": 7, "fp16": 10}


@dataclass(frozen=True)
class Item:
    """One explained row: its name; its difference (max and mean abs: on the same inputs for a
    layer, free-running for the final outputs) and budget; each side's error against float64; the
    budget's terms at the worst element; with every side in fp32, the difference measured (None:
    not measured) and the budget without the lower format's terms (None: no lower format)."""

    name: str
    difference: float | None
    mean: float | None
    budget: float | None
    own: dict = field(default_factory=dict)
    terms: tuple = ()
    fp32: float | None = None
    fp32_budget: float | None = None
    fp32_note: str = ""  # why the fp32 figure is not there, where it was to be measured

    def to_json(self) -> dict:
        return {"name": self.name, "difference": self.difference, "mean": self.mean, "budget": self.budget,
                "own_error": dict(self.own), "budget_terms": [list(t) for t in self.terms], "fp32": self.fp32,
                "fp32_budget": self.fp32_budget, "fp32_note": self.fp32_note}

    @classmethod
    def from_json(cls, body: dict) -> Item:
        return cls(body["name"], body["difference"], body["mean"], body["budget"], dict(body["own_error"]),
                   tuple(tuple(t) for t in body["budget_terms"]), body["fp32"], body["fp32_budget"],
                   body.get("fp32_note", ""))


@dataclass(frozen=True)
class Explanation:
    """The paragraph's content (`paragraph()` says it) and the answer to a threshold (`threshold`,
    None where none was given): the rows whose budget exceeds it (name, budget) and those whose
    difference does (name, difference), out of `judged` rows."""

    formats: dict
    emulated: dict
    items: tuple[Item, ...]
    settings: tuple[str, ...] = ()
    threshold: float | None = None
    cannot_hold: tuple = ()
    exceeded: tuple = ()
    judged: int = 0

    def paragraph(self) -> str:
        said = [_arithmetic(self.formats, self.emulated)] + [_item_words(i, self.formats) for i in self.items]
        if self.settings:
            said.append("To compute in fp32: " + "; ".join(self.settings) + ".")
        return " ".join(said)

    def threshold_words(self) -> str:
        if self.threshold is None:
            return ""
        t = f"{self.threshold:.3g}"
        if self.cannot_hold:
            names = ", ".join(f"{n} (budget {_num(b)})" for n, b in self.cannot_hold[:LISTED])
            more = f" and {len(self.cannot_hold) - LISTED} more" if len(self.cannot_hold) > LISTED else ""
            hold = (f"--threshold {t} cannot hold under the arithmetic each side used at {len(self.cannot_hold)} "
                    f"of {self.judged} rows, whose expected-error budget exceeds it: {names}{more}.")
            fp32 = [i for i in self.items if i.fp32_budget is not None and i.budget is not None
                    and i.budget > self.threshold >= i.fp32_budget]
            if fp32:
                hold += " With every side in fp32 it could at " + ", ".join(
                    f"{i.name} (budget about {_num(i.fp32_budget)})" for i in fp32) + "."
        else:
            hold = f"--threshold {t} can hold at every row under the arithmetic each side used."
        if self.exceeded:
            worst = sorted(self.exceeded, key=lambda r: -r[1])
            errs = ", ".join(f"{n} by {_num(d)}" for n, d in worst[:LISTED])
            more = f" and {len(self.exceeded) - LISTED} more" if len(self.exceeded) > LISTED else ""
            return f"{hold} The run's errors are not within {t}: {errs}{more} ({len(self.exceeded)} rows)."
        return f"{hold} The run's errors are within {t} at every row."

    def to_json(self) -> dict:
        return {"text": self.paragraph(), "threshold_text": self.threshold_words(), "formats": dict(self.formats),
                "emulated": dict(self.emulated), "items": [i.to_json() for i in self.items],
                "settings": list(self.settings), "threshold": self.threshold,
                "cannot_hold": [{"name": n, "budget": b} for n, b in self.cannot_hold],
                "exceeded": [{"name": n, "difference": d} for n, d in self.exceeded], "judged": self.judged}

    @classmethod
    def from_json(cls, body: dict) -> Explanation:
        return cls(dict(body["formats"]), dict(body["emulated"]), tuple(Item.from_json(i) for i in body["items"]),
                   tuple(body["settings"]), body["threshold"],
                   tuple((r["name"], r["budget"]) for r in body["cannot_hold"]),
                   tuple((r["name"], r["difference"]) for r in body["exceeded"]), body["judged"])


def _arithmetic(formats: dict, emulated: dict) -> str:
    lower = {side: fmt for side, fmt in formats.items() if fmt != "fp32"}
    if not lower:
        return "Both sides compute in fp32."
    said = []
    for side, fmt in lower.items():
        how = f" (emulated: --emulate {side}={fmt})" if emulated.get(side) == fmt else ""
        said.append(f"{side} rounds the inputs of its matmuls and convolutions to {fmt.upper()}{how}, "
                    f"{MANTISSA[fmt]} mantissa bits (unit {UNIT_ROUNDOFF[fmt]:.1e})")
    rest = [side for side in formats if side not in lower]
    text = "; ".join(said) + (f"; {' and '.join(rest)} computes in fp32." if rest else ".")
    return text[0].upper() + text[1:]


def _item_words(i: Item, formats: dict) -> str:
    outputs = i.name == OUTPUTS
    mean = f" (mean {_num(i.mean)})" if i.mean is not None else ""
    said = (f"The final outputs differ by up to {_num(i.difference)}{mean}" if outputs else
            f"At {i.name} the two sides differ by up to {_num(i.difference)}{mean} on the same inputs")
    t, p = i.own.get("torch"), i.own.get("paddle")
    if t is not None and p is not None:
        said += f"; against float64 torch's {'outputs are' if outputs else 'output is'} off by {_num(t)}, paddle's by {_num(p)}"
        if t > 0 and p > 0 and 0.5 <= t / p <= 2:
            said += " (alike: both sides' rounding)"
    if i.budget is not None:
        said += f"; the budget, {_num(i.budget)}, is"
        words = breakdown_words(Breakdown(i.terms), formats) if i.terms else ""
        said += f" mostly {words}" if words else " the model's"
    if i.fp32 is not None:
        said += f"; with every side in fp32 the same {'outputs differ' if outputs else 'layer differs'} by " \
                f"{_num(i.fp32)} (measured)"
        if i.fp32_budget is not None:
            said += f", its budget about {_num(i.fp32_budget)}"
    elif i.fp32_note:
        said += f"; with every side in fp32, {i.fp32_note}"
    return said + "."


def settings_of(precision: dict) -> tuple[str, ...]:
    """What turns a lower format off on each side, for the formats this run used (any side in TF32:
    both sides' switches, and the one for every NVIDIA library)."""
    formats = {side: p["effective"] for side, p in precision.items()}
    out = []
    if "tf32" in formats.values():
        out.append('on torch\'s side torch.backends.cuda.matmul.allow_tf32 = False (or '
                   'torch.set_float32_matmul_precision("highest")) and torch.backends.cudnn.allow_tf32 = False')
        paddle = "on paddle's " + " and ".join(f"{name}=0" for name in PADDLE_TF32_FLAGS)
        flags = precision.get("paddle", {}).get("flags", {})
        if "FLAGS_use_accuracy_compatible_kernel" in flags:
            paddle += " (and on a GPU, FLAGS_use_accuracy_compatible_kernel=1 for paddle 3.3's kernels aligned with torch's)"
        out += [paddle, "or NVIDIA_TF32_OVERRIDE=0 for every NVIDIA library"]
    for side, fmt in formats.items():
        if fmt in ("bf16", "fp16"):
            out.append(f"on {side}'s side no "
                       + ("torch.autocast" if side == "torch" else "paddle.amp.auto_cast") + " and weights in float32")
    emulated = [f"--emulate {side}={p['emulated']}" for side, p in precision.items() if p.get("emulated")]
    if emulated:
        out.append(f"here, leave out {' and '.join(emulated)}")
    return tuple(out)


def _num(x) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}" if x >= 1e-2 else f"{x:.1e}"
