"""The paddle model's loaded weights against torch's under the mapping, bit for bit (mapping
'loaded'): which differ, and where the worst element of each is."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..inmemory import worst_gap


@dataclass
class WeightDiff:
    """A loaded paddle weight that is not, bit for bit, the torch weight the mapping makes of it:
    how many elements differ, and the worst (largest absolute difference) with its index and values."""
    paddle: str
    torch: str  # the torch key(s) it is computed from, '+'-joined
    shape: tuple
    differ: int  # elements whose bits differ
    size: int
    max_abs: float
    index: tuple
    paddle_value: float
    torch_value: float
    note: str = ""  # what the whole tensor is instead (torch's transposed)

    def to_json(self) -> dict:
        return {"paddle": self.paddle, "torch": self.torch, "shape": list(self.shape), "differ": self.differ,
                "size": self.size, "max_abs": self.max_abs, "index": list(self.index),
                "paddle_value": self.paddle_value, "torch_value": self.torch_value, "note": self.note}


@dataclass
class WeightCheck:
    """The paddle model's loaded weights against torch's under the mapping (mapping 'loaded')."""
    mapping: str
    checked: int
    differ: list[WeightDiff]

    def to_json(self) -> dict:
        return {"mapping": self.mapping, "checked": self.checked, "differ": [d.to_json() for d in self.differ]}


def check_loaded(plan, source, paddle_model):
    """Every paddle tensor the plan writes, as the paddle model holds it, against the torch tensor the
    plan makes (read from `source`), bit for bit: a WeightCheck listing those that differ."""
    from ..frameworks.paddle_side import to_numpy
    state = paddle_model.state_dict()
    return check_written(plan, source.read, lambda name: to_numpy(state[name]))


def check_written(plan, read, actual):
    """Every tensor the plan writes, `actual(name)` (paddle's, as float32 where it is bf16), against
    the torch tensor the plan makes of `read`, bit for bit, one tensor at a time: a WeightCheck
    listing those that differ."""
    from .. import dtypes
    differ, checked = [], 0
    for entry in plan.entries:
        expected = entry.compute(read)
        if entry.dtype == "bfloat16":
            expected = dtypes.bf16_to_f32(expected)
        torch_keys = "+".join(part.source for part in entry.parts)
        for name in (entry.name, *entry.aliases):
            checked += 1
            found = weight_difference(name, torch_keys, actual(name), expected)
            if found is not None:
                differ.append(found)
    return WeightCheck(plan.ruleset, checked, differ)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def weight_difference(name: str, torch_keys: str, actual: np.ndarray, expected: np.ndarray):
    """A WeightDiff when `actual` (the paddle tensor) is not `expected` (torch's under the mapping)
    bit for bit, else None. Narrow floats come widened to float32 on both sides (exactly)."""
    if expected.dtype == np.float16:
        expected = expected.astype(np.float32)
    if actual.dtype == np.float16:
        actual = actual.astype(np.float32)
    same_kind = actual.dtype == expected.dtype and actual.shape == expected.shape
    if same_kind and np.array_equal(_bits(actual), _bits(expected)):
        return None
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    if a.shape != e.shape:  # the plan checks shapes against the model: kept for a model changed since
        return WeightDiff(name, torch_keys, tuple(actual.shape), a.size, a.size, float("inf"), (), float("nan"),
                          float("nan"), f"torch's is {list(expected.shape)}")
    mask = _bits(actual) != _bits(expected) if same_kind else a != e
    gap, at = worst_gap(a, e, mask)
    note = ""
    if a.ndim == 2 and a.shape[0] == a.shape[1] and np.array_equal(a, e.T, equal_nan=True):
        note = "it holds torch's tensor transposed"
    return WeightDiff(name, torch_keys, tuple(actual.shape), int(np.count_nonzero(mask)), int(a.size),
                      float(max(gap[at], 0.0)), tuple(int(i) for i in at), float(a[at]), float(e[at]), note)
