"""Values kept per object, for as long as that object lives unchanged.

The forced passes meet the same tensor many times (a parent hands its input on, a wrapper
returns its child's output), and what was worked out for it once holds every time. Entries
are keyed by id and checked by a weak reference, since an id is reused once its object is
gone, and by a stamp the caller derives (a version counter), since a tensor can change in
place. Nothing is kept alive by the table but the values themselves.
"""

from __future__ import annotations

import weakref


class ByIdentity:
    def __init__(self):
        self._items: dict[int, tuple] = {}  # id -> (weakref, stamp, value)

    def get(self, obj, stamp=None):
        """The value put for `obj` with this stamp, or None."""
        entry = self._items.get(id(obj))
        if entry is not None and entry[0]() is obj and entry[1] == stamp:
            return entry[2]
        return None

    def put(self, obj, value, stamp=None) -> None:
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
