"""Atomic output: the destination appears complete or not at all.

On Linux the data goes to an anonymous O_TMPFILE inode in the destination's
directory, so even kill -9 leaves nothing behind; the inode gets a name only
after fsync. Elsewhere a hidden temporary name is used and removed on failure.
"""

from __future__ import annotations

import os
import tempfile

from ..errors import UserError


def _link_anonymous(fd: int, dst: str) -> bool:
    """Give an O_TMPFILE inode a name: linkat through /proc (any user), or AT_EMPTY_PATH (root)."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        linkat = libc.linkat
    except (OSError, AttributeError):
        return False
    at_fdcwd, at_symlink_follow, at_empty_path = -100, 0x400, 0x1000
    if linkat(at_fdcwd, f"/proc/self/fd/{fd}".encode(), at_fdcwd, dst.encode(), at_symlink_follow) == 0:
        return True
    return linkat(fd, b"", at_fdcwd, dst.encode(), at_empty_path) == 0


def _copy_to_named(fd: int, directory: str, base: str) -> str:
    """Last resort when the inode cannot be linked: copy it to a hidden name."""
    tmp_fd, name = tempfile.mkstemp(prefix="." + base + ".", suffix=".partial", dir=directory)
    try:
        with open(f"/proc/self/fd/{fd}", "rb") as src, os.fdopen(tmp_fd, "wb") as dst:
            while chunk := src.read(1 << 24):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return name


def _sync_range(fd: int, offset: int, length: int) -> None:
    """Start writeback of a byte range without waiting for it (Linux); elsewhere nothing."""
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicOutput:
    """`with AtomicOutput(path, force) as f:` write to f; commit happens on clean exit."""

    def __init__(self, path: str, force: bool = False):
        self.path = os.path.abspath(path)
        self.force = force
        self.directory = os.path.dirname(self.path)
        self._fd = None
        self._tmp_name = None
        self.file = None
        self._worker = None
        self._pending = []
        self._writeback_end = 0

    def check_destination(self) -> None:
        if os.path.isdir(self.path):
            raise UserError(f"output '{self.path}' is a directory; give a file name ending in .pdparams or .safetensors")
        if not os.path.isdir(self.directory):
            raise UserError(f"output directory '{self.directory}' does not exist; create it first")
        if os.path.exists(self.path) and not self.force:
            raise UserError(f"output '{self.path}' already exists; pass --force to replace it")

    def __enter__(self):
        self.check_destination()
        tmpfile_flag = getattr(os, "O_TMPFILE", None)
        if tmpfile_flag is not None:
            try:
                self._fd = os.open(self.directory, tmpfile_flag | os.O_WRONLY, 0o644)
            except OSError:
                self._fd = None
        if self._fd is None:
            self._fd, self._tmp_name = tempfile.mkstemp(
                prefix="." + os.path.basename(self.path) + ".", suffix=".partial", dir=self.directory)
        self.file = os.fdopen(self._fd, "wb", buffering=1 << 20)
        return self.file

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.file.flush()
                self._join_background()
                os.fsync(self.file.fileno())  # cheap when the background sync already ran
                self._commit()
        finally:
            if self._worker is not None:
                self._worker.shutdown(wait=True)  # never close the file under a running sync
            self.file.close()
            if self._tmp_name and os.path.exists(self._tmp_name):
                os.unlink(self._tmp_name)
        return False

    def start_writeback(self) -> None:
        """Ask the kernel to start writing what was written since the last call, on a worker
        thread (the call blocks while the disk queue is full), so that neither the writer
        waits nor the final fsync has much left (Linux sync_file_range; elsewhere a no-op)."""
        self.file.flush()
        end = self.file.tell()
        start, self._writeback_end = self._writeback_end, end
        if end > start:
            self._background(_sync_range, self.file.fileno(), start, end - start)

    def sync_in_background(self) -> None:
        """fsync on the worker thread, so that it overlaps with checking; the commit waits for it."""
        self.file.flush()
        self._background(os.fsync, self.file.fileno())

    def _background(self, func, *args) -> None:
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor
            self._worker = ThreadPoolExecutor(max_workers=1)
        self._pending.append(self._worker.submit(func, *args))

    def _join_background(self) -> None:
        """Wait for every background call; the first error among them is raised."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def readable_path(self) -> str:
        """A path that reads the data written so far, before the commit."""
        if self._tmp_name is not None:
            return self._tmp_name
        return f"/proc/self/fd/{self.file.fileno()}"

    def _commit(self) -> None:
        if self._tmp_name is None:
            # Give the anonymous inode a hidden name, then move it over the destination.
            name = os.path.join(self.directory, f".{os.path.basename(self.path)}.{os.getpid()}.partial")
            if _link_anonymous(self.file.fileno(), name):
                self._tmp_name = name
            else:
                self._tmp_name = _copy_to_named(self.file.fileno(), self.directory, os.path.basename(self.path))
        if os.path.exists(self.path) and not self.force:
            raise UserError(f"output '{self.path}' appeared while converting; pass --force to replace it")
        os.replace(self._tmp_name, self.path)
        self._tmp_name = None
        _fsync_dir(self.directory)
