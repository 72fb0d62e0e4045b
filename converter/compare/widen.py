"""Tensors of a module tree held one block at a time, and the float64 reference built on it.

BlockTensors is the machinery: a model's *blocks* are the children of its largest module list
(and of any other list at least half its size, apart from it: an encoder's and a decoder's
layers). Each tensor of the tree has a placeholder, which its places hold while it is not
needed, and a way to make the tensor itself. A hook on every module inside a block makes the
whole block's tensors when one of them is called, so that a call into the middle of a block finds
its siblings there too; the blocks used least recently go back to their placeholders once more
than KEEP are held (STREAMED_KEEP, one, where the tensors are read from a checkpoint; `hold_within`
keeps all of them where an allowance of bytes holds them), before the entered block is made.
Tensors outside every block (embeddings, heads, final norms, tables a parent reads without
calling their module) are made once and held for the whole run. A tensor shared
between modules is one tensor shared the same way, counted by the blocks that hold it. Two
threads may run the tree at once: making and dropping take a lock, and the block a thread entered
last is never dropped while that thread lives. compare/stream.py streams both models' own weights
from a checkpoint with it.

Float64Reference: the float64 reference of a torch model. A whole float64 copy of the model holds
twice its float32 weights for the whole run. The reference here has the model's module tree (a
deep copy) whose floating parameters and buffers are placeholders of their shape, float64 on the
CPU (a view of one NaN: dtype and device read right, values read too early give NaN), each block
widened from the float32 model's own tensors (read, never changed), or read from the checkpoint
in float64 where the model's weights are streamed, when it runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from ..lazy import import_torch
from ..tree import model_copy

KEEP = 2  # blocks kept: a forced reference calls many modules of one block in a row
STREAMED_KEEP = 1  # blocks kept where they are read from a checkpoint: one block of a model larger than memory
KINDS = ("_parameters", "_buffers")


@dataclass(eq=False)
class HeldTensor:
    """One tensor held block by block: how to make it, what stands in for it, and its places."""

    make: Callable[[], object]
    placeholder: object
    nbytes: int  # of the tensor made
    slots: list = field(default_factory=list)  # (module, kind, name)
    tensor: object = None
    users: int = 0  # the held blocks that hold it, and 1 if a module outside every block does


class BlockTensors:
    """The tensors of `blocks` (per block, its HeldTensor records) made when a block is entered and put
    back to their placeholders when it is dropped (`keep` blocks held); those of `pinned` made
    for the whole run. `close()` puts every place back to its placeholder."""

    def __init__(self, blocks: list[list[HeldTensor]], pinned: list[HeldTensor], keep: int = KEEP):
        self.keep = keep
        self._lock = threading.Lock()
        self._blocks = blocks
        self._pinned = pinned
        for record in self._pinned:
            self._acquire(record)
        self._resident: list[int] = []  # held blocks, the least recently entered first
        self._entered: dict[threading.Thread, int] = {}  # thread -> the block it entered last

    def hook(self, owners: list[int]):
        """A forward pre-hook (torch's and paddle's alike) entering the first of `owners` unless
        this thread is inside one of them already or the module returns recorded outputs."""
        first = owners[0]

        def enter_block(module, args):
            if getattr(vars(module).get("forward"), "returns_recorded", False):
                return  # it returns what an earlier pass recorded (compare/known.py): its weights are not used
            entered = self._entered.get(threading.current_thread())
            if entered not in owners:
                self.enter(first)
        enter_block.block_tensors = self
        return enter_block

    def enter(self, block: int) -> None:
        """Block `block` held for this thread, which keeps it until it enters another. The blocks
        it leaves over `keep` are dropped before its tensors are made (a tensor it shares with one
        of them is kept), so that `keep` blocks are the most held at any moment."""
        with self._lock:
            me = threading.current_thread()
            self._entered[me] = block
            made = block in self._resident
            if made:
                self._resident.remove(block)
            self._resident.append(block)
            self._entered = {t: b for t, b in self._entered.items() if t.is_alive()}
            held = set(self._entered.values())
            dropped = [b for b in self._resident if b not in held][:max(0, len(self._resident) - self.keep)]
            shared = [] if made else [r for r in self._blocks[block] if r.users]  # made already: no making
            for record in shared:
                self._acquire(record)
            self._drop(dropped)
            if not made:
                taken = {id(r) for r in shared}
                for record in self._blocks[block]:
                    if id(record) not in taken:
                        self._acquire(record)
        if dropped:
            give_back_freed()

    def done_hook(self):
        """A forward post-hook for the tree's root (torch's and paddle's alike): once a forward of
        the whole tree has returned, this thread leaves it (see leave)."""
        def leave_tree(module, args, output):
            self.leave()
        leave_tree.block_tensors = self
        return leave_tree

    def leave(self) -> None:
        """This thread is done with the tree: the block it entered last is held no longer, and the
        blocks no other thread holds are dropped (the next forward starts from the first block
        anyway). Nothing where every block is kept (hold_within)."""
        with self._lock:
            self._entered.pop(threading.current_thread(), None)
            if self.keep >= len(self._blocks):
                return
            held = {b for t, b in self._entered.items() if t.is_alive()}
            dropped = [b for b in self._resident if b not in held]
            self._drop(dropped)
        if dropped:
            give_back_freed()

    def let_go(self) -> None:
        """Where no thread runs the tree or reads its tensors: every block dropped and no thread's
        last block held any longer (a thread keeps the block it entered last while it lives, and
        a long-lived one would keep it beside the blocks another thread runs later). Nothing where
        every block is kept (hold_within)."""
        with self._lock:
            self._entered.clear()
            if self.keep >= len(self._blocks):
                return
            dropped = list(self._resident)
            self._drop(dropped)
        if dropped:
            give_back_freed()

    def _drop(self, blocks: list[int]) -> None:
        """`blocks` held no longer, their tensors no other block holds back to their placeholders."""
        for old in blocks:
            self._resident.remove(old)
            for record in self._blocks[old]:
                self._release(record)

    def _acquire(self, record: HeldTensor) -> None:
        if record.users == 0:
            record.tensor = record.make()
            for module, kind, name in record.slots:
                getattr(module, kind)[name] = record.tensor
        record.users += 1

    def _release(self, record: HeldTensor) -> None:
        record.users -= 1
        if record.users == 0:
            for module, kind, name in record.slots:
                getattr(module, kind)[name] = record.placeholder
            record.tensor = None

    def close(self) -> None:
        """Every place back to its placeholder, nothing held."""
        with self._lock:
            for record in [r for records in self._blocks for r in records] + self._pinned:
                record.users = 0
                record.tensor = None
                for module, kind, name in record.slots:
                    getattr(module, kind)[name] = record.placeholder
            self._resident.clear()
            self._entered.clear()

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def hold_within(self, allowance: int) -> int:
        """Keep every block once made where all of them fit in `allowance` bytes: a tree run again
        and again (the forward check's passes) then makes each block once instead of once per pass.
        Where they do not fit, `keep` stays as it was: passes run the blocks in order, so keeping
        some of them would only drop each before its next use. Returns the blocks kept."""
        if sum(self.block_bytes()) <= allowance:
            with self._lock:
                self.keep = max(self.keep, len(self._blocks))
        return self.keep

    def most_bytes(self) -> tuple[int, int]:
        """(bytes held for the whole run, bytes of the `keep` largest blocks besides): what one
        thread running the tree holds at most."""
        blocks = sorted(self.block_bytes(), reverse=True)
        return sum(r.nbytes for r in self._pinned), sum(blocks[:self.keep])

    def block_bytes(self) -> list[int]:
        """Each block's bytes besides those held for the whole run."""
        pinned = {id(r) for r in self._pinned}
        return [sum(r.nbytes for r in records if id(r) not in pinned) for records in self._blocks]

    def held_bytes(self) -> int:
        """Bytes of the tensors held now."""
        with self._lock:
            records = {id(r): r for r in [*self._pinned, *(r for rs in self._blocks for r in rs)]}
            return sum(r.nbytes for r in records.values() if r.users)

    def resident(self) -> list[int]:
        with self._lock:
            return list(self._resident)


def give_back_freed() -> None:
    """Freed memory handed back to the system (glibc's malloc_trim): glibc keeps what a dropped
    block freed for its next allocations, raising its mmap threshold to the size of the tensors
    it freed, so a process that makes and drops layers holds about a layer more than it uses (a
    streamed 103 M Llama: 2.5 GiB against 1.3 GiB). Nothing where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        import ctypes
        import ctypes.util
        try:
            _TRIM.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    return _TRIM[0]


def block_tensors(places, count: int, hook, keep: int = KEEP) -> BlockTensors:
    """BlockTensors over a module tree of `count` blocks. `places`: for every module whose places a
    tensor fills, (that module, the indices of the blocks it is in, [(kind, name, HeldTensor)]), one HeldTensor
    for a tensor the tree shares; `hook(module, pre_hook)` registers the hook on a module of a block."""
    held: list[dict[int, HeldTensor]] = [{} for _ in range(count)]
    pinned: dict[int, HeldTensor] = {}
    for place, owners, records in places:
        for kind, name, record in records:
            record.slots.append((place, kind, name))
            for i in owners:
                held[i][id(record)] = record
            if not owners:
                pinned[id(record)] = record
    tensors = BlockTensors([list(r.values()) for r in held], list(pinned.values()), keep)
    for place, owners, _ in places:
        if owners:
            hook(place, tensors.hook(owners))
    return tensors


class Float64Reference:
    """`model` (a torch module, float32 or narrower, left as it is) as a float64 reference model:
    `.model` runs like a float64 copy of it, bit for bit. `read` (a state-dict key, and a dtype
    or none for the model's own -> its tensor from the checkpoint in that dtype, on the CPU): the
    tensors are read from it in float64 instead of widened from the model's own (a model on the
    meta device, whose weights are streamed). `keep`: the blocks widened at a
    time; by default KEEP, one (STREAMED_KEEP) where read from the checkpoint."""

    def __init__(self, model, keep: int | None = None, read=None):
        torch = import_torch()
        keep = keep or (KEEP if read is None else STREAMED_KEEP)
        nan = torch.full((), float("nan"), dtype=torch.float64)
        names = tensor_names(model)
        records: dict[int, HeldTensor] = {}  # id of a tensor of the model -> its record
        memo = {}
        for module in model.modules():
            for kind in KINDS:
                for name, t in getattr(module, kind).items():
                    if t is None or id(t) in memo:
                        continue
                    if t.is_floating_point():
                        memo[id(t)] = _like(t, nan.expand(t.shape))
                        make = _widened(t, module, kind, name) if read is None else _read_wide(t, names[id(t)], read)
                        records[id(t)] = HeldTensor(make, memo[id(t)], 8 * t.numel())
                    else:  # integer and boolean tensors are copied as they are (a count, a causal mask)
                        data = t.detach() if read is None else read(names[id(t)])
                        memo[id(t)] = _like(t, data.to("cpu", copy=True))
        self.model = model_copy(model, memo)
        for module64 in self.model.modules():  # hooks that stream the model's own weights are not the reference's
            for hooks in (module64._forward_pre_hooks, module64._forward_hooks):
                for key in [k for k, h in hooks.items() if hasattr(h, "block_tensors")]:
                    del hooks[key]
        blocks = _blocks(model)
        block_of = _block_index(blocks, lambda b: b.modules())
        places = [(module64, block_of.get(id(module), []),
                   [(kind, name, records[id(t)]) for kind in KINDS for name, t in getattr(module, kind).items()
                    if t is not None and id(t) in records])
                  for module, module64 in zip(model.modules(), self.model.modules())]
        hook = lambda module, pre_hook: module.register_forward_pre_hook(pre_hook, prepend=True)
        self.tensors = block_tensors(places, len(blocks), hook, keep)
        if read is not None:  # read from the checkpoint, as the streamed models: a whole forward done, its last block goes
            self.model.register_forward_hook(self.tensors.done_hook())

    @property
    def blocks(self) -> int:
        return self.tensors.blocks

    def most_bytes(self) -> tuple[int, int]:
        """(bytes widened for the whole run, bytes of the `keep` largest blocks besides): what one
        thread running it holds at most."""
        return self.tensors.most_bytes()

    def widened_blocks(self) -> list[int]:
        return self.tensors.resident()


def tensor_names(model) -> dict[int, str]:
    """id of each tensor of a torch model -> its first state-dict key (buffers kept out of the
    state dict included)."""
    names = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for kind in KINDS:
            for name, t in getattr(module, kind).items():
                if t is not None:
                    names.setdefault(id(t), f"{prefix}.{name}" if prefix else name)
    return names


def _widened(t, module, kind: str, name: str):
    """The float32 tensor, read where the model holds it when made (a later .cuda() moves it), in float64."""
    def make():
        torch = import_torch()
        now = getattr(module, kind)[name]
        return _like(t, now.detach().to("cpu", torch.float64, copy=True))
    return make


def _read_wide(t, key: str, read):
    def make():
        return _like(t, read(key, import_torch().float64))
    return make


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
    return _largest_lists(lists, lambda m: sum(1 for _ in m.modules()), lambda m: list(m.modules()),
                          lambda m: list(m.children()))


def _block_index(blocks, inside) -> dict[int, list[int]]:
    """id of each module inside the blocks (`inside(block)`: a block's modules) -> the blocks it is in."""
    block_of: dict[int, list[int]] = {}
    for i, block in enumerate(blocks):
        for m in inside(block):
            block_of.setdefault(id(m), []).append(i)
    return block_of


def _largest_lists(lists, size, inside, children) -> list:
    """The children of the largest list, and of each other list at least half as large that
    neither holds nor is inside one taken (torch's and paddle's module lists alike)."""
    sizes = {id(m): size(m) for m in lists}
    lists = sorted(lists, key=lambda m: -sizes[id(m)])
    blocks, taken = [], set()
    for lst in lists:
        if 2 * sizes[id(lst)] < sizes[id(lists[0])]:
            break
        within = {id(m) for m in inside(lst)}
        if within & taken:
            continue
        taken |= within
        blocks += children(lst)
    return blocks
