"""Elementwise comparison statistics, kept as data."""

from __future__ import annotations

import math
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


def _cosine(ref: np.ndarray, got: np.ndarray, d: np.ndarray) -> float:
    """cos(ref, got) from float32 dot products, exact to about 1e-12 near 1: 1 - cos is
    computed from d = got - ref, since |d|^2 = |r|^2 + |g|^2 - 2 r.g and |g| - |r| = d.(g + r) / (|g| + |r|)."""
    r, g, d = ref.ravel(), got.ravel(), d.ravel()
    nr, ng = math.sqrt(float(np.dot(r, r))), math.sqrt(float(np.dot(g, g)))
    if nr == 0 or ng == 0 or not math.isfinite(nr * ng):
        return float(nr == ng)
    gap = (float(np.dot(d, g)) + float(np.dot(d, r))) / (nr + ng)  # |g| - |r| = d.(g + r) / (|g| + |r|)
    one_minus = (float(np.dot(d, d)) - gap * gap) / (2 * nr * ng)
    return min(max(1.0 - one_minus, -1.0), 1.0)


def compare(ref: np.ndarray, got: np.ndarray) -> Metrics:
    with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are counted, not warned about
        return _compare(np.asarray(ref), np.asarray(got))


def _compare(ref: np.ndarray, got: np.ndarray) -> Metrics:
    if ref.size == 0:
        return Metrics(tuple(ref.shape), 0.0, 0.0, 0.0, 1.0, 0, 0, ())
    d = np.subtract(got, ref)
    diff = np.abs(d)
    worst = int(np.argmax(diff))  # a NaN, when there is one
    nan = inf = 0
    if not math.isfinite(float(diff.flat[worst])):
        nan, inf = int(np.isnan(got).sum()), int(np.isinf(got).sum())
        diff = np.nan_to_num(diff, nan=np.inf)
        got = np.nan_to_num(got)
        d = np.subtract(got, ref)
        worst = int(np.argmax(diff))
    rel = np.abs(ref)
    np.maximum(rel, np.finfo(np.float32).tiny, out=rel)
    np.divide(diff, rel, out=rel)
    return Metrics(tuple(ref.shape), float(diff.flat[worst]), float(np.mean(diff)), float(rel.max()),
                   _cosine(ref, got, d), nan, inf, tuple(int(i) for i in np.unravel_index(worst, diff.shape)))
