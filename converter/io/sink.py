"""The output file of a conversion, written at offsets counted here, in few large writes.

Python's buffered file would pass tensor data through its buffer and the caller would cut it in
pieces (a profile of BERT-large to .pdparams had the main thread in such writes, 64 KiB a call,
for 2.5 of its 3.7 s).
Here small writes (a pickle's opcodes, a header) gather in a buffer of ours and go out with the
next large one in a single pwritev; a large one goes straight from the caller's memory, WRITE_PIECE
bytes a call; `copy_from` moves a range of another file's bytes in the kernel (copyrange.py).
"""

from __future__ import annotations

import os

from .copyrange import copy_range, pwrite_all

GATHER = 1 << 20  # small writes gathered up to this many bytes
SMALL = 64 << 10  # a write up to this size is gathered; a larger one goes out at once
# bytes of tensor data per pwritev call. The kernel backs a larger write with larger page-cache
# folios, which cost more per byte on these virtual machines: BERT-large to .pdparams spent
# 0.90 to 1.12 s of system time in 1 MiB writes, 1.25 to 1.36 s in 64 KiB ones, 2.56 to 2.99 s
# in 16 MiB ones (docs/benchmarks.md)
WRITE_PIECE = 1 << 20


class OutputFile:
    """A binary file written from the start, sequentially: write, tell, flush, fileno and close as
    a file object has them, and copy_from. Bytes handed to write() may be gathered until the next
    large write, flush() or close()."""

    def __init__(self, fd: int):
        self.fd = fd
        self.position = 0  # where the next byte goes
        self._pending = bytearray()  # gathered bytes, ending at self.position
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n <= SMALL:
            self._pending += view
            if len(self._pending) >= GATHER:
                self.flush()
        else:
            start = self.position - len(self._pending)
            pwrite_all(self.fd, [self._pending, view], start, WRITE_PIECE)
            self._pending = bytearray()
        self.position += n
        return n

    def copy_from(self, src, offset: int, count: int) -> None:
        """Append `count` bytes of the StableFile `src` from `offset`, copied in the kernel."""
        self.flush()
        copy_range(src, offset, count, self.fd, self.position)
        self.position += count

    def flush(self) -> None:
        if self._pending:
            pwrite_all(self.fd, [self._pending], self.position - len(self._pending), WRITE_PIECE)
            self._pending = bytearray()

    def tell(self) -> int:
        return self.position

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        """Write what is gathered and close the file; it is closed even when that write fails."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            os.close(self.fd)
