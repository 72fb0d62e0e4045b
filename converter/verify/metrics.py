"""Elementwise comparison statistics, kept as data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Metrics:
    shape: tuple
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    nan: int
    inf: int
    worst_index: tuple

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "max_abs": self.max_abs, "mean_abs": self.mean_abs,
                "max_rel": self.max_rel, "cosine": self.cosine, "nan": self.nan, "inf": self.inf,
                "worst_index": list(self.worst_index)}


def join(arrays: list[np.ndarray]) -> np.ndarray:
    """Several outputs of one layer as one array (one vector when there are several), in their
    own precision: the difference of two close float32 values is exact in float32."""
    if len(arrays) == 1:
        return np.asarray(arrays[0])
    return np.concatenate([np.asarray(a).ravel() for a in arrays])


def compare(ref: np.ndarray, got: np.ndarray) -> Metrics:
    ref, got = np.asarray(ref), np.asarray(got)
    diff = np.abs(got - ref)
    if diff.size == 0:
        return Metrics(tuple(ref.shape), 0.0, 0.0, 0.0, 1.0, 0, 0, ())
    nan = inf = 0
    if not np.isfinite(diff).all():
        nan, inf = int(np.isnan(got).sum()), int(np.isinf(got).sum())
        diff = np.nan_to_num(diff, nan=np.inf)
        got = np.nan_to_num(got)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    rel = np.abs(ref)
    np.maximum(rel, np.finfo(np.float32).tiny, out=rel)
    np.divide(diff, rel, out=rel)
    r, g = ref.ravel().astype(np.float64), got.ravel().astype(np.float64)
    nr, ng = float(np.sqrt(np.dot(r, r))), float(np.sqrt(np.dot(g, g)))
    cosine = float(np.dot(r, g) / (nr * ng)) if nr > 0 and ng > 0 else float(nr == ng)
    return Metrics(tuple(ref.shape), float(diff.flat[np.argmax(diff)]), float(np.mean(diff, dtype=np.float64)),
                   float(rel.max()), cosine, nan, inf, tuple(int(i) for i in worst))
