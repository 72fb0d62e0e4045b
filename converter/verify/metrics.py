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
    """Several outputs of one layer as one float64 vector."""
    if len(arrays) == 1:
        return np.asarray(arrays[0], dtype=np.float64)
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def compare(ref: np.ndarray, got: np.ndarray) -> Metrics:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    nan = int(np.isnan(got).sum())
    inf = int(np.isinf(got).sum())
    diff = np.abs(got - ref)
    diff = np.where(np.isnan(diff), np.inf, diff)
    if diff.size == 0:
        return Metrics(tuple(ref.shape), 0.0, 0.0, 0.0, 1.0, nan, inf, ())
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    denom = np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
    r, g = ref.ravel(), got.ravel()
    nr, ng = float(np.linalg.norm(r)), float(np.linalg.norm(np.nan_to_num(g)))
    cosine = float(np.dot(r, np.nan_to_num(g)) / (nr * ng)) if nr > 0 and ng > 0 else float(nr == ng)
    return Metrics(tuple(ref.shape), float(diff.max()), float(diff.mean()), float((diff / denom).max()),
                   cosine, nan, inf, tuple(int(i) for i in worst))
