"""Reading a source file that may change while it is read.

A memory map of a file that another process truncates (a checkpoint downloaded again while a
conversion runs) kills the reader with SIGBUS the moment it touches a page past the new end,
and Python cannot turn that signal into an exception. So tensor data is read with pread into
memory of our own, each read checked against the size the file had when it was opened: a file
that shrank is an error, never a signal. Before a commit the file is checked again (device,
inode, size, modification and status change times), so a file rewritten in place or
replaced meanwhile is an error too, rather than an output made of two versions.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import threading
import weakref

import numpy as np

from ..errors import UserError, quoted

PREAD_PIECE = 1 << 30  # bytes per preadv call (Linux moves at most about 2 GiB per call)
POOLED = 1 << 20  # reads from this size on go to memory used again (Pool)
POOL_BYTES = 32 << 20  # memory a Pool keeps while no array uses it


class Pool:
    """Memory for the tensors read, used again once no array holds it. Fresh pages cost the
    kernel a fault and a page of zeros each: reading BERT-large into fresh arrays spent a fifth
    of the conversion's CPU time clearing pages. An array handed out views a buffer of the pool
    (its views hold the array, so it dies only with the last of them); when it dies the buffer
    comes back, and at most POOL_BYTES are kept unused (the oldest go first). BERT-large to
    .pdparams, in process: 0.88 to 0.97 s of system time with 32 MiB kept, 1.29 to 1.47 s with
    none; its peak RSS 275 MiB against 252."""

    def __init__(self):
        self.free: list[mmap.mmap] = []
        self.lock = threading.Lock()

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        nbytes = count * dtype.itemsize
        with self.lock:  # the smallest free buffer that fits without wasting more than its need
            fits = [b for b in self.free if nbytes <= len(b) <= max(2 * nbytes, nbytes + POOLED)]
            buffer = min(fits, key=len) if fits else None
            if buffer is not None:
                self.free.remove(buffer)
        if buffer is None:
            buffer = mmap.mmap(-1, nbytes + -nbytes % POOLED, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        out = np.frombuffer(buffer, dtype=dtype, count=count)
        weakref.finalize(out, self._give_back, buffer)
        return out

    def _give_back(self, buffer: mmap.mmap) -> None:
        with self.lock:
            self.free.append(buffer)
            while sum(len(b) for b in self.free) > POOL_BYTES:
                self.free.pop(0)


POOL = Pool()
RECENT_BYTES = 64 << 20  # the tensors read last, kept for the self-check, which reads them behind the writer


class Recent:
    """The arrays read last, up to RECENT_BYTES together, held so that the self-check, running up
    to a few tensors behind the writer, finds the tensor the writer read rather than reading it
    again (a BERT-large conversion read 1.9 times its file without)."""

    def __init__(self):
        self.held = 0
        self.arrays: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()

    def add(self, key, array: np.ndarray) -> None:
        if array.nbytes > RECENT_BYTES:
            return
        with self.lock:
            self.arrays[key] = array
            self.held += array.nbytes
            while self.held > RECENT_BYTES:
                self.held -= self.arrays.popitem(last=False)[1].nbytes

    def drop(self, file_id: int) -> None:
        with self.lock:
            for key in [k for k in self.arrays if k[0] == file_id]:
                self.held -= self.arrays.pop(key).nbytes


RECENT = Recent()
_file_ids = itertools.count()


def changed(path: str, why: str) -> UserError:
    return UserError(f"SRC changed while it was being read: {quoted(path)} {why}; nothing was written: "
                     "run again once the file is complete (e.g. after its download has finished)")


def _identity(info: os.stat_result) -> tuple:
    """The status change time too: a rewrite in place that keeps the size and sets the old
    modification time back (`touch -r`, `rsync --inplace -t`) still moves it."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


class StableFile:
    """A file opened once and read with pread; `array()` gives fresh arrays (shared while someone
    holds them: a tensor read by the writer and by the check is read once)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.identity = _identity(os.fstat(self.fd))
        self.size = self.identity[2]
        self._live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._id = next(_file_ids)

    def read_into(self, buffer, offset: int) -> None:
        """Fill `buffer` (writable, bytes) from `offset`; a file that ends first has changed."""
        view = memoryview(buffer).cast("B")
        if offset + len(view) > self.size:
            raise changed(self.path, f"is read at bytes {offset}..{offset + len(view)} of a {self.size}-byte file")
        done = 0
        while done < len(view):
            n = os.preadv(self.fd, [view[done:done + PREAD_PIECE]], offset + done)
            if n == 0:
                now = os.fstat(self.fd).st_size
                raise changed(self.path, f"is {now} bytes now, {self.size} when it was opened")
            done += n

    def bytes(self, offset: int, n: int) -> bytes:
        buffer = bytearray(n)
        self.read_into(buffer, offset)
        return bytes(buffer)

    def array(self, key, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
        """`count` items of `dtype` from `offset`, read-only, in memory of their own; the array read
        for `key` earlier while it is still held anywhere."""
        found = self._live.get(key)
        if found is not None:
            return found
        out = POOL.array(dtype, count) if count * dtype.itemsize >= POOLED else np.empty(count, dtype=dtype)
        if out.nbytes:
            self.read_into(out, offset)
        out.flags.writeable = False
        self._live[key] = out
        RECENT.add((self._id, key), out)
        return out

    def check_unchanged(self) -> None:
        """The file under its path is still the file opened, with the same size and times."""
        try:
            there = _identity(os.stat(self.path))
        except OSError:
            raise changed(self.path, "was removed or renamed") from None
        if there[:2] != self.identity[:2]:  # checked first: unlinking the opened file moves its status change time
            raise changed(self.path, "was replaced by another file")
        now = _identity(os.fstat(self.fd))
        if now != self.identity or there != self.identity:
            what = "shrank or grew" if now[2] != self.size else "was written to"
            raise changed(self.path, f"{what} ({now[2]} bytes now, {self.size} when it was opened)")

    def close(self) -> None:
        RECENT.drop(self._id)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
