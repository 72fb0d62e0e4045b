"""Bytes that a conversion does not change, moved from the source file to the output in the kernel.

A tensor whose output bytes are a run of its source file's bytes (no transpose, no cast, not
joined with others) is copied between the two files' offsets with copy_file_range(2), which never
brings the bytes into this process; where the system or the pair of file systems cannot
(EXDEV across some file systems, ENOSYS, a filter that forbids the call), with sendfile(2), and
failing that with large preads and pwrites through one buffer of ours.

The read stays bounded like every other read of a source (stable.py): a range that does not lie
within the size the file had when it was opened is refused before anything is copied, and a file
that ends before the range does (it shrank meanwhile) is the error "SRC changed", never a signal.
"""

from __future__ import annotations

import errno
import math
import os

from .. import dtypes
from .stable import StableFile, changed

METHODS = ("copy_file_range", "sendfile", "pread")  # tried in this order
PIECE = 1 << 30  # bytes asked of the kernel per call (Linux moves at most about 2 GiB per call)
BUFFER = 8 << 20  # the pread fallback's buffer
# errors that say a method cannot copy between these two files, not that the copy failed
_CANNOT = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM, errno.EBADF}


class _Cannot(Exception):
    """This method cannot copy between these files; `done` bytes were copied before it said so."""

    def __init__(self, done: int):
        super().__init__(done)
        self.done = done


def _in_pieces(step, src: StableFile, count: int, done: int) -> int:
    """`step(done, n)` (one kernel call copying at most n bytes from `done` on, returning how many it
    copied) until `count` bytes are done; a method the kernel refuses here is _Cannot."""
    while done < count:
        try:
            n = step(done, min(count - done, PIECE))
        except OSError as exc:
            if exc.errno in _CANNOT:
                raise _Cannot(done) from None
            raise
        if n == 0:  # nothing copied before the end of the range: the file shrank, or the method reads nothing here
            now = os.fstat(src.fd).st_size
            if now < src.size:
                raise changed(src.path, f"is {now} bytes now, {src.size} when it was opened")
            raise _Cannot(done)
        done += n
    return done


def _copy_file_range(src: StableFile, offset: int, count: int, dst_fd: int, dst_offset: int, done: int) -> int:
    return _in_pieces(lambda at, n: os.copy_file_range(src.fd, dst_fd, n, offset + at, dst_offset + at), src, count, done)


def _sendfile(src: StableFile, offset: int, count: int, dst_fd: int, dst_offset: int, done: int) -> int:
    os.lseek(dst_fd, dst_offset + done, os.SEEK_SET)  # sendfile writes at the output's file position
    return _in_pieces(lambda at, n: os.sendfile(dst_fd, src.fd, offset + at, n), src, count, done)


def _pread(src: StableFile, offset: int, count: int, dst_fd: int, dst_offset: int, done: int) -> int:
    buffer = memoryview(bytearray(min(BUFFER, count - done)))
    while done < count:
        size = min(len(buffer), count - done)
        src.read_into(buffer[:size], offset + done)  # bounded, and a shrunk file is "SRC changed"
        pwrite_all(dst_fd, [buffer[:size]], dst_offset + done)
        done += size
    return done


_COPIERS = {"copy_file_range": _copy_file_range, "sendfile": _sendfile, "pread": _pread}


def copy_range(src: StableFile, offset: int, count: int, dst_fd: int, dst_offset: int,
               methods: tuple[str, ...] = METHODS) -> None:
    """Copy `count` bytes of `src` from `offset` to the file `dst_fd` at `dst_offset`, with the
    first of `methods` that can (the last, "pread", always can)."""
    if offset < 0 or count < 0 or offset + count > src.size:
        raise changed(src.path, f"is read at bytes {offset}..{offset + count} of a {src.size}-byte file")
    done = 0
    for method in methods:
        try:
            done = _COPIERS[method](src, offset, count, dst_fd, dst_offset, done)
            return
        except _Cannot as cannot:
            done = cannot.done
    if done < count:
        raise OSError(errno.ENOTSUP, f"none of {', '.join(methods)} can copy from {src.path}")


def pwrite_all(fd: int, buffers, offset: int, piece: int = PIECE) -> int:
    """Write the buffers one after another at `offset` with as few pwritev calls as the kernel
    allows (each at most `piece` bytes); returns the bytes written."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    total = 0
    while views:
        batch, size = [], 0
        for view in views:
            if size >= piece or len(batch) >= 1024:
                break
            batch.append(view[:piece - size])
            size += len(batch[-1])
        n = os.pwritev(fd, batch, offset + total)
        if n <= 0:
            raise OSError(errno.EIO, "the output file took no bytes")
        total += n
        while n:
            if n >= len(views[0]):
                n -= len(views.pop(0))
            else:
                views[0], n = views[0][n:], 0
    return total


def c_ordered(shape, stride) -> bool:
    """Whether a view's strides (in elements) are those of its shape in C order (axes of size 1 aside)."""
    expected = 1
    for d, s in zip(reversed(tuple(shape)), reversed(tuple(stride))):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def source_bytes(entry, source):
    """(file, offset, nbytes) of the source bytes that are exactly the bytes `entry` (a plan's
    TargetEntry) writes, or None where the tensor must be computed: one part, no cast, no
    transpose, only a reshape or a slice of leading rows of a tensor that lies C-ordered in its
    file (Source.byte_range)."""
    if len(entry.parts) != 1 or entry.source_dtype != entry.dtype or entry.dtype == "bool":
        return None  # bools are read, so that a byte other than 0 and 1 is refused
    part = entry.parts[0]
    if part.perm is not None and tuple(part.perm) != tuple(range(len(part.perm))):
        return None
    found = source.byte_range(part.source)
    if found is None:
        return None
    file, offset, nbytes = found
    itemsize = dtypes.itemsize(entry.dtype)
    if part.piece is not None:
        shape = part.reshape if part.reshape is not None else source.infos[part.source].shape
        axis, start, stop = part.piece
        if any(d != 1 for d in shape[:axis]):
            return None
        row = math.prod(shape[axis + 1:]) * itemsize
        offset, nbytes = offset + start * row, (stop - start) * row
    if nbytes != math.prod(entry.shape) * itemsize:
        return None
    return file, offset, nbytes
