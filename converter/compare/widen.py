"""The float64 reference of a torch model, widened one block at a time.

A whole float64 copy of the model holds twice its float32 weights for the whole run. The
reference here has the model's module tree (a deep copy) whose floating parameters and buffers
are placeholders of their shape, float64 on the CPU (a view of one NaN: dtype and device read
right, values read too early give NaN). The model's layers are its *blocks*: the children of its
largest module list (and of any other list at least half its size, apart from it: an encoder's
and a decoder's layers). A hook on every module inside a block widens the whole block's tensors,
from the float32 model's own tensors (read, never changed), when one of them is called, so that a
call into the middle of a block finds its siblings widened too; the blocks used least recently
are dropped once more than KEEP are widened. Tensors outside every block (embeddings, heads,
final norms, tables a parent reads without calling their module) are widened for the whole run.

A tensor the float32 model shares between modules is one widened tensor shared the same way,
counted by the blocks that hold it. Two threads may run the reference at once: widening and
dropping take a lock, and the block a thread entered last is never dropped while that thread
lives.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

from ..lazy import import_torch

KEEP = 2  # blocks kept widened: a forced reference calls many modules of one block in a row
KINDS = ("_parameters", "_buffers")


@dataclass(eq=False)
class _Tensor:
    """One float32 tensor of the model and the places in the reference that hold it."""

    module: object  # a float32 module holding it, and where: read when widened (a later .cuda() moves it)
    kind: str
    name: str
    placeholder: object
    slots: list = field(default_factory=list)  # (reference module, kind, name)
    wide: object = None
    users: int = 0  # the widened blocks that hold it, and 1 if a module outside every block does


class Float64Reference:
    """`model` (a torch module, float32 or narrower, left as it is) as a float64 reference model:
    `.model` runs like a float64 copy of it, bit for bit."""

    def __init__(self, model, keep: int = KEEP):
        torch = import_torch()
        self.keep = keep
        self._lock = threading.Lock()
        nan = torch.full((), float("nan"), dtype=torch.float64)
        tensors: dict[int, _Tensor] = {}  # id of a float32 tensor -> its record
        memo = {}
        for module in model.modules():
            for kind in KINDS:
                for name, t in getattr(module, kind).items():
                    if t is None or id(t) in memo:
                        continue
                    if t.is_floating_point():
                        memo[id(t)] = _like(t, nan.expand(t.shape))
                        tensors[id(t)] = _Tensor(module, kind, name, memo[id(t)])
                    else:  # integer and boolean tensors are copied as they are (a count, a causal mask)
                        memo[id(t)] = _like(t, t.detach().to("cpu", copy=True))
        self.model = copy.deepcopy(model, memo)
        pairs = list(zip(model.modules(), self.model.modules()))
        blocks = _blocks(model)
        block_of = {}  # id of a float32 module -> the indices of the blocks it is in
        for i, block in enumerate(blocks):
            for m in block.modules():
                block_of.setdefault(id(m), []).append(i)
        held: list[dict[int, _Tensor]] = [{} for _ in blocks]  # per block, its tensors by id
        pinned: dict[int, _Tensor] = {}
        for module, module64 in pairs:
            owners = block_of.get(id(module), ())
            for kind in KINDS:
                for name, t in getattr(module, kind).items():
                    record = tensors.get(id(t)) if t is not None else None
                    if record is None:
                        continue
                    record.slots.append((module64, kind, name))
                    for i in owners:
                        held[i][id(record)] = record
                    if not owners:
                        pinned[id(record)] = record
            if owners:
                module64.register_forward_pre_hook(self._hook(owners), prepend=True)
        self._blocks = [list(tensors.values()) for tensors in held]
        self._pinned = list(pinned.values())
        for record in self._pinned:
            self._acquire(record)
        self._resident: list[int] = []  # widened blocks, the least recently entered first
        self._entered: dict[threading.Thread, int] = {}  # thread -> the block it entered last

    def _hook(self, owners: list[int]):
        first = owners[0]

        def widen_block(module, args):
            entered = self._entered.get(threading.current_thread())
            if entered not in owners:
                self.enter(first)
        return widen_block

    def enter(self, block: int) -> None:
        """Block `block` widened for this thread, which holds it until it enters another."""
        with self._lock:
            me = threading.current_thread()
            self._entered[me] = block
            if block in self._resident:
                self._resident.remove(block)
            else:
                for record in self._blocks[block]:
                    self._acquire(record)
            self._resident.append(block)
            self._entered = {t: b for t, b in self._entered.items() if t.is_alive()}
            held = set(self._entered.values())
            for old in [b for b in self._resident if b not in held][:max(0, len(self._resident) - self.keep)]:
                self._resident.remove(old)
                for record in self._blocks[old]:
                    self._release(record)

    def _acquire(self, record: _Tensor) -> None:
        if record.users == 0:
            torch = import_torch()
            t = getattr(record.module, record.kind)[record.name]
            record.wide = _like(t, t.detach().to("cpu", torch.float64, copy=True))
            for module64, kind, name in record.slots:
                getattr(module64, kind)[name] = record.wide
        record.users += 1

    def _release(self, record: _Tensor) -> None:
        record.users -= 1
        if record.users == 0:
            for module64, kind, name in record.slots:
                getattr(module64, kind)[name] = record.placeholder
            record.wide = None

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def most_bytes(self) -> tuple[int, int]:
        """(bytes widened for the whole run, bytes of the `keep` largest blocks besides): what one
        thread running it holds at most."""
        pinned = {id(r) for r in self._pinned}
        wide = lambda r: 8 * r.placeholder.numel()
        blocks = sorted((sum(wide(r) for r in records if id(r) not in pinned) for records in self._blocks), reverse=True)
        return sum(wide(r) for r in self._pinned), sum(blocks[:self.keep])

    def widened_blocks(self) -> list[int]:
        with self._lock:
            return list(self._resident)


def _like(t, data):
    """`data` as a parameter where `t` is one."""
    torch = import_torch()
    return torch.nn.Parameter(data, t.requires_grad) if isinstance(t, torch.nn.Parameter) else data


def _blocks(model) -> list:
    """The model's blocks: the children of its largest module list or Sequential (by the modules
    inside it), and of each other list at least half as large that neither holds nor is inside
    one taken; none in a model without a list of two modules or more."""
    torch = import_torch()
    lists = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) > 1]
    size = {id(m): sum(1 for _ in m.modules()) for m in lists}
    lists.sort(key=lambda m: -size[id(m)])
    blocks, taken = [], set()
    for lst in lists:
        if 2 * size[id(lst)] < size[id(lists[0])]:
            break
        inside = {id(m) for m in lst.modules()}
        if inside & taken:
            continue
        taken |= inside
        blocks += list(lst.children())
    return blocks
