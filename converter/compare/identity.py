"""Values kept per object, for as long as that object lives unchanged.

The forced passes meet the same tensor many times (a parent hands its input on, a wrapper
returns its child's output), and what was worked out for it once holds every time. Entries
are keyed by id and checked by a weak reference, since an id is reused once its object is
gone, and by a stamp the caller derives (a version counter), since a tensor can change in
place. Nothing is kept alive by the table but the values themselves.
"""

from __future__ import annotations

import weakref

# Tables that only save work are named; a name in here turns that table off (every lookup
# misses), so that `python scripts/bench_verify.py caches` can measure what each one saves.
# Kept are those that save 5% or more of time or memory: "converted" and "known" (full capture
# of the benchmark's port holds 12% and 25% more without them). A float64 copy kept per recorded
# tensor, and the end-to-end and local figures kept by the identity of their arrays, saved
# under 5% of either, and are gone.
TURNED_OFF: set[str] = set()


class ByIdentity:
    def __init__(self, cache: str | None = None):
        """`cache`: the name of a table that only saves work; None for one whose values are
        part of the result (which copy a tensor was handed, which condition a wrapper shares)."""
        self._items: dict[int, tuple] = {}  # id -> (weakref, stamp, value)
        self._off = cache in TURNED_OFF

    def get(self, obj, stamp=None):
        """The value put for `obj` with this stamp, or None."""
        if self._off:
            return None
        entry = self._items.get(id(obj))
        if entry is not None and entry[0]() is obj and entry[1] == stamp:
            return entry[2]
        return None

    def put(self, obj, value, stamp=None) -> None:
        if self._off:
            return
        self._items[id(obj)] = (weakref.ref(obj), stamp, value)

    def weakly_kept(self, obj, make, stamp=None, usable=None):
        """A value made from `obj` by `make()` and kept only by weak reference: the one made
        before while something else holds it, the stamp agrees and `usable(value)` (when given)
        says yes; else a new one."""
        ref = self.get(obj, stamp)
        value = ref() if ref is not None else None
        if value is None or (usable is not None and not usable(value)):
            value = make()
            self.put(obj, weakref.ref(value), stamp)
        return value


def view_of(tensor) -> tuple:
    """What makes two torch tensors views of the same values: storage address, layout, dtype."""
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype
