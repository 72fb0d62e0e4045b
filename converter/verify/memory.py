"""How much memory the forward check will need, estimated before it runs, against what is available.

The peak is both models (held already; a model whose weights are streamed, its part outside the
blocks and its two largest blocks), the float64 reference's part widened for the whole run
(held already) and its largest blocks (widened as it runs, see compare/widen.py), and the
activations the strategy keeps: under `auto` and `binary` at most twice the capture limit (the
forced passes hold about as much again as the capture), which they keep to; under `full`, four
times the floating outputs of one torch forward (torch's capture, paddle's, the forced paddle
pass and the float64 references' errors), measured by such a forward without keeping them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compare.widen import KEEP
from ..errors import UserError

GiB = 1 << 30
NARROW = 0.8  # a run needing more than this share of what is available is said so in the report
FULL_CAPTURE_COPIES = 4


@dataclass
class Estimate:
    models: int  # both models' weights, held already
    reference: int  # the float64 reference's part held for the whole run, held already
    blocks: int  # its largest blocks, widened as it runs
    activations: int

    @property
    def peak(self) -> int:
        return self.models + self.reference + self.blocks + self.activations

    @property
    def more(self) -> int:
        """What the run takes beyond what the session holds now."""
        return self.blocks + self.activations

    def parts(self) -> str:
        return (f"{self.models / GiB:.1f} GiB both models, {(self.reference + self.blocks) / GiB:.1f} GiB the float64 "
                f"reference, {self.activations / GiB:.1f} GiB activations")


def available_memory() -> tuple[int, str]:
    """(bytes available, where the figure comes from): the system's available memory, or what the
    cgroup's limit leaves (v2 memory.max, v1 memory.limit_in_bytes) where that is less."""
    found = [(n, "available memory") for n in [_meminfo_available()] if n is not None]
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:
            found.append((max(0, cap - used), f"the cgroup's limit ({cap / GiB:.1f} GiB in {limit})"))
    return min(found) if found else (8 * GiB, "a guess (no /proc/meminfo)")


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


def estimate(session, strategy: str, limit: int) -> Estimate:
    reference, blocks = session.reference64.most_bytes()
    if strategy == "full":
        activations = FULL_CAPTURE_COPIES * _forward_outputs(session)
    else:
        activations = 2 * limit
    return Estimate(_models_bytes(session), reference, blocks, activations)


def _models_bytes(session) -> int:
    """Both models' weights; a side streamed block by block (compare/stream.py) counts its part outside
    the blocks and its largest blocks."""
    from ..compare.stream import streamed_bytes
    streams = getattr(session, "streams", {})
    torch_bytes = streamed_bytes(streams["torch"]) if "torch" in streams else _torch_bytes(session.torch_model)
    paddle_bytes = streamed_bytes(streams["paddle"]) if "paddle" in streams else _paddle_bytes(session.paddle_model)
    return torch_bytes + paddle_bytes


def check(session, strategy: str, limit: int) -> list[str]:
    """The report's note when the run fits narrowly; a UserError when it does not fit. Where it fits
    with room to spare, the float64 reference and the streamed models keep as many blocks as half
    that room holds, in equal shares."""
    est = estimate(session, strategy, limit)
    available, source = available_memory()
    if est.more > available:
        hint = "run with --strategy binary (one unit's activations at a time), give smaller inputs, or free memory" \
            if strategy == "full" else "give smaller inputs, or free memory"
        raise UserError(f"verify-port needs about {est.peak / GiB:.1f} GiB ({est.parts()}): {est.more / GiB:.1f} GiB "
                        f"more than the set-up holds, and {available / GiB:.1f} GiB is available by {source}; {hint}")
    room = NARROW * available - est.more
    if room > 0:  # half of what the run leaves free keeps more blocks made: fewer made again per pass
        held = [session.reference64.tensors, *(s.tensors for s in getattr(session, "streams", {}).values())]
        for tensors in held:
            tensors.hold_within(tensors.most_bytes()[1] + int(room / 2 / len(held)))
    notes = [f"memory: the {side} model's streamed weights are kept {s.tensors.keep} of {s.tensors.blocks} blocks at "
             f"a time, as the memory available leaves room" for side, s in getattr(session, "streams", {}).items()
             if s.tensors.keep > KEEP]
    if est.more > NARROW * available:
        notes.append(f"memory: the run needs about {est.more / GiB:.1f} GiB beyond the set-up's, of "
                     f"{available / GiB:.1f} GiB available by {source} (peak about {est.peak / GiB:.1f} GiB: {est.parts()})")
    return notes


def _torch_bytes(model) -> int:
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def _paddle_bytes(model) -> int:
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        total += int(t.size) * t.element_size()
    return total


def _forward_outputs(session) -> int:
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
