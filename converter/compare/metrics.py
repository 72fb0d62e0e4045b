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


def rms(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """Root mean square of a (of a - b when b is given), in float64; 0 for no elements."""
    d = np.asarray(a, dtype=np.float64) if b is None else np.subtract(a, b, dtype=np.float64)
    return float(np.sqrt(np.mean(np.square(d)))) if d.size else 0.0


def rms_over(draws: list) -> np.ndarray:
    """Per element, the rms over several arrays of one shape (draws of one error), as float32."""
    total = np.zeros(np.shape(draws[0]), np.float64)
    for d in draws:
        total += np.square(np.asarray(d, dtype=np.float64))
    return np.sqrt(total / len(draws)).astype(np.float32)


def join(arrays: list[np.ndarray]) -> np.ndarray:
    """Several outputs of one layer as one array (one vector when there are several), in their
    own precision: the difference of two close float32 values is exact in float32."""
    if len(arrays) == 1:
        return np.asarray(arrays[0])
    return np.concatenate([np.asarray(a).ravel() for a in arrays])


def _cosine(rr: float, dr: float, dd: float) -> float:
    """cos(ref, got) from float32 dot products of ref and d = got - ref, exact to about 1e-12
    near 1: |g|^2 = |r|^2 + 2 d.r + |d|^2, |g| - |r| = (2 d.r + |d|^2) / (|g| + |r|), and
    1 - cos = (|d|^2 - (|g| - |r|)^2) / (2 |r| |g|)."""
    nr, ng = math.sqrt(rr), math.sqrt(max(rr + 2 * dr + dd, 0.0))
    if nr == 0 or ng == 0 or not math.isfinite(nr * ng):
        return float(nr == ng)
    gap = (2 * dr + dd) / (nr + ng)
    one_minus = (dd - gap * gap) / (2 * nr * ng)
    return min(max(1.0 - one_minus, -1.0), 1.0)


def compare(ref: np.ndarray, got: np.ndarray) -> Metrics:
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.size == 0:
        return Metrics(tuple(ref.shape), 0.0, 0.0, 0.0, 1.0, 0, 0, ())
    with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are counted, not warned about
        d = np.subtract(got, ref)
        r, flat = ref.ravel(), d.ravel()
        dd = float(np.dot(flat, flat))
        nan = inf = 0
        if math.isfinite(dd):
            dots = float(np.dot(r, r)), float(np.dot(flat, r)), dd  # before d loses its signs
            diff = np.abs(d, out=d)
        else:
            nan, inf = int(np.isnan(got).sum()), int(np.isinf(got).sum())
            diff = np.nan_to_num(np.abs(d), nan=np.inf)
            d = np.subtract(np.nan_to_num(got), ref).ravel()
            dots = float(np.dot(r, r)), float(np.dot(d, r)), float(np.dot(d, d))
        worst = int(np.argmax(diff))
        rel = np.abs(ref)
        rel += np.finfo(np.float32).tiny  # no division by 0; a no-op for any |ref| above about 1e-31
        np.divide(diff, rel, out=rel)
        return Metrics(tuple(ref.shape), float(diff.flat[worst]), float(np.add.reduce(diff, axis=None)) / diff.size,
                       float(rel.max()), _cosine(*dots), nan, inf,
                       tuple(int(i) for i in np.unravel_index(worst, diff.shape)))
