"""Tensors a pass records, kept on disk instead of in memory.

The binary strategy's outline pass runs the whole model once; when no unit's boundary is over
budget, its sweep captures every unit again, a few at a time, so that each layer is judged on its
own budget. Those captures compute what the outline pass computed already: the same units on the
same inputs, with the same kernels. Where the outline pass is given a Spill, it writes every
call's inputs and outputs to a file as it records them, and the sweep (and the full capture of a
unit the search names) reads a chunk's calls back instead of running a capture pass of its own:
one forward fewer per side, on models whose activations at once are far larger than memory.

The file is made unlinked (nothing is left behind, however the process ends), on the disk of the
temporary folder (TMPDIR), never on one held in memory (tmpfs, ramfs: that memory is what the
strategy saves), and filled only while the disk keeps KEEP_FREE bytes free. A spill that could not
hold every call (the disk full, a write refused) says so (`complete`), and the passes run as they
would without one.

A tensor is written once per value: a module hands its input to a child, a wrapper returns its
child's output, and the calls share one record, so that reading them back gives them one tensor,
as the capture pass would have. A tensor changed in place after it was recorded (its version
counter moved) is written again; what each call saw is kept as it saw it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading

import numpy as np

from .capture import Call, call_tensors, replace_call_tensors, tensor_version
from .identity import ByIdentity
from ..tree import flatten, map_leaves, replace

KEEP_FREE = 2 * 2**30  # bytes a spill leaves free on its disk
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}


@dataclasses.dataclass(frozen=True, eq=False)
class Spilled:
    """One tensor's place in the spill file, and what its framework needs to make it again."""

    offset: int
    nbytes: int
    shape: tuple
    made: tuple  # the adapter's to_bytes gave it (dtype, device, ...)


@dataclasses.dataclass
class _Tensors:
    """A call's tensors as Spilled records, in the structures the call had them in."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    outputs: list = dataclasses.field(default_factory=list)
    returned: object = None


def _filesystem(folder: str) -> str | None:
    """The type of the filesystem holding `folder` (Linux: /proc/mounts), or None where unknown."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            table = [line.split()[1:3] for line in mounts if len(line.split()) > 2]
    except OSError:
        return None
    folder = os.path.realpath(folder)
    within = [(point, kind) for point, kind in table
              if folder == point or folder.startswith(point.rstrip("/") + "/")]
    return max(within, key=lambda m: len(m[0]))[1] if within else None


def on_disk(folder: str | None = None) -> str | None:
    """The folder a spill may use: `folder` (the temporary folder when None) where it is on a disk,
    None where it is held in memory."""
    folder = folder or tempfile.gettempdir()
    return None if _filesystem(folder) in MEMORY_FILESYSTEMS else folder


class Spill:
    """Recorded calls' tensors in one unlinked file; `side` is the framework's adapter. Written
    from one thread at a time (a pass's hooks); read back by `revive`."""

    def __init__(self, side, folder: str | None = None):
        self.side = side
        self.folder = on_disk(folder)
        self.complete = self.folder is not None
        self.calls: dict[str, _Tensors] = {}
        self._file = tempfile.TemporaryFile(dir=self.folder) if self.complete else None
        self._end = 0
        self._written = ByIdentity()  # tensor -> its record, stamped with its version counter
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._end

    def put(self, tensor) -> Spilled | None:
        """`tensor`'s record: written now, or the one written for it before where it is unchanged
        since; None once the spill is incomplete."""
        if not self.complete:
            return None
        stamp = tensor_version(tensor)
        found = self._written.get(tensor, stamp)
        if found is not None:
            return found
        data, made = self.side.to_bytes(tensor)
        record = Spilled(self._end, int(data.nbytes), tuple(tensor.shape), made)
        try:
            if data.nbytes > shutil.disk_usage(self.folder).free - KEEP_FREE:
                raise OSError("the disk would keep less than KEEP_FREE bytes free")
            _write(self._file.fileno(), data, record.offset)
        except OSError:
            self.close()  # nothing of an incomplete spill is read: its disk space goes back at once
            return None
        self._end += record.nbytes
        self._written.put(tensor, record, stamp)
        return record

    def record_inputs(self, path: str, args, kwargs, is_tensor) -> None:
        """The inputs of `path`'s call, as the call received them."""
        if not self.complete or path in self.calls:
            return
        tensors = call_tensors(args, kwargs, is_tensor)
        args, kwargs = replace_call_tensors(args, kwargs, is_tensor, [self.put(t) for t in tensors])
        self.calls[path] = _Tensors(args, kwargs)

    def record_outputs(self, path: str, output, is_tensor, is_float_tensor) -> None:
        """What `path`'s call returned: its floating tensors (Call.outputs) and its structure
        (Call.returned)."""
        call = self.calls.get(path)
        if not self.complete or call is None or call.returned is not None:
            return
        call.outputs = [self.put(t) for t in flatten(output, is_float_tensor)]
        call.returned = replace(output, [self.put(t) for t in flatten(output, is_tensor)], is_tensor)

    def reset(self) -> None:
        """Forget every record (the pass is recorded again); the file is written from its start."""
        self.calls.clear()
        self._written = ByIdentity()
        self._end = 0

    def revive(self, calls: dict[str, Call], paths) -> dict[str, Call]:
        """The calls at `paths` as a capture pass records them: `calls` (an outline: order, types,
        shapes) with their tensors read back, each record once, so that calls that shared a tensor
        share one again."""
        if not self.complete:
            raise ValueError("an incomplete spill cannot be read back")
        made: dict[int, object] = {}

        def tensor(record: Spilled):
            if id(record) not in made:
                data = np.empty(record.nbytes, dtype=np.uint8)
                if record.nbytes:
                    _read(self._file.fileno(), data, record.offset)
                made[id(record)] = self.side.from_bytes(data, record.shape, record.made)
            return made[id(record)]

        def back(value):
            return map_leaves(value, tensor, lambda v: isinstance(v, Spilled))
        out = {}
        for path in paths:
            if path not in calls or path not in self.calls:
                continue
            kept = self.calls[path]
            out[path] = dataclasses.replace(calls[path], args=back(kept.args), kwargs=back(kept.kwargs),
                                            outputs=[tensor(r) for r in kept.outputs], returned=back(kept.returned))
        return out

    def close(self) -> None:
        with self._lock:
            self.complete = False
            self.calls.clear()
            if self._file is not None:
                self._file.close()
                self._file = None


def _write(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _read(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(f"the spill file ends at byte {offset + done}, {len(view) - done} bytes early")
        done += n
