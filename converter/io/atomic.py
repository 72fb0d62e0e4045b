"""Atomic output: the destination appears complete or not at all, and never replaces a file
that was not meant to be replaced.

On Linux the data goes to an anonymous O_TMPFILE inode in the destination's directory, so
even kill -9 leaves nothing behind; after fsync the inode is linked straight to the
destination's name (linkat fails if that name exists: no file is replaced without --force).
Replacing an existing file (--force) links the inode to a hidden name `.DST.<host>.<pid>.partial`
first and renames that over the destination: a kill between the two leaves the hidden file.
Where O_TMPFILE is missing the data is written under such a hidden name from the start. Every
run removes the hidden files that earlier runs on the same machine, no longer alive, left for
the same destination.

`check_outputs` checks every output of a command together, before anything is written.
"""

from __future__ import annotations

import errno
import os
import tempfile

from ..errors import UserError, quoted

BUFFER = 16 << 10  # the output file's buffer: small writes gather in it, tensor data (base.WRITE_PIECE) passes it by


def _link_anonymous(fd: int, dst: str) -> int:
    """Give an O_TMPFILE inode a name: linkat through /proc (any user), or AT_EMPTY_PATH (root).
    0, or the errno (EEXIST when the name is taken)."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        linkat = libc.linkat
    except (OSError, AttributeError):
        return errno.ENOSYS
    at_fdcwd, at_symlink_follow, at_empty_path = -100, 0x400, 0x1000
    if linkat(at_fdcwd, f"/proc/self/fd/{fd}".encode(), at_fdcwd, os.fsencode(dst), at_symlink_follow) == 0:
        return 0
    first = ctypes.get_errno()
    if first == errno.EEXIST:
        return first
    if linkat(fd, b"", at_fdcwd, os.fsencode(dst), at_empty_path) == 0:
        return 0
    return ctypes.get_errno() or first


def _hidden_prefix(path: str) -> str:
    """`.DST.<host>.`: the hidden temporaries of `path` made on this machine (on a file system
    that several machines share, a process id says nothing about another machine's runs)."""
    import re
    import socket
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
    return f".{os.path.basename(path)}.{host}."


def _hidden_name(path: str) -> str:
    """The hidden temporary name of this process for `path`: `.DST.<host>.<pid>.<random>.partial`."""
    return _hidden_prefix(path) + f"{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the hidden temporaries that runs no longer alive left for `path`; their names."""
    directory, prefix = os.path.dirname(path), _hidden_prefix(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".partial")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(outputs: dict[str, str | None], inputs: list[str | None], force: bool) -> None:
    """Every output (option name -> path; None: not asked for) is checked before anything is
    written: its directory exists, it is not a directory, it exists only with --force, it is
    none of the inputs, and no two outputs are the same file."""
    named = [(what, path) for what, path in outputs.items() if path]
    for what, path in named:
        AtomicOutput(path, force).check_destination(what)
        for source in inputs:
            if source and os.path.exists(source) and _same_file(path, source):
                raise UserError(f"{what} {quoted(path)} is also an input ({quoted(source)}); "
                                "write it to another path")
    for i, (what, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if _same_file(path, other_path):
                raise UserError(f"{what} and {other} are the same file {quoted(path)}; give each its own path")


def _copy_to_named(fd: int, path: str) -> str:
    """Last resort when the inode cannot be linked: copy it to a hidden name."""
    directory = os.path.dirname(path)
    tmp_fd, name = tempfile.mkstemp(prefix=_hidden_name(path), suffix=".partial", dir=directory)
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

    def check_destination(self, what: str = "output") -> None:
        if os.path.isdir(self.path):
            raise UserError(f"{what} {quoted(self.path)} is a directory; give a file name")
        if not os.path.isdir(self.directory):
            raise UserError(f"{what} directory {quoted(self.directory)} does not exist; create it first")
        if os.path.lexists(self.path) and not self.force:
            raise UserError(f"{what} {quoted(self.path)} already exists; pass --force to replace it")

    def __enter__(self):
        self.check_destination()
        remove_stale_temporaries(self.path)
        tmpfile_flag = getattr(os, "O_TMPFILE", None)
        if tmpfile_flag is not None:
            try:
                self._fd = os.open(self.directory, tmpfile_flag | os.O_WRONLY, 0o644)
            except OSError:
                self._fd = None
        if self._fd is None:
            self._fd, self._tmp_name = tempfile.mkstemp(prefix=_hidden_name(self.path), suffix=".partial",
                                                        dir=self.directory)
        self.file = os.fdopen(self._fd, "wb", buffering=BUFFER)
        return self.file

    def sync(self) -> None:
        """Every byte written so far on disk (a full disk or an I/O error raises here, before any
        name is given); the commit's own sync is then cheap."""
        self.file.flush()
        self._join_background()
        os.fsync(self.file.fileno())

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.sync()  # cheap when the background sync already ran
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

    def _appeared(self) -> UserError:
        return UserError(f"output {quoted(self.path)} appeared while this ran; pass --force to replace it")

    def _commit(self) -> None:
        if self._tmp_name is None:
            if not (self.force and os.path.lexists(self.path)):
                failed = _link_anonymous(self.file.fileno(), self.path)  # no name ever held partial data
                if failed == 0:
                    _fsync_dir(self.directory)
                    return
                if failed == errno.EEXIST and not self.force:
                    raise self._appeared()
            name = os.path.join(self.directory, _hidden_name(self.path) + "partial")
            if _link_anonymous(self.file.fileno(), name) == 0:
                self._tmp_name = name
            else:
                self._tmp_name = _copy_to_named(self.file.fileno(), self.path)
        if self.force:
            os.replace(self._tmp_name, self.path)
        else:
            self._link_no_clobber()
        self._tmp_name = None
        _fsync_dir(self.directory)

    def _link_no_clobber(self) -> None:
        """Give the hidden file the destination's name unless that name exists (atomically
        where the file system has hard links)."""
        try:
            os.link(self._tmp_name, self.path)
        except FileExistsError:
            raise self._appeared() from None
        except OSError:
            if os.path.lexists(self.path):
                raise self._appeared() from None
            os.replace(self._tmp_name, self.path)
            return
        os.unlink(self._tmp_name)
