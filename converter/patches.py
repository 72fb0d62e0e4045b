"""A library function replaced for the calling thread alone.

A verification replaces a few functions of torch while it builds or re-runs a model (a parameter
registered on the meta device, a fused attention asked for no causal mask). Saved and put back
around the work, such a patch changes every thread's function, and two verifications on two
threads that patch in turn put back each other's: one thread's patch outlives it. Here the
attribute is replaced once, while any thread is inside, by a dispatcher that calls the patched
function on the threads inside and the original on every other; the last thread out puts the
original back. Imports nothing of the package."""

from __future__ import annotations

import contextlib
import functools
import threading


class ThreadPatch:
    """`owner.name` replaced by `make(original)` on the threads inside `patched()`; the original
    elsewhere. One ThreadPatch per attribute, made once at import (patches.py keeps them)."""

    def __init__(self, owner, name: str):
        self.owner, self.name = owner, name
        self.lock = threading.Lock()
        self.original = None
        self.inside: dict[int, list] = {}  # thread -> its patched functions, innermost last

    @contextlib.contextmanager
    def patched(self, make):
        """Within: on this thread, `owner.name` is `make(original)` (nested calls stack); on the
        others, the original."""
        me = threading.get_ident()
        with self.lock:
            if not self.inside:
                self.original = original = getattr(self.owner, self.name)

                def dispatch(*args, **kwargs):  # a plain function: on a class it binds as the original does
                    mine = self.inside.get(threading.get_ident())
                    return (mine[-1] if mine else original)(*args, **kwargs)
                setattr(self.owner, self.name, functools.wraps(original)(dispatch))
            self.inside.setdefault(me, []).append(make(self.original))
        try:
            yield
        finally:
            with self.lock:
                stack = self.inside[me]
                stack.pop()
                if not stack:
                    del self.inside[me]
                if not self.inside:
                    setattr(self.owner, self.name, self.original)
                    self.original = None


_PATCHES: dict[tuple[int, str], ThreadPatch] = {}
_MADE = threading.Lock()


def thread_patch(owner, name: str) -> ThreadPatch:
    """The one ThreadPatch of `owner.name` (made on first use)."""
    with _MADE:
        return _PATCHES.setdefault((id(owner), name), ThreadPatch(owner, name))
