"""The mapping plan: every source key mapped exactly once, or dropped explicitly.

Problems are collected as data (one line each, sorted) and raised together,
so a user sees every leftover key, unfilled target and shape mismatch at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import dtypes
from ..errors import UserError, quoted
from ..io.base import TensorInfo
from .parts import Part, PartBuilder
from .ruleset import RuleSet


@dataclass
class TargetEntry:
    name: str
    parts: list[Part]
    merge_axis: int | None
    source_dtype: str
    dtype: str
    shape: tuple[int, ...]
    aliases: tuple[str, ...] = ()

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.name, self.dtype, self.shape)

    def compute(self, read) -> np.ndarray:
        """The target's storage array; `read(source_key)` gives source arrays."""
        pieces = [part.apply(read(part.source)) for part in self.parts]
        array = pieces[0] if self.merge_axis is None else np.concatenate(pieces, axis=self.merge_axis)
        return dtypes.cast(array, self.source_dtype, self.dtype)


@dataclass
class MappingPlan:
    entries: list[TargetEntry]
    dropped: list[str]
    ruleset: str
    notes: list[str] = field(default_factory=list)
    # targets the paddle model holds as buffers it neither saves nor loads (not persistable): no
    # checkpoint reaches them, so the verifier compares them instead of filling them
    unloadable: list[TargetEntry] = field(default_factory=list)
    # the paddle model's entries that no source key fills, where the plan was asked to leave them
    # (build_plan's `unfilled_ok`): the paddle model keeps them as it built them
    unfilled: list[TensorInfo] = field(default_factory=list)

    def output_infos(self) -> list[TensorInfo]:
        """Every name written, aliases included (they hold the same tensor)."""
        out = []
        for e in self.entries:
            out.append(e.info)
            out.extend(TensorInfo(a, e.dtype, e.shape) for a in e.aliases)
        return out

    def by_output_name(self) -> dict[str, TargetEntry]:
        return _by_output_name(self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self.output_infos())


def _by_output_name(entries) -> dict[str, TargetEntry]:
    return {name: e for e in entries for name in (e.name, *e.aliases)}


def _names_written_twice(entries) -> list[str]:
    """An alias equal to another target or alias would write one name twice: the file would hold
    two tensors under it, and a reader would keep either."""
    seen: dict[str, str] = {}
    problems = []
    for e in entries:
        for name in (e.name, *e.aliases):
            if name in seen:
                problems.append(f"output '{name}' would be written twice (from '{seen[name]}' and from "
                                f"'{e.parts[0].source}'); give every target and alias its own name")
            seen[name] = e.parts[0].source
    return problems


def _first_missing(items: dict, want: int, shown: int = 5) -> list[int]:
    """The first few numbers below `want` that `items` lacks (in time of the items, not of `want`)."""
    out, i = [], 0
    while i < want and len(out) < shown:
        if i not in items:
            out.append(i)
        i += 1
    return out


def float_dtype(name: str | None) -> str | None:
    """--dtype's format by its canonical name: floating only (casting floats to integers or bool
    would turn 0.7 into 0 and NaN into INT64_MIN without a word)."""
    if name is None:
        return None
    try:
        canonical = dtypes.canonical(name)
    except UserError:
        canonical = None
    if canonical not in dtypes.FLOATING:
        what = "is not a floating format" if canonical else "is not a dtype"
        raise UserError(f"--dtype {quoted(name)} {what}; --dtype casts the floating tensors and takes one of "
                        f"{', '.join(dtypes.FLOATING)} (a cast rule in a rule file casts named tensors)")
    return canonical


def build_plan(sources: dict[str, TensorInfo], ruleset: RuleSet,
               targets: dict[str, TensorInfo] | None = None, dtype: str | None = None,
               unfilled_ok: bool = False) -> MappingPlan:
    """Map every source key through the rules; check against the target model's keys when given.
    `dtype` (--dtype) casts the floating tensors, and must itself be a floating format.
    `unfilled_ok`: a target that no source key fills is no problem where nothing else is wrong: it
    is listed in the plan's `unfilled` (the paddle model keeps it as built, and the verifier
    measures whether the model reads it)."""
    dtype = float_dtype(dtype)
    b = _PlanBuilder(sources, ruleset, dtype)
    for index, (key, info) in enumerate(sources.items()):
        b.map_key(index, key, info)
    b.join_merges()
    b.problems.extend(f"source '{key}' {b.sources[key].describe()} is not mapped by any rule; add a rename or drop "
                      "rule for it" for key in b.leftover)
    if targets is not None:
        b.check_against(targets)
    b.problems.extend(_names_written_twice(b.entries.values()))
    if b.problems and (not unfilled_ok or len(b.problems) > len(b.unfilled)):
        raise UserError(_refusal(ruleset.name, b.problems, len(b.unfilled)), sorted(set(b.problems)))
    plan = b.plan()
    plan.unfilled = [targets[name] for name in b.unfilled] if targets is not None else []
    return plan


def _refusal(name: str, problems: list[str], unfilled: int) -> str:
    """The heading of a plan's problems. Where the only problems are paddle tensors that no torch
    tensor fills, a rule that fills them from some torch tensor could hide the very bug the port has
    (a forward that reads its own tensor, not the one torch's weights fill): the heading says how to
    find out which tensors the paddle model reads."""
    if unfilled and unfilled == len(problems):
        return (f"mapping '{name}' fills {unfilled} paddle key(s) from no torch tensor; do not map a torch tensor "
                "onto one only to fill it: verify-port on the pair, both models in memory (built with their "
                "weights), keeps them as the paddle model built them and measures whether its layers read them (a "
                "tensor the forward reads but no torch weight fills is a bug of the port; one it never reads can be "
                "removed from it):")
    return (f"mapping '{name}' does not fit the checkpoint ({len(problems)} problem(s)); "
            "fix the rules (or --mapping) so that every key is mapped or dropped:")


class _PlanBuilder(PartBuilder):
    """The steps of build_plan: each source key mapped by its naming rule, merge parts joined,
    then what is left unmapped and what does not fit the target model, as problems."""

    def __init__(self, sources: dict[str, TensorInfo], ruleset: RuleSet, dtype: str | None):
        super().__init__(sources, ruleset)
        self.dtype = dtype
        self.entries: dict[str, TargetEntry] = {}
        self.order: dict[str, tuple[int, int]] = {}  # target -> (source position, part): the output order
        self.dropped: list[str] = []
        self.leftover: list[str] = []
        self.merges: dict[tuple[str, str], dict[int, str]] = {}  # (rule, target) -> part index -> key
        self.stacks: dict[tuple[str, str], dict[int, str]] = {}  # (rule, target) -> item number -> key
        self.merge_rules: dict[str, object] = {}  # rule.where -> rule (merge and stack)
        self.position = {key: i for i, key in enumerate(sources)}
        self.unfilled: list[str] = []  # targets no source key fills (each also a problem)

    def add(self, name: str, entry: TargetEntry, position: tuple[int, int], key: str) -> None:
        if name in self.entries:
            self.problems.append(f"target '{name}' is produced twice (from '{key}' and from "
                                 f"'{self.entries[name].parts[0].source}'); fix the rename rules")
            return
        self.entries[name] = entry
        self.order[name] = position

    def map_key(self, index: int, key: str, info: TensorInfo) -> None:
        hit = self.claim(key, "naming")
        if not hit:
            if hit is None and self.ruleset.unmatched == "keep":  # no naming rule touches it: it keeps its name
                self._rename(index, key, info, key, ())
            elif hit is None:
                self.leftover.append(key)
            return
        rule, (part_index, match) = hit
        if rule.kind == "drop":
            self.dropped.append(key)
        elif rule.kind == "rename":
            aliases = tuple(rule.expand(match, a) for a in rule.spec.get("aliases", ()))
            self._rename(index, key, info, rule.expand(match, rule.spec["to"]), aliases)
        elif rule.kind == "split":
            self._split(index, key, info, rule, [rule.expand(match, t) for t in rule.spec["to"]])
        elif rule.kind == "merge":
            name = rule.expand(match, rule.spec["to"])
            self.merge_rules[rule.where] = rule
            group = self.merges.setdefault((rule.where, name), {})
            if part_index in group:
                self.problems.append(f"target '{name}': part {part_index + 1} matched by both "
                                     f"'{group[part_index]}' and '{key}'")
            group[part_index] = key
        elif rule.kind == "stack":
            self._stack_item(key, rule, match)
        elif rule.kind == "unstack":
            self._unstack(index, key, info, rule, match)

    def _stack_item(self, key: str, rule, match) -> None:
        name = rule.expand(match, rule.spec["to"])
        text = match.group(rule.spec["index"]) or ""
        if not (text.isascii() and text.isdecimal()) or len(text) > 9:
            self.problems.append(f"source '{key}': its item number {quoted(text)} (group {quoted(rule.spec['index'])}) "
                                 f"is not a decimal number ({rule.where})")
            return
        self.merge_rules[rule.where] = rule
        items = self.stacks.setdefault((rule.where, name), {})
        if int(text) in items:
            self.problems.append(f"target '{name}': item {int(text)} matched by both '{items[int(text)]}' and '{key}'")
        items[int(text)] = key

    def _unstack(self, index: int, key: str, info: TensorInfo, rule, match) -> None:
        count = self.number(rule, "count")
        shape = self.reshaped(key)
        if count is False:
            return
        if len(shape) < 2 or shape[0] == 0:
            self.problems.append(f"source '{key}' {info.describe()} is not a stack of tensors (it needs a first axis "
                                 f"of items and at least one more axis) ({rule.where})")
            return
        if count is not None and shape[0] != count:
            self.problems.append(f"source '{key}' {info.describe()} holds {shape[0]} items, not the {count} its rule "
                                 f"says ({rule.where})")
            return
        templates = [rule.spec["to"]] if isinstance(rule.spec["to"], str) else rule.spec["to"]
        sizes = rule.spec.get("sizes")
        if sizes is None:
            if shape[1] % len(templates):
                self.problems.append(f"source '{key}' {info.describe()}: an item's first axis of size {shape[1]} does "
                                     f"not split into {len(templates)} equal parts ({rule.where})")
                return
            sizes = [shape[1] // len(templates)] * len(templates)
        if sum(sizes) != shape[1]:
            self.problems.append(f"source '{key}' {info.describe()}: sizes {sizes} do not add up to an item's first "
                                 f"axis, {shape[1]} ({rule.where})")
            return
        out_dtype = self.cast_for(key, self.dtype)
        for item in range(shape[0]):
            start = item * shape[1]
            for j, (template, size) in enumerate(zip(templates, sizes)):
                name = rule.expand(match, template, {rule.spec["index"]: str(item)})
                built = self.part_for(key, (0, start, start + size), "items")
                start += size
                if built is None:
                    return
                part, part_shape = built
                self.add(name, TargetEntry(name, [part], None, info.dtype, out_dtype, part_shape),
                         (index, item * len(templates) + j), key)

    def _rename(self, index: int, key: str, info: TensorInfo, name: str, aliases: tuple) -> None:
        out_dtype = self.cast_for(key, self.dtype)
        built = self.part_for(key)
        if built is not None:
            part, shape = built
            self.add(name, TargetEntry(name, [part], None, info.dtype, out_dtype, shape, aliases), (index, 0), key)

    def _split(self, index: int, key: str, info: TensorInfo, rule, names: list[str]) -> None:
        out_dtype = self.cast_for(key, self.dtype)
        reshaped = self.part_for(key)
        if reshaped is None:
            return
        axis = int(rule.spec["axis"])
        base_shape = reshaped[0].reshape or info.shape
        if not -len(base_shape) <= axis < len(base_shape):
            self.problems.append(f"source '{key}' {info.describe()} has no axis {axis} to split ({rule.where})")
            return
        axis %= len(base_shape)
        sizes = rule.spec.get("sizes")
        if sizes is None:
            if base_shape[axis] % len(names):
                self.problems.append(f"source '{key}' {info.describe()}: axis {axis} of size {base_shape[axis]} "
                                     f"does not split into {len(names)} equal parts ({rule.where})")
                return
            sizes = [base_shape[axis] // len(names)] * len(names)
        if sum(sizes) != base_shape[axis]:
            self.problems.append(f"source '{key}' {info.describe()}: split sizes {sizes} do not add up to "
                                 f"{base_shape[axis]} ({rule.where})")
            return
        groups = self.number(rule, "groups")
        if groups is False:
            return
        if groups and groups > 1:
            self._split_groups(index, key, info, rule, names, axis, sizes, groups, out_dtype)
            return
        start = 0
        for i, (name, size) in enumerate(zip(names, sizes)):
            part, shape = self.part_for(key, (axis, start, start + size))
            start += size
            self.add(name, TargetEntry(name, [part], None, info.dtype, out_dtype, shape), (index, i), key)

    def _split_groups(self, index: int, key: str, info: TensorInfo, rule, names: list[str], axis: int,
                      sizes: list[int], groups: int, out_dtype: str) -> None:
        """The inverse of a merge by groups: the axis holds `groups` groups one after the other, each
        holding every target's block in order; a target is its blocks, joined."""
        if any(size % groups for size in sizes):
            self.problems.append(f"source '{key}' {info.describe()}: the parts {sizes} on axis {axis} do not each "
                                 f"divide into {groups} groups ({rule.where})")
            return
        blocks = [size // groups for size in sizes]
        stride = sum(blocks)
        for i, name in enumerate(names):
            offset = sum(blocks[:i])
            built = [self.part_for(key, (axis, g * stride + offset, g * stride + offset + blocks[i]))
                     for g in range(groups)]
            if any(x is None for x in built):
                return
            part, shape = built[0]
            joined = part.perm.index(axis) if part.perm else axis
            shape = shape[:joined] + (sizes[i],) + shape[joined + 1:]
            self.add(name, TargetEntry(name, [p for p, _ in built], joined, info.dtype, out_dtype, shape), (index, i), key)

    def join_merges(self) -> None:
        for (where, name), items in self.stacks.items():
            self._join_stack(name, self.merge_rules[where], where, items)
        for (where, name), keys in self.merges.items():
            rule = self.merge_rules[where]
            if len(keys) != len(rule.patterns):
                missing = [str(i + 1) for i in range(len(rule.patterns)) if i not in keys]
                self.problems.append(f"target '{name}' is missing merge part(s) {', '.join(missing)} ({where})")
                continue
            self._join(name, rule, where, [keys[i] for i in range(len(keys))])

    def _join(self, name: str, rule, where: str, keys: list[str]) -> None:
        built = [self.part_for(k) for k in keys]
        if any(x is None for x in built):
            return
        axis = int(rule.spec["axis"])
        shapes = [s for _, s in built]
        ndim = len(shapes[0])
        if not -ndim <= axis < ndim or any(len(s) != ndim for s in shapes):
            self.problems.append(f"target '{name}': parts {shapes} cannot be joined on axis {axis} ({where})")
            return
        axis %= ndim
        if any(s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes):
            self.problems.append(f"target '{name}': parts {[list(s) for s in shapes]} differ off axis {axis} ({where})")
            return
        src_dtypes = {self.sources[k].dtype for k in keys}
        if len(src_dtypes) > 1:
            self.problems.append(f"target '{name}': parts have different dtypes {sorted(src_dtypes)} ({where})")
            return
        shape = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
        groups = self.number(rule, "groups")
        if groups is False:
            return
        parts = [p for p, _ in built]
        if groups and groups > 1:
            parts = self._blocks(name, keys, parts, [s[axis] for s in shapes], axis, groups, where)
            if parts is None:
                return
        first = keys[0]
        position = min(self.position[k] for k in keys)
        self.add(name, TargetEntry(name, parts, axis, self.sources[first].dtype,
                                   self.cast_for(first, self.dtype), shape), (position, 0), first)

    def _blocks(self, name: str, keys: list[str], parts: list[Part], sizes: list[int], axis: int, groups: int,
                where: str) -> list[Part] | None:
        """A merge by groups as a concatenation of blocks: each part cut in `groups` equal blocks along
        the target's axis (the source's axis before its transpose), block 0 of every part first."""
        if any(size % groups for size in sizes):
            self.problems.append(f"target '{name}': parts of sizes {sizes} on axis {axis} do not each divide "
                                 f"into {groups} groups ({where})")
            return None
        out = []
        for g in range(groups):
            for key, part, size in zip(keys, parts, sizes):
                block = size // groups
                source_axis = part.perm[axis] if part.perm else axis
                out.append(self.part_for(key, (source_axis, g * block, (g + 1) * block))[0])
        return out

    def _join_stack(self, name: str, rule, where: str, items: dict[int, str]) -> None:
        """The items on a new first axis, in the order of their numbers, which run 0 .. n-1 (n is the
        rule's `count` where it gives one)."""
        count = self.number(rule, "count")
        if count is False:
            return
        want = count if count is not None else max(items) + 1
        extra = sorted(i for i in items if i >= want)
        missing = want - (len(items) - len(extra))
        if missing or extra:
            shown = [str(i) for i in _first_missing(items, want)]
            shown = ", ".join(shown) + (", ..." if missing > len(shown) else "")
            why = f"is missing item(s) {shown}" if missing else f"has item(s) {extra[:5]} past the {want} its rule says"
            self.problems.append(f"target '{name}' {why} ({where})")
            return
        keys = [items[i] for i in range(want)]
        built = [self.part_for(k, None, "item") for k in keys]
        if any(x is None for x in built):
            return
        shapes = {s for _, s in built}
        if len(shapes) > 1:
            self.problems.append(f"target '{name}': items differ in shape {sorted(list(s[1:]) for s in shapes)} ({where})")
            return
        src_dtypes = {self.sources[k].dtype for k in keys}
        if len(src_dtypes) > 1:
            self.problems.append(f"target '{name}': items have different dtypes {sorted(src_dtypes)} ({where})")
            return
        shape = (want,) + built[0][1][1:]
        position = min(self.position[k] for k in keys)
        self.add(name, TargetEntry(name, [p for p, _ in built], 0, self.sources[keys[0]].dtype,
                                   self.cast_for(keys[0], self.dtype), shape), (position, 0), keys[0])

    def check_against(self, targets: dict[str, TensorInfo]) -> None:
        """Every target filled, in its shape, and nothing written that the target model lacks."""
        produced = _by_output_name(self.entries.values())
        for name, tinfo in targets.items():
            e = produced.get(name)
            if e is None:
                self.unfilled.append(name)
                self.problems.append(f"target '{name}' {tinfo.describe()} is not filled by any source key")
            elif tuple(e.shape) != tuple(tinfo.shape):
                srcs = ", ".join(f"'{p.source}' {self.sources[p.source].describe()}" for p in e.parts)
                self.problems.append(f"target '{name}' expects shape {list(tinfo.shape)} but gets {list(e.shape)} "
                                     f"from {srcs}")
        for name in produced:
            if name not in targets:
                self.problems.append(f"target '{name}' (from '{produced[name].parts[0].source}') is not in the "
                                     "paddle model")

    def plan(self) -> MappingPlan:
        ordered = sorted(self.entries.values(), key=lambda e: self.order[e.name])
        return MappingPlan(ordered, self.dropped, self.ruleset.name)
