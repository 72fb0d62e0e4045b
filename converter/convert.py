"""The convert-weights engine: source -> plan -> streaming sink -> bit-exact check -> commit."""

from __future__ import annotations

import mmap
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from . import dtypes
from .errors import CheckFailed, UserError, one_line
from .io import open_sink_format, open_source, source_bytes
from .io.atomic import AtomicOutput, OutputGroup, check_outputs, write_texts
from .io.base import Source, TensorInfo
from .layout import bit_equal, bits, row_blocks
from .pipeline import BoundedWorkers
from .rules import MappingPlan, build_plan, resolve_mapping
from .rules.plan import TargetEntry, float_dtype
from .rules.ruleset import RuleSet
from .inmemory import SHOWN_BUFFERS, loose_plan, paddle_state


@dataclass
class ConversionResult:
    source: str
    output: str
    format: str
    mapping: str
    tensors: int
    bytes: int
    dropped: list[str]
    notes: list[str] = field(default_factory=list)
    check_ok: bool = False
    mismatches: list[str] = field(default_factory=list)
    missing_keys: list[str] | None = None
    unexpected_keys: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.check_ok and not self.missing_keys and not self.unexpected_keys

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"ok": self.ok}


WRITEBACK_EVERY = 64 << 20  # start the kernel's writeback this often, so the final fsync is short
CHECK_WINDOW = 32 << 20  # bytes of the written file mapped and compared at a time


class _ReadCache:
    """Keeps the last two source tensors read, so split pieces and aliases read their source once."""

    def __init__(self, source: Source):
        self.source = source
        self.items: dict[str, np.ndarray] = {}

    def __call__(self, key: str) -> np.ndarray:
        if key not in self.items:
            if len(self.items) >= 2:
                self.source.release(next(iter(self.items)))
                self.items.pop(next(iter(self.items)))
            self.items[key] = self.source.read(key)
        return self.items[key]


AUTO = "auto"  # --mapping auto: the shipped rule set that fits the checkpoint's keys


@dataclass(frozen=True)
class Targets:
    """The paddle model's state-dict entries, and which of them hold state rather than weights
    (buffers, parameters it does not train): those no torch tensor fills are not written."""

    infos: dict[str, TensorInfo]
    state: frozenset[str]
    tensors: tuple[tuple[str, ...], ...] = ()  # the keys that name one tensor with others (an LSTM's aliases)


def choose_ruleset(mapping: str | None, spec, infos: dict[str, TensorInfo] | None = None,
                   log=lambda line: None, target: str | None = None) -> tuple[RuleSet, Targets | None]:
    """The rule set to use and, when the paddle model is known, its state-dict entries. With
    neither a mapping nor a spec (or `auto`), the shipped set that fits `infos` (said on `log`),
    among `target`'s (paddleformers or paddlenlp) when given."""
    targets = None
    if spec is not None:
        from .frameworks.paddle_side import state_dict_infos
        model = spec.paddle_model()
        from .rules.infer import same_tensor_groups
        targets = Targets(state_dict_infos(model), frozenset(paddle_state(model)),
                          tuple(tuple(g) for g in same_tensor_groups(model.state_dict().items())))
    name = mapping or (spec.mapping if spec is not None else None)
    if name == AUTO or (not name and spec is None):
        from .rules.detect import detect
        found = detect(infos or {}, target=target)
        log(found.describe(len(infos)))
        return found.chosen.ruleset, targets
    if name:
        return resolve_mapping(str(name)), targets
    from .rules.infer import infer_ruleset
    return infer_ruleset(spec.torch_model(), model, partial=True), targets  # the paddle model built once


def _refuse_open(ruleset: RuleSet, emit_mapping: str | None, force: bool, log) -> None:
    """An inferred rule set with open items is refused; with --emit-mapping, the rules found so far
    are written first, the open items listed in the file, for the user to complete."""
    if not ruleset.open:
        return
    written = ""
    if emit_mapping:
        write_texts({emit_mapping: ruleset.to_json()}, force)
        log(f"wrote the {len(ruleset.rules)} rules inferred so far to {emit_mapping}, with the open items under 'open'")
        written = f"; the rules found so far are in {emit_mapping}: complete them and pass it back with --mapping"
    raise UserError(f"cannot infer a mapping from the two models ({len(ruleset.open)} problem(s)){written}; "
                    "fix the port or pass --mapping:", list(ruleset.open))


def plan_conversion(source: Source, ruleset: RuleSet, targets: Targets | None, dtype: str | None,
                    log=lambda line: None) -> MappingPlan:
    """The plan, checked against the paddle model's entries where they are known; its state that no
    torch tensor fills (a position_ids buffer, running statistics torch does not keep) is left out,
    said on `log`: the paddle model keeps its own."""
    infos = None
    if targets is not None:
        loose = loose_plan(source.infos, ruleset)
        filled = set() if loose is None else {n for e in loose.entries for n in (e.name, *e.aliases)}
        left = sorted(targets.state - filled) if loose is not None else []
        infos = {k: v for k, v in targets.infos.items() if k not in left}
        if left:
            log(f"note: {len(left)} paddle state tensor(s) that no torch tensor fills are not written (the paddle model "
                f"keeps its own): {', '.join(left[:SHOWN_BUFFERS])}{' ...' if len(left) > SHOWN_BUFFERS else ''}")
    dtype = dtypes.canonical(dtype) if dtype else None
    if targets is None or not targets.tensors:
        return build_plan(source.infos, ruleset, infos, dtype)
    plan = build_plan(source.infos, ruleset, infos, dtype, unfilled_ok=True)
    covered = _aliases_filled(plan, targets.tensors)
    if len(covered) < len(plan.unfilled):  # the rest said as the plan says it
        build_plan(source.infos, ruleset, {k: v for k, v in infos.items() if k not in covered}, dtype)
    plan.unfilled = []
    return plan


def _aliases_filled(plan: MappingPlan, tensors) -> set[str]:
    """The plan's unfilled targets that name a tensor one of its entries fills under another name
    (a rule file that maps an LSTM's 'weight_ih_l0' and not its '0.cell.weight_ih'): each added to
    that entry's aliases, so that the file holds it under both names, as paddle saves it."""
    by_name = plan.by_output_name()
    covered = set()
    unfilled = {info.name for info in plan.unfilled}
    for names in tensors:
        entry = next((by_name[n] for n in names if n in by_name), None)
        if entry is None:
            continue
        for name in names:
            if name in unfilled:
                entry.aliases += (name,)
                covered.add(name)
    return covered


def compare_rows(entry: TargetEntry, info: TensorInfo, got: np.ndarray, rows, read) -> str | None:
    """None when `got`, the written tensor's `rows` (a slice of its first axis, or `...`: all of
    it), holds exactly those rows of the plan's tensor, else why not (with the index in the whole
    tensor). Recomputes them from views of the source, apart from the writer's copies."""
    start, stop = (rows.start, rows.stop) if isinstance(rows, slice) else (0, None)
    offset = 0
    for part in entry.parts:
        view = part.apply(read(part.source))
        corner = [start] + [0] * (got.ndim - 1)
        index = [slice(None)] * got.ndim
        if entry.merge_axis == 0:  # the part's rows that fall in this window
            first, offset = offset, offset + view.shape[0]
            low, high = max(start, first), offset if stop is None else min(stop, offset)
            if low >= high:
                continue
            index[0], corner[0] = slice(low - start, high - start), low
            expected = view[low - first:high - first]
        else:
            expected = view[rows]
            if entry.merge_axis is not None:
                size = view.shape[entry.merge_axis]
                index[entry.merge_axis], corner[entry.merge_axis] = slice(offset, offset + size), offset
                offset += size
        expected = dtypes.cast(expected, entry.source_dtype, entry.dtype)
        block = got[tuple(index)]
        if not bit_equal(block, expected):
            diff = np.argwhere(bits(block) != bits(expected))[0]
            at = tuple(int(i) + c for i, c in zip(diff, corner))
            return f"'{info.name}': differs from source '{part.source}' at index {at}"
    return None


class ReadBack:
    """Reads each tensor back from the output file as soon as it is written, and compares it bit
    for bit with its source under the plan, on two worker threads while the next ones are
    produced (the comparison of a transposed tensor is the slowest step of a conversion). The
    file is mapped a window of rows at a time, so that a large tensor is never mapped whole."""

    def __init__(self, path: str, plan: MappingPlan, source: Source):
        self.fd = os.open(path, os.O_RDONLY)
        self.table = plan.by_output_name()
        self.source = source
        self.checker = BoundedWorkers(self._check, workers=2)

    def written(self, info: TensorInfo, offset: int) -> None:
        self.checker.submit(info.nbytes, info, offset)

    def _check(self, info: TensorInfo, offset: int) -> str | None:
        entry = self.table[info.name]
        if tuple(info.shape) != tuple(entry.shape) or info.dtype != entry.dtype:
            return f"'{info.name}': wrote {info.describe()}, planned {entry.dtype}{list(entry.shape)}"
        row_bytes = info.nbytes // info.shape[0] if info.shape and info.shape[0] else 0
        # each source decoded once for every window, by a path independent of the writer's (Source.reference)
        held = {part.source: self.source.reference(part.source) for part in entry.parts}
        try:
            for rows in row_blocks(info.shape, dtypes.itemsize(info.dtype), CHECK_WINDOW):
                begin = offset + (rows.start * row_bytes if isinstance(rows, slice) else 0)
                end = offset + (rows.stop * row_bytes if isinstance(rows, slice) else info.nbytes)
                why = self._check_window(entry, info, rows, begin, end, held.__getitem__)
                if why:
                    return why
            return None
        finally:
            del held
            for part in entry.parts:
                self.source.release(part.source)

    def _check_window(self, entry: TargetEntry, info: TensorInfo, rows, begin: int, end: int, read) -> str | None:
        dtype = dtypes.storage(info.dtype)
        shape = (rows.stop - rows.start, *info.shape[1:]) if isinstance(rows, slice) else info.shape
        if end == begin:
            return compare_rows(entry, info, np.empty(shape, dtype=dtype), rows, read)
        start = begin - begin % mmap.ALLOCATIONGRANULARITY
        view = mmap.mmap(self.fd, end - start, offset=start, access=mmap.ACCESS_READ)
        got = np.frombuffer(view, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=begin - start).reshape(shape)
        try:
            return compare_rows(entry, info, got, rows, read)
        finally:
            del got
            try:
                view.close()
            except BufferError:  # an error's traceback still holds the array; the mapping goes with it
                pass

    def close(self) -> list[str]:
        try:
            return [why for why in self.checker.close() if why]
        finally:
            os.close(self.fd)


def check_layout(path: str, fmt: str, plan: MappingPlan) -> list[str]:
    """Re-read the written file's structure: every name, dtype, shape and offset as planned."""
    expected = plan.output_infos()
    if fmt == "pdparams":
        from .io.pdparams import scan_written
        try:
            scan_written(path, expected)
        except UserError as exc:  # a byte that is not as planned: the check fails (exit 1)
            return [exc.message]
        return []
    from .io.safetensors_io import SafetensorsSource
    with SafetensorsSource(path) as out:
        found = list(out.infos.values())
    if found != expected:
        missing = sorted(set(i.name for i in expected) - set(i.name for i in found))
        return [f"written layout differs from the plan (missing {missing[:5]})"]
    return []


def write_plan(source: Source, plan: MappingPlan, output: AtomicOutput, fmt: str, progress: bool = True) -> None:
    """Write the plan's tensors to `output` (opened, not yet committed) as `fmt`, each read back and
    compared bit for bit with its source on worker threads, then the file's structure; any
    difference raises CheckFailed, so that the caller's commit never happens."""
    read = _ReadCache(source)
    by_name = plan.by_output_name()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=plan.total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="converting",
                   file=sys.stderr, leave=False, dynamic_ncols=True)
    written = [0]

    def on_written(nbytes):
        written[0] += nbytes
        if written[0] >= WRITEBACK_EVERY:
            written[0] = 0
            output.start_writeback()
        if bar is not None:
            bar.update(nbytes)
    try:
        from .io.pdparams import write_pdparams
        from .io.safetensors_io import write_safetensors
        writer = write_pdparams if fmt == "pdparams" else write_safetensors
        readback = ReadBack(output.readable_path(), plan, source)

        def on_data(info, offset):
            output.file.flush()  # the bytes must be in the file before they are read back
            readback.written(info, offset)
        try:
            writer(output.file, plan.output_infos(), lambda info: by_name[info.name].compute(read), on_written, on_data,
                   lambda info: source_bytes(by_name[info.name], source))  # bytes the plan leaves as they are: copied
        finally:
            mismatches = readback.close()
        source.check_unchanged()  # a source changed meanwhile is said as such, not as a mismatch
        output.sync_in_background()
        mismatches += check_layout(output.readable_path(), fmt, plan)
        if mismatches:
            raise CheckFailed(f"the written tensors do not match the source under mapping '{plan.ruleset}'; "
                              f"nothing was written to {output.path}", mismatches)
    finally:
        if bar is not None:
            bar.close()


def convert(src: str, dst: str, mapping: str | None = None, spec=None, dtype: str | None = None,
            force: bool = False, emit_mapping: str | None = None, progress: bool = True,
            log=lambda line: None, also_written: dict[str, str | None] | None = None,
            allow_outside_shards: bool = False, json_path: str | None = None,
            target: str | None = None) -> ConversionResult:
    """DST, --emit-mapping and the JSON report (`json_path`) are written together: all of them or,
    when anything fails, none (a file --force replaced is left as it was). `also_written` names
    the caller's own outputs (option -> path), checked with them before anything is written."""
    fmt = open_sink_format(dst)
    float_dtype(dtype)
    outputs = {"output": dst, "--emit-mapping": emit_mapping, "--json": json_path, **(also_written or {})}
    inputs = [None if os.path.isdir(src) else src, mapping, spec.path if spec is not None else None]
    check_outputs(outputs, inputs, force)  # a directory SRC is checked as the files it resolves to, below
    with open_source(src, allow_outside_shards) as source:
        check_outputs(outputs, inputs + list(source.files), force)
        for note in source.notes:
            log(f"note: {one_line(note)}")
        ruleset, targets = choose_ruleset(mapping, spec, source.infos, log, target)
        for note in ruleset.notes:
            log(f"note: {one_line(note)}")
        _refuse_open(ruleset, emit_mapping, force, log)
        plan = plan_conversion(source, ruleset, targets, dtype, log)
        result = ConversionResult(src, dst, fmt, ruleset.name, len(plan.output_infos()), plan.total_bytes,
                                  plan.dropped, list(source.notes))
        with OutputGroup(force) as group:
            report = group.file(json_path) if json_path else None  # opened first: a read-only disk fails now
            if emit_mapping:
                group.file(emit_mapping).file.write(ruleset.to_json().encode("utf-8"))
            output = group.file(dst)
            write_plan(source, plan, output, fmt, progress)
            result.check_ok = True
            if spec is not None:
                missing, result.unexpected_keys = _load_staged(spec, output, fmt)
                # state left out of the plan (said above) stays the paddle model's own
                result.missing_keys = [k for k in missing if targets is None or k not in targets.state]
            if report is not None:
                from .cli_common import json_text
                report.file.write(json_text(result.to_json()).encode("utf-8"))
    if emit_mapping:
        log(f"wrote the mapping ({len(ruleset.rules)} rules) to {emit_mapping}")
    return result


def _load_staged(spec, output: AtomicOutput, fmt: str) -> tuple[list[str], list[str]]:
    """Load the written, not yet committed file into the spec's paddle model (missing and
    unexpected keys), through a link whose name has the format's extension (the loader goes by it)."""
    import tempfile

    from .frameworks.paddle_side import load_into
    output.sync()
    with tempfile.TemporaryDirectory(prefix="convert-weights-") as scratch:
        link = os.path.join(scratch, f"staged.{fmt}")
        os.symlink(output.readable_path(), link)
        try:
            return load_into(spec.paddle_model(), link)
        except UserError as exc:  # said of the file being written, by the name it is written to
            raise UserError(exc.message.replace(link, output.path), exc.details) from None
