"""A source tensor's part of a target (Part) and the rules that make it (PartBuilder): the reshape,
the piece of a split or stack, the transpose and the cast that the plan's naming rules leave to each
source key (rules/plan.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..io.base import TensorInfo
from .ruleset import RuleIndex, RuleSet


@dataclass(frozen=True)
class Part:
    """One source tensor's contribution to a target, as a chain of views."""

    source: str
    reshape: tuple[int, ...] | None = None
    piece: tuple[int, int, int] | None = None  # (axis, start, stop) of a split
    perm: tuple[int, ...] | None = None

    def apply(self, array: np.ndarray) -> np.ndarray:
        if self.reshape is not None:
            array = array.reshape(self.reshape)
        if self.piece is not None:
            axis, start, stop = self.piece
            index = [slice(None)] * array.ndim
            index[axis] = slice(start, stop)
            array = array[tuple(index)]
        if self.perm is not None:
            array = array.transpose(self.perm)
        return array


class PartBuilder:
    """The rules of one plan applied to a source key: its reshape, piece, transpose and cast."""

    def __init__(self, sources: dict[str, TensorInfo], ruleset: RuleSet):
        self.sources = sources
        self.ruleset = ruleset
        self.index = RuleIndex(ruleset.rules)
        self.problems: list[str] = []

    def claim(self, key: str, group: str):
        """The one rule of `group` that matches `key`: None when none does, False when several do."""
        hits = self.index.matching(key, group)
        if len(hits) > 1:
            self.problems.append(f"source '{key}' matches {len(hits)} {group} rules ({'; '.join(r.where for r, _ in hits)}); "
                                 "make the patterns exclusive")
            return False
        return hits[0] if hits else None

    def part_for(self, key: str, piece=None, regroup: str | None = None):
        """Part and its resulting shape for one source key: its reshape rule, then `regroup` ("item":
        one item of a stack, given a leading axis of 1; "items": a stacked tensor with its first two
        axes as one, so that a piece of it is an item or part of one), then `piece`, then its
        transpose rule, which applies to the item where the tensor is one."""
        info = self.sources[key]
        shape = info.shape
        reshape = None
        hit = self.claim(key, "shape")
        if hit:
            rule = hit[0]
            reshape = tuple(rule.spec["shape"])  # non-negative integers (checked when the rule was read)
            if math.prod(reshape) != info.numel:
                self.problems.append(f"source '{key}' {info.describe()} cannot be reshaped to {list(reshape)} ({rule.where})")
                return None
            shape = reshape
        if regroup == "item":
            reshape = shape = (1,) + tuple(shape)
        elif regroup == "items":
            reshape = shape = (shape[0] * shape[1],) + tuple(shape[2:])
        if piece is not None:
            axis, start, stop = piece
            shape = shape[:axis] + (stop - start,) + shape[axis + 1:]
        perm = None
        hit = self.claim(key, "layout")
        if hit:
            rule = hit[0]
            lead = 1 if regroup == "item" else 0
            item = shape[lead:]
            perm = tuple(rule.spec.get("perm") or ())
            if not perm:
                if len(item) != 2:
                    self.problems.append(f"source '{key}' {info.describe()} is not 2-D; its transpose rule needs 'perm' ({rule.where})")
                    return None
                perm = (1, 0)
            if sorted(perm) != list(range(len(item))):
                self.problems.append(f"source '{key}' {info.describe()}: perm {list(perm)} does not fit its "
                                     f"{len(item)} axes ({rule.where})")
                return None
            perm = tuple(range(lead)) + tuple(p + lead for p in perm)
            shape = tuple(shape[p] for p in perm)
        return Part(key, reshape, piece, perm), shape

    def reshaped(self, key: str) -> tuple[int, ...]:
        """The key's shape after its reshape rule (that rule's problems are said by part_for)."""
        hit = self.index.matching(key, "shape")
        shape = tuple(hit[0][0].spec["shape"]) if len(hit) == 1 else self.sources[key].shape
        return shape if math.prod(shape) == self.sources[key].numel else self.sources[key].shape

    def number(self, rule, field_name: str):
        """The rule's `groups` or `count` (None when absent); False, with the problem noted, when the
        config field it names is unknown or not a positive integer."""
        value = rule.number(field_name, self.ruleset.params)
        if isinstance(value, str):
            self.problems.append(value)
            return False
        return value

    def cast_for(self, key: str, forced: str | None) -> str:
        info = self.sources[key]
        hit = self.claim(key, "dtype")
        if hit:
            return hit[0].spec["dtype"]
        if forced and info.dtype in dtypes.FLOATING:
            return forced
        return info.dtype
