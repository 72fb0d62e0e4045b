"""Storage lent again to the next block's tensors of a streamed run.

A streamed run makes a block's weights each time a pass enters it and drops them when it
leaves (compare/widen.py): on a 7B model, hundreds of gigabytes made and dropped per check.
Memory fresh from the system comes as zeroed pages, one fault each, and clearing them cost
about a third of such a check's CPU (perf: clear_page under torch's and paddle's copies).
Storages lends torch tensors on storage it keeps a reference to: once every other holder has
let go (the tensor dropped by its module, a numpy view of it gone, paddle's tensor made from it
through DLPack freed, its Python storage object let go), the pool's reference is the storage's
only one, and the next tensor of the same size is made on it, in pages already mapped. Free storage over `cap` bytes goes back,
the oldest first, when the next tensor is asked for. Two threads may ask at once.
"""

from __future__ import annotations

import math
import sys
import threading

from ..lazy import import_torch


class Storages:
    """Torch CPU tensors made on storage lent again (see the module's docstring); `cap`: the
    bytes of free storage kept for the next tensors."""

    def __init__(self, cap: int):
        self.cap = cap
        self._lock = threading.Lock()
        self._lent: list = []  # untyped storages lent, the least recently lent first

    def empty(self, shape, dtype):
        """An uninitialised contiguous CPU tensor of `shape` and `dtype`, on a free storage of its
        size where the pool holds one."""
        torch = import_torch()
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            free = self._free()
            spare = next((s for s in reversed(free) if s.nbytes() == nbytes), None)
            over = sum(s.nbytes() for s in free if s is not spare) - self.cap
            for s in free:
                if over <= 0:
                    break
                if s is not spare:
                    self._lent.remove(s)
                    over -= s.nbytes()
            if spare is not None:
                self._lent.remove(spare)
                made = torch.empty(0, dtype=dtype).set_(spare, 0, tuple(shape))
            else:
                made = torch.empty(tuple(shape), dtype=dtype)
            self._lent.append(made.untyped_storage())
        return made

    def clear(self) -> None:
        """Every storage let go (those in use stay with their holders)."""
        with self._lock:
            self._lent.clear()

    def free_bytes(self) -> int:
        """Bytes of the storage lent that nothing but the pool holds now."""
        with self._lock:
            return sum(s.nbytes() for s in self._free())

    def _free(self) -> list:
        """The storages lent that nothing but the pool holds: no tensor, view, numpy array or
        DLPack capsule (each counts in the storage's own count), nor its Python storage object, which
        `untyped_storage()` hands out as the one the pool keeps (counted by Python: the list's
        reference and the call's argument alone)."""
        use_count = import_torch()._C._storage_Use_Count
        return [self._lent[i] for i in range(len(self._lent))
                if use_count(self._lent[i]._cdata) == 1 and sys.getrefcount(self._lent[i]) == 2]
