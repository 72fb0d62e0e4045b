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
hold every call (the disk full, a write refused, a tensor it cannot write as bytes or whose
changes in place it cannot see: one without a version counter, made under torch.inference_mode)
says so (`complete`), and the passes run as they would without one.

What is read back is what a capture pass records (capture.Recorder), tensor for tensor, since the
analysis reads identities too (a wrapper returning its child's output, an input handed on):
* values are written once per storage and version (torch: the storage the tensor views, so that
  a view read back views the same values as the tensor it was made from; paddle: the tensor), and
  calls that shared a tensor share one again;
* a call whose tensors were changed in place after it (their version counter moved: seen where
  the spill meets the tensor again, in torch's in-place functions while the pass runs, or at its
  end) is read back on copies of its own, without its returned structure, as the capture pass
  records such a call. Its values are those the call saw, as there.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import weakref

import numpy as np

from .capture import Call, call_tensors, replace_call_tensors, tensor_version
from .identity import ByIdentity
from ..tree import flatten, map_leaves, replace

KEEP_FREE = 2 * 2**30  # bytes a spill leaves free on its disk
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}


@dataclasses.dataclass(eq=False)
class _Values:
    """One storage's (paddle: tensor's) bytes at one version, at `offset` in the file."""

    offset: int
    nbytes: int
    version: int | None
    changed_later: bool = False  # changed in place after it was written


@dataclasses.dataclass(frozen=True, eq=False)
class Spilled:
    """One recorded tensor: the values it views and where it sits in them (the adapter's)."""

    values: _Values
    where: tuple


@dataclasses.dataclass
class _Tensors:
    """A call's tensors as Spilled records, in the structures the call had them in."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    outputs: list = dataclasses.field(default_factory=list)
    returned: object = None

    def records(self) -> list:
        return flatten((self.args, self.kwargs, self.outputs, self.returned), lambda v: isinstance(v, Spilled))


def free_bytes(folder: str) -> int:
    """The bytes free on the disk holding `folder`, read each time a spill writes."""
    return shutil.disk_usage(folder).free


def _filesystem(folder: str) -> str | None:
    """The type of the filesystem holding `folder` (Linux: /proc/mounts), or None where unknown."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            return mount_type(os.path.realpath(folder), mounts.read())
    except OSError:
        return None


def mount_type(folder: str, mounts: str) -> str | None:
    """The type of the filesystem holding the absolute path `folder` in a mount table (/proc/mounts'
    text: device, mount point with octal escapes, type, ...): the last mount of the deepest mount
    point holding it (a later mount on the same point hides the earlier)."""
    unescaped = lambda field: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
    table = [(unescaped(fields[1]), fields[2]) for fields in (line.split() for line in mounts.splitlines())
             if len(fields) > 2]
    within = [(len(point), i, kind) for i, (point, kind) in enumerate(table)
              if folder == point or folder.startswith(point.rstrip("/") + "/")]
    return max(within)[2] if within else None


def on_disk(folder: str | None = None) -> str | None:
    """The folder a spill may use: `folder` (the temporary folder when None) where it is on a disk,
    None where it is held in memory."""
    folder = folder or tempfile.gettempdir()
    return None if _filesystem(folder) in MEMORY_FILESYSTEMS else folder


class Spill:
    """Recorded calls' tensors in one unlinked file; `side` is the framework's adapter. Written
    from the thread running the pass (its hooks); read back by `revive`."""

    def __init__(self, side, folder: str | None = None):
        self.side = side
        self.folder = on_disk(folder)
        self.calls: dict[str, _Tensors] = {}
        self._file = None
        if self.folder is not None:
            try:
                self._file = tempfile.TemporaryFile(dir=self.folder)
            except OSError:  # a folder gone, or not writable: no spill
                pass
        self.complete = self._file is not None
        self.nbytes = 0  # bytes written to the file
        self._tensors = ByIdentity()  # tensor -> its record, stamped with its version counter
        self._values = ByIdentity()  # storage (paddle: tensor) -> the _Values written for it
        self._met: list = []  # (weak reference to a tensor recorded, its record): checked at the pass's end
        self._writing = False

    def put(self, tensor) -> Spilled | None:
        """`tensor`'s record: written now, or the one written for it before where it is unchanged
        since; None once the spill is incomplete."""
        if not self.complete:
            return None
        version = tensor_version(tensor)
        found = self._tensors.get(tensor, version)
        if found is not None and not found.values.changed_later:
            return found
        self._writing = True  # (the adapter's own copies change nothing recorded)
        try:
            if version is None:  # (torch's inference tensors): a change in place would not show
                raise ValueError("a tensor without a version counter is not spilled")
            base, data, where = self.side.values_of(tensor)
            written = self._values.get(base)
            if written is None:
                written = []
                self._values.put(base, written)
            for values in written:  # written at versions other than its counter's now: changed in place since
                if values.version != version:
                    values.changed_later = True
            # values changed since are not these, whatever the version this tensor's counter says
            # (`.data` and other aliases keep counters of their own)
            values = next((v for v in written if v.version == version and not v.changed_later), None)
            if values is None:
                array = data()
                values = _Values(self.nbytes, int(array.nbytes), version)
                if array.nbytes > free_bytes(self.folder) - KEEP_FREE:
                    raise OSError("the disk would keep less than KEEP_FREE bytes free")
                _write(self._file.fileno(), array, values.offset)
                self.nbytes += values.nbytes
                written.append(values)
        except Exception:  # noqa: BLE001 - a disk full, a tensor not written as bytes: the passes run
            self.close()  # as without a spill, whose disk space goes back at once
            return None
        finally:
            self._writing = False
        record = Spilled(values, where)
        self._tensors.put(tensor, record, version)
        self._met.append((weakref.ref(tensor), record))
        return record

    def changed(self, tensor) -> None:
        """`tensor` was changed in place (the adapter's in_place_changes)."""
        if self._writing or not self.complete:
            return
        try:
            written = self._values.get(self.side.values_of(tensor)[0])
        except Exception:  # noqa: BLE001 - a tensor the spill cannot hold: it holds nothing of it
            return
        for values in written or ():  # every value written for its storage before: whatever its counter says
            values.changed_later = True

    def watching(self):
        """The context of the pass: torch's changes in place seen as they happen."""
        return self.side.in_place_changes(self.changed)

    def finish(self) -> None:
        """The pass has ended: the tensors recorded that still live and were changed in place since."""
        for ref, record in self._met:
            tensor = ref()
            if tensor is not None and tensor_version(tensor) != record.values.version:
                record.values.changed_later = True
        self._met.clear()

    def record_inputs(self, path: str, args, kwargs) -> None:
        """The inputs of `path`'s call (its first: the only one the Recorder records), as it received them."""
        if not self.complete:
            return
        tensors = call_tensors(args, kwargs, self.side.is_tensor)
        args, kwargs = replace_call_tensors(args, kwargs, self.side.is_tensor, [self.put(t) for t in tensors])
        self.calls[path] = _Tensors(args, kwargs)

    def record_outputs(self, path: str, output) -> None:
        """What `path`'s call returned: its floating tensors (Call.outputs) and its structure
        (Call.returned)."""
        call = self.calls.get(path)
        if not self.complete or call is None:
            return
        call.outputs = [self.put(t) for t in flatten(output, self.side.is_float_tensor)]
        call.returned = replace(output, [self.put(t) for t in flatten(output, self.side.is_tensor)], self.side.is_tensor)

    def reset(self) -> None:
        """Forget every record (the pass is recorded again); the file is written from its start."""
        self.calls.clear()
        self._tensors, self._values, self._met, self.nbytes = ByIdentity(), ByIdentity(), [], 0

    def revive(self, calls: dict[str, Call], paths) -> dict[str, Call]:
        """The calls at `paths` as a capture pass records them: `calls` (an outline: order, types,
        shapes) with their tensors read back (see the module's notes)."""
        if not self.complete:
            raise ValueError("an incomplete spill cannot be read back")
        shared: dict[int, object] = {}  # id(_Values or Spilled) -> what was made of it

        def values(record: Spilled, table: dict):
            found = table.get(id(record.values))
            if found is None:
                data = np.empty(record.values.nbytes, dtype=np.uint8)
                if data.nbytes:
                    _read(self._file.fileno(), data, record.values.offset)
                found = table[id(record.values)] = self.side.values_from(data, record.where)
            return found

        def made(record: Spilled, table: dict):
            if id(record) not in table:
                table[id(record)] = self.side.tensor_in(values(record, table), record.where)
            return table[id(record)]

        out = {}
        for path in paths:
            if path not in calls or path not in self.calls:
                continue
            kept = self.calls[path]
            # the capture keeps a call's inputs and returned structure as the tensors themselves and
            # its outputs as aliases of them (detached); a call changed in place after it, as copies
            # of its own: its inputs on one, each output on its own, no returned structure
            copies = any(r.values.changed_later for r in kept.records())
            table = {} if copies else shared
            back = lambda value, _t=table: map_leaves(value, lambda one: made(one, _t), lambda v: isinstance(v, Spilled))
            outputs = [self.side.tensor_in(values(r, {} if copies else shared), r.where) for r in kept.outputs]
            out[path] = dataclasses.replace(calls[path], args=back(kept.args), kwargs=back(kept.kwargs), outputs=outputs,
                                            returned=None if copies else back(kept.returned))
        return out

    def close(self) -> None:
        self.complete = False
        self.calls.clear()
        self._met.clear()
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
