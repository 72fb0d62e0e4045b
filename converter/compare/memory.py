"""How much memory the forward check will need, estimated before it runs, against what is available.

The peak is both models (held already; a model whose weights are streamed, its part outside the
blocks and its largest block), the float64 reference's part widened for the whole run (held
already) and its largest blocks (widened as it runs, see compare/widen.py: one where they are
read from the checkpoint or a block is more than BLOCK_SHARE of the memory available), where
weights stream the free storage kept for the next blocks (a float64 block's, compare/recycle.py), and the
activations the run keeps: under a capture limit at most twice that limit (the forced passes hold
about as much again as the capture), which the captures keep to; where every layer's activations
are held at once, four times the floating outputs of one torch forward (torch's capture, paddle's,
the forced paddle pass and the float64 references' errors), measured by such a forward without
keeping them.

The capture limit (`capture_limit`) is CAPTURE_SHARE of the memory available; where the weights
are streamed, at most STREAMED_UNITS blocks' activations, measured on the first block by a torch
forward that ends once it has run: a model larger than memory holds a few blocks' activations at
a time, not a share of the memory that grows with the machine.

Before the models are built (`before_build`), the same parts are estimated from the checkpoint's
header (its keys, shapes and dtypes): the blocks are the families of keys `PREFIX.N.` that the
model's largest module lists hold, a floating tensor is held in the dtype the model computes in,
and the activations are what a run under a capture limit keeps at most (its share of the memory
left); set-up in memory also holds the converted paddle weights once more while it loads them. A
run that fits neither in memory nor streamed stops there, before anything is allocated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .widen import KEEP, STREAMED_KEEP
from ..errors import UserError

from .port import Session

GiB = 1 << 30
NARROW = 0.8  # a run needing more than this share of what is available is said so in the report
FULL_CAPTURE_COPIES = 4
CAPTURE_SHARE = 0.2  # the capture limit: this share of the memory available (verify/run.py)
STREAMED_UNITS = 4  # ... and where the weights are streamed, at most this many blocks' activations
BLOCK_SHARE = 0.05  # a float64 block over this share of the memory available: the reference widens one at a time


@dataclass
class Estimate:
    models: int  # both models' weights, held already
    reference: int  # the float64 reference's part held for the whole run, held already
    blocks: int  # its largest blocks, widened as it runs
    activations: int
    spare: int = 0  # free storage kept for the next block's tensors where weights stream (compare/recycle.py)

    @property
    def peak(self) -> int:
        return self.models + self.reference + self.blocks + self.activations + self.spare

    @property
    def more(self) -> int:
        """What the run takes beyond what the session holds now."""
        return self.blocks + self.activations + self.spare

    def parts(self) -> str:
        spare = f", {self.spare / GiB:.1f} GiB storage kept for the next blocks" if self.spare else ""
        return (f"{self.models / GiB:.1f} GiB both models, {(self.reference + self.blocks) / GiB:.1f} GiB the float64 "
                f"reference, {self.activations / GiB:.1f} GiB activations{spare}")


def available_memory(cap: int | None = None) -> tuple[int, str]:
    """(bytes available, where the figure comes from): the system's available memory, or what the
    cgroup's limit leaves (v2 memory.max, v1 memory.limit_in_bytes) where that is less, or what
    `cap` (the most this process may hold, --max-memory) leaves beside what it holds now."""
    found = [(n, "available memory") for n in [_meminfo_available()] if n is not None]
    if cap is not None:
        held = resident_bytes()
        found.append((max(0, cap - held), f"--max-memory {readable_size(cap)} less the {readable_size(held)} this process holds"))
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:
            found.append((max(0, cap - used), f"the cgroup's limit ({cap / GiB:.1f} GiB in {limit})"))
    return min(found) if found else (8 * GiB, "a guess (no /proc/meminfo)")


def readable_size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB // 10 else f"{n / (1 << 20):.0f} MiB"


def resident_bytes() -> int:
    """What this process holds in memory now (its resident set)."""
    import os
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the peak: an upper bound


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # no such file, or "max": no limit


def capture_limit(session: Session) -> int:
    """What the captures of a run under a capture limit may hold (the forced passes hold about as
    much again): CAPTURE_SHARE of the memory available; where a model's weights are streamed, at
    most STREAMED_UNITS times what one block's calls record on both sides (block_activations)."""
    limit = int(available_memory(session.options.max_memory)[0] * CAPTURE_SHARE)
    if session.streams:
        block = block_activations(session)
        if block:
            limit = min(limit, STREAMED_UNITS * block)
    return limit


def block_activations(session: Session) -> int | None:
    """Bytes the captures of both models hold for the torch model's first block: its calls' floating
    outputs, and inputs alike, in float32, on both sides (as the sweep counts a unit's, verify/sweep.py),
    from a torch forward that records shapes alone and ends once that block has run; None for a
    model without blocks."""
    from ..frameworks import torch_side
    from ..paths import is_under
    from .capture import capture_calls
    from .widen import _blocks
    model = session.torch_model
    blocks = _blocks(model)
    if not blocks:
        return None
    first = next(path for path, m in torch_side.named_layers(model) if m is blocks[0])
    outline = capture_calls(torch_side, model, session.run_torch, None, keep=False, until={first: 1})
    streamed = session.streams.get("torch")
    if streamed is not None:  # this thread's block goes: the passes run the model on the worker thread
        streamed.tensors.let_go()
    elements = sum(int(np.prod(shape)) for call in outline.calls.values() if is_under(call.path, first)
                   for shape in call.shapes)
    return 2 * 2 * 4 * elements


def estimate(session: Session, limit: int | None) -> Estimate:
    """The run's peak: its captures under `limit`, or (None) every layer's activations at once."""
    reference, blocks = session.reference64.most_bytes()
    activations = FULL_CAPTURE_COPIES * _forward_outputs(session) if limit is None else 2 * limit
    checkpoint = session.checkpoint
    spare = checkpoint.storages.cap if checkpoint is not None else 0
    return Estimate(_models_bytes(session), reference, blocks, activations, spare)


def _models_bytes(session: Session) -> int:
    """Both models' weights; a side streamed block by block (compare/stream.py) counts its part outside
    the blocks and its largest blocks."""
    streams = session.streams
    streamed = lambda side: sum(streams[side].tensors.most_bytes())  # the part outside the blocks, and its largest
    torch_bytes = streamed("torch") if "torch" in streams else _torch_bytes(session.torch_model)
    paddle_bytes = streamed("paddle") if "paddle" in streams else _paddle_bytes(session.paddle_model)
    return torch_bytes + paddle_bytes


def _available(session: Session) -> tuple[int, str]:
    """available_memory under the session's --max-memory; a UserError where it leaves none (said
    before any estimate: that of every layer's activations at once measures a forward)."""
    available, source = available_memory(session.options.max_memory)
    if available == 0:
        raise UserError(f"verify-port: {source} leaves no memory for the run: raise that limit, or free memory")
    return available, source


def whole_capture(session: Session) -> tuple[Estimate, str | None]:
    """The estimate of every layer's activations at once, and where they do not fit in the memory
    available, what the report's note says of it: the run then judges a few units at a time under a
    capture limit, and check() is asked about that run instead."""
    available, source = _available(session)
    one_block(session, available)
    est = estimate(session, None)
    if est.more <= available:
        return est, None
    return est, (f"memory: every layer's activations at once need about {readable_size(est.peak)} ({est.parts()}), "
                 f"{readable_size(est.more)} more than the set-up holds, and {readable_size(available)} is available by {source}")


def check(session: Session, limit: int | None, est: Estimate | None = None) -> list[str]:
    """The report's note when the run (its captures under `limit`, or every layer's activations at
    once) fits narrowly; a UserError when it does not fit (`est`: its estimate where made already).
    Where it fits with room to spare, the float64 reference and the streamed models keep as many
    blocks as half that room holds, in equal shares."""
    available, source = _available(session)
    one_block(session, available)
    est = est or estimate(session, limit)
    if est.more > available:
        raise UserError(f"verify-port needs about {est.peak / GiB:.1f} GiB ({est.parts()}): {est.more / GiB:.1f} GiB "
                        f"more than the set-up holds, and {available / GiB:.1f} GiB is available by {source}; give "
                        "smaller inputs, or free memory")
    room = NARROW * available - est.more
    if room > 0:  # half of what the run leaves free keeps more blocks made: fewer made again per pass
        held = [session.reference64.tensors, *(s.tensors for s in session.streams.values())]
        for tensors in held:
            tensors.hold_within(tensors.most_bytes()[1] + int(room / 2 / len(held)))
    notes = [f"memory: the {side} model's streamed weights are kept {s.tensors.keep} of {s.tensors.blocks} blocks at "
             f"a time, as the memory available leaves room" for side, s in session.streams.items()
             if s.tensors.keep > STREAMED_KEEP]
    if est.more > NARROW * available:
        notes.append(f"memory: the run needs about {est.more / GiB:.1f} GiB beyond the set-up's, of "
                     f"{available / GiB:.1f} GiB available by {source} (peak about {est.peak / GiB:.1f} GiB: {est.parts()})")
    return notes


def one_block(session: Session, available: int) -> None:
    """The float64 reference widens one block at a time where a block of it is more than BLOCK_SHARE
    of the memory available (a streamed model's already does)."""
    tensors = session.reference64.tensors
    if max(tensors.block_bytes(), default=0) > BLOCK_SHARE * available:
        tensors.keep = min(tensors.keep, 1)


def _torch_bytes(model) -> int:
    """Bytes of the model's parameters and buffers, tensors at one data pointer (tied weights) counted once."""
    return sum({t.data_ptr(): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}.values())


def _paddle_bytes(model) -> int:
    return sum(int(t.size) * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _forward_outputs(session: Session) -> int:
    """Bytes of the floating outputs of every torch module in one forward, none of them kept."""
    from ..frameworks import torch_side
    from ..tree import flatten
    total = 0

    def count(module, args, out):
        nonlocal total
        total += sum(t.numel() * t.element_size() for t in flatten(out, torch_side.is_float_tensor))
    handles = [m.register_forward_hook(count) for m in session.torch_model.modules()]
    try:
        session.run_torch()
    finally:
        for h in handles:
            h.remove()
    return total


# before the models are built -----------------------------------------------------------------------
_INDEXED = re.compile(r"^(.*?)\.(\d+)\.")  # 'model.layers.3.mlp.up.weight' -> ('model.layers', '3')


@dataclass
class HeldWeights:
    """One model's weights by what a run holds of them: the part outside the blocks, and each block."""

    outside: int
    blocks: list[int]

    @property
    def whole(self) -> int:
        return self.outside + sum(self.blocks)

    def streamed(self, keep: int) -> int:
        """The part outside the blocks and the `keep` largest blocks."""
        return self.outside + sum(sorted(self.blocks, reverse=True)[:keep])


def held_from_header(infos: dict, dtype: str | None = None, width: int | None = None) -> HeldWeights:
    """What a model built from a checkpoint with these TensorInfos holds: floating tensors in
    `dtype` (None: as stored), or `width` bytes an element where given (the float64 reference: 8)."""
    from .. import dtypes
    blocks: dict[tuple[str, str], int] = {}
    outside = 0
    found = key_blocks(infos)
    for key, info in infos.items():
        floating = info.dtype in dtypes.FLOATING
        size = info.numel * (width or dtypes.itemsize(dtype or info.dtype)) if floating else info.nbytes
        if width and not floating:
            size = 0  # the reference copies integer tensors: counted with the model's
        if key in found:
            blocks[found[key]] = blocks.get(found[key], 0) + size
        else:
            outside += size
    return HeldWeights(outside, list(blocks.values()))


def key_blocks(keys) -> dict[str, tuple[str, str]]:
    """key -> (list, index) for keys inside a model's blocks: the keys 'LIST.N....' whose LIST (the
    path before the first index) holds the most keys over two indices or more, and those of each
    other such LIST holding at least half as many (an encoder's and a decoder's layers), as
    compare/widen.py finds the blocks of a built model."""
    by_list: dict[str, dict[str, str]] = {}
    for key in keys:
        m = _INDEXED.match(key)
        if m:
            by_list.setdefault(m.group(1), {})[key] = m.group(2)
    lists = sorted(((len(members), name) for name, members in by_list.items()
                    if len(set(members.values())) > 1), reverse=True)
    if not lists:
        return {}
    most = lists[0][0]
    return {key: (name, index) for count, name in lists if 2 * count >= most
            for key, index in by_list[name].items()}


@dataclass
class Planned:
    """A run's peak estimated before its models are built: `in_memory` (set-up holding the converted
    paddle weights once more, then the run) and `streamed` (both models' weights streamed)."""

    in_memory: Estimate
    setup: int  # the in-memory set-up's peak
    streamed: Estimate

    @property
    def in_memory_peak(self) -> int:
        return max(self.setup, self.in_memory.peak)

    def need(self, available: int, where: str) -> str:
        """What the in-memory run needs against what is available, for a note or a refusal."""
        return (f"in memory the run needs about {self.in_memory_peak / GiB:.1f} GiB ({self.in_memory.parts()}), "
                f"and {available / GiB:.1f} GiB is available by {where}")

    def must_stream(self, available: int, where: str, command: str, train: bool, cannot_stream: str | None) -> str | None:
        """None where the run fits in memory, else what the in-memory run needs (both models' weights
        then stream block by block); a UserError in one line where they cannot: with `train` (the
        training checks hold both models), where the checkpoint cannot stream (`cannot_stream` says
        why and what to do), or where the run does not fit streamed either."""
        if self.in_memory_peak <= available:
            return None
        need = self.need(available, where)
        if train:
            raise UserError(f"verify-port --train: {need}, and the training checks hold both models: run without "
                            "--train (the forward check streams the weights block by block), or free memory")
        if cannot_stream is not None:
            raise UserError(f"{command}: {need}; {cannot_stream}")
        if self.streamed.peak > available:
            raise UserError(f"{command}: {need}; with both models' weights streamed block by block it needs about "
                            f"{self.streamed.peak / GiB:.1f} GiB ({self.streamed.parts()}): free memory, or run on a "
                            "machine with more")
        return need


def before_build(torch_infos: dict, available: int, torch_dtype: str | None = "float32", paddle_infos: dict | None = None,
                 paddle_dtype: str | None = None, paddle_streams: bool = True) -> Planned:
    """The peaks of a run from its checkpoint's header: torch's tensors (`torch_infos`, floating
    ones held in `torch_dtype`), paddle's (`paddle_infos`, floating ones in `paddle_dtype`: a paddle
    weights file; None: converted from torch's, the same bytes), the float64 reference's part
    outside the blocks and KEEP blocks (STREAMED_KEEP where streamed, as each side's), and the
    activations a run under a capture limit keeps at most. `paddle_streams`: the streamed run streams
    paddle's weights too (else it holds them all)."""
    torch_held = held_from_header(torch_infos, torch_dtype)
    paddle_held = torch_held if paddle_infos is None else held_from_header(paddle_infos, paddle_dtype)
    wide = held_from_header(torch_infos, width=8)
    reference = wide.outside
    blocks = wide.streamed(KEEP) - reference
    models = torch_held.whole + paddle_held.whole
    activations = int(2 * CAPTURE_SHARE * max(0, available - models - reference))
    in_memory = Estimate(models, reference, blocks, activations)
    paddle_streamed = paddle_held.streamed(STREAMED_KEEP) if paddle_streams else paddle_held.whole
    streamed_models = torch_held.streamed(STREAMED_KEEP) + paddle_streamed
    spare = max(wide.blocks, default=0)
    streamed = Estimate(streamed_models, reference, wide.streamed(STREAMED_KEEP) - reference,
                        int(2 * CAPTURE_SHARE * max(0, available - streamed_models - reference - spare)), spare)
    return Planned(in_memory, models + paddle_held.whole, streamed)
