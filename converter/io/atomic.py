"""Atomic output: every output appears complete or not at all, the outputs of one command appear
together or not at all, and nothing that was not meant to be replaced ever is.

On Linux a file's data goes to an anonymous O_TMPFILE inode in the destination's directory, so
even kill -9 leaves nothing behind; after fsync the inode is linked straight to the
destination's name (linkat fails if that name exists: no file is replaced without --force).
Replacing an existing file (--force) links the inode to a hidden name `.DST.<host>.<pid>.<random>.partial`
first and exchanges it with the destination (renameat2 RENAME_EXCHANGE), so that the replaced
file stays under the hidden name until every output of the command has its name, and is put
back if one cannot be given its. Where O_TMPFILE is missing the data is written under such a
hidden name from the start.

A directory (convert-weights' OUT_DIR) is written under a hidden name beside it and given its
name by renameat2: RENAME_NOREPLACE without --force (of several runs at once, exactly one
creates it), RENAME_EXCHANGE with --force (the replaced directory stays whole under the hidden
name until the new one is in place, then is removed). Where the file system lacks renameat2,
see `_exchange` and `_rename_noreplace` for the fallbacks and what they leave after a kill.

Every run removes the hidden files and directories that earlier runs on the same machine, no
longer alive, left for the same destination (temporaries.py). `check_outputs` (destinations.py)
checks every output of a command together, before anything is written: an output never names,
contains or replaces an input, and replaces nothing but a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Callable

from ..errors import UserError, quoted
from .destinations import check_directory_destination, check_file_destination, check_outputs, kind
from .sink import OutputFile  # written in few large writes, tensor data straight from its buffer or source file
from .temporaries import hidden_file, remove, remove_stale_temporaries, spare_name

__all__ = ["AtomicOutput", "OutputGroup", "StagedDirectory", "check_outputs", "remove_stale_temporaries",
           "write_texts"]

_AT_FDCWD, _RENAME_NOREPLACE, _RENAME_EXCHANGE = -100, 1, 2
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def _libc():
    import ctypes
    try:
        return ctypes, ctypes.CDLL(None, use_errno=True)
    except OSError:
        return ctypes, None


def _link_anonymous(fd: int, dst: str) -> int:
    """Give an O_TMPFILE inode a name: linkat through /proc (any user), or AT_EMPTY_PATH (root).
    0, or the errno (EEXIST when the name is taken)."""
    ctypes, libc = _libc()
    linkat = getattr(libc, "linkat", None)
    if linkat is None:
        return errno.ENOSYS
    at_symlink_follow, at_empty_path = 0x400, 0x1000
    if linkat(_AT_FDCWD, f"/proc/self/fd/{fd}".encode(), _AT_FDCWD, os.fsencode(dst), at_symlink_follow) == 0:
        return 0
    first = ctypes.get_errno()
    if first == errno.EEXIST:
        return first
    if linkat(fd, b"", _AT_FDCWD, os.fsencode(dst), at_empty_path) == 0:
        return 0
    return ctypes.get_errno() or first


def _renameat2(src: str, dst: str, flags: int) -> int:
    """renameat2(2): 0, or the errno (ENOSYS where the C library lacks it)."""
    ctypes, libc = _libc()
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return errno.ENOSYS
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def _exchange(a: str, b: str) -> bool:
    """Swap the names `a` and `b` atomically (both must exist); False where the file system
    cannot (the caller falls back to two renames)."""
    code = _renameat2(a, b, _RENAME_EXCHANGE)
    if code in _UNSUPPORTED:
        return False
    if code:
        raise OSError(code, os.strerror(code), a, None, b)
    return True


def _rename_noreplace(src: str, dst: str, claim_directory: bool) -> None:
    """Give `src` the name `dst` unless `dst` exists (FileExistsError), atomically. Where the file
    system lacks RENAME_NOREPLACE: a directory claims `dst` with mkdir (exactly one of several
    runs succeeds) and is renamed onto that empty directory, so a kill between the two leaves
    an empty `dst`; a file is hard-linked to `dst`, which fails if it exists."""
    code = _renameat2(src, dst, _RENAME_NOREPLACE)
    if code == 0:
        return
    if code not in _UNSUPPORTED:
        raise OSError(code, os.strerror(code), src, None, dst)
    if claim_directory:
        os.mkdir(dst)
        os.rename(src, dst)
    else:
        os.link(src, dst)
        os.unlink(src)


# ---- writing


def _copy_to_named(fd: int, path: str) -> str:
    """Last resort when the inode cannot be linked: copy it to a hidden name."""
    tmp_fd, name = hidden_file(path)
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
    ctypes, libc = _libc()
    fn = getattr(libc, "sync_file_range", None)
    if fn is None:
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
    """`with AtomicOutput(path, force) as f:` write to f; the commit happens on a clean exit.
    In an OutputGroup: open(), write to .file, and the group commits it with the others."""

    def __init__(self, path: str, force: bool = False):
        self.path = os.path.abspath(path)
        self.force = force
        self.directory = os.path.dirname(self.path)
        self._fd = None
        self._tmp_name = None  # a hidden name holding the new data, or after an exchange the replaced file
        self._committed = None  # how the name was given: "linked", "exchanged", "replaced" (the old one kept)
        self._kept = None  # the replaced file, where it could only be kept as a hard link
        self.file = None
        self._worker = None
        self._pending = []
        self._writeback_end = 0

    def open(self):
        check_file_destination("output", self.path, self.force)
        remove_stale_temporaries(self.path)
        tmpfile_flag = getattr(os, "O_TMPFILE", None)
        if tmpfile_flag is not None:
            try:
                self._fd = os.open(self.directory, tmpfile_flag | os.O_WRONLY, 0o644)
            except OSError:
                self._fd = None
        if self._fd is None:
            self._fd, self._tmp_name = hidden_file(self.path)
        self.file = OutputFile(self._fd)
        return self.file

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.sync()  # cheap when the background sync already ran
                self.commit()
        finally:
            self.discard()
        return False

    def sync(self) -> None:
        """Every byte written so far on disk (a full disk or an I/O error raises here, before any
        name is given); the commit's own sync is then cheap."""
        self.file.flush()
        pending, self._pending = self._pending, []
        for future in pending:  # every background call waited for; the first error among them raised
            future.result()
        os.fsync(self.file.fileno())

    def discard(self) -> None:
        """Close the file and remove what this output holds under hidden names: the data of an
        output never committed or taken back, or the file a commit replaced."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # never close the file under a running sync
            self._worker = None
        if self.file is not None:
            try:
                self.file.close()
            except OSError:  # a buffer that cannot be flushed (a full disk): its data is discarded anyway
                pass
        for name in (self._tmp_name, self._kept):
            if name and os.path.lexists(name):
                os.unlink(name)
        self._tmp_name = self._kept = None

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

    def readable_path(self) -> str:
        """A path that reads the data written so far, before the commit."""
        if self._tmp_name is not None:
            return self._tmp_name
        return f"/proc/self/fd/{self.file.fileno()}"

    def _appeared(self) -> UserError:
        return UserError(f"output {quoted(self.path)} appeared while this ran; pass --force to replace it")

    def commit(self) -> None:
        """Give the data its name. A file --force replaces is kept under a hidden name until
        discard() (undo() puts it back)."""
        if self._tmp_name is None:
            if not (self.force and os.path.lexists(self.path)):
                failed = _link_anonymous(self.file.fileno(), self.path)  # no name ever held partial data
                if failed == 0:
                    self._committed = "linked"
                    _fsync_dir(self.directory)
                    return
                if failed == errno.EEXIST and not self.force:
                    raise self._appeared()
            name = spare_name(self.path)
            if _link_anonymous(self.file.fileno(), name) == 0:
                self._tmp_name = name
            else:
                self._tmp_name = _copy_to_named(self.file.fileno(), self.path)
        if self.force and os.path.lexists(self.path):
            self._replace()
        else:
            self._link_no_clobber()
        _fsync_dir(self.directory)

    def _replace(self) -> None:
        check_file_destination("output", self.path, self.force)  # what is there now is still a regular file
        if _exchange(self._tmp_name, self.path):
            self._committed = "exchanged"  # the replaced file is now under the hidden name
            mode = os.lstat(self._tmp_name).st_mode
            if not stat.S_ISREG(mode):  # something else took the name since the check: put it back
                _exchange(self._tmp_name, self.path)
                self._committed = None
                raise UserError(f"output {quoted(self.path)} became {kind(mode)} while this ran; "
                                "an output replaces only a regular file: give another path")
            return
        kept = spare_name(self.path, ".old")
        try:
            os.link(self.path, kept)
            self._kept = kept
        except OSError:  # no hard links here: the replaced file cannot be put back (README.md says so)
            pass
        os.replace(self._tmp_name, self.path)
        self._tmp_name = None
        self._committed = "replaced"

    def _link_no_clobber(self) -> None:
        """Give the hidden file the destination's name unless that name exists (atomically
        where the file system has hard links)."""
        try:
            _rename_noreplace(self._tmp_name, self.path, claim_directory=False)
        except FileExistsError:
            raise self._appeared() from None
        except OSError:
            if os.path.lexists(self.path):
                raise self._appeared() from None
            os.replace(self._tmp_name, self.path)
        self._tmp_name = None
        self._committed = "linked"

    def undo(self) -> None:
        """Take a commit back: the replaced file gets its name again, or the new name is removed."""
        committed, self._committed = self._committed, None
        if committed == "exchanged":
            _exchange(self._tmp_name, self.path)
        elif committed == "replaced" and self._kept:
            os.replace(self._kept, self.path)
            self._kept = None
        elif committed == "linked":
            os.unlink(self.path)


class StagedDirectory:
    """A directory written under a hidden name beside `path` (`.staging`) and given `path` at
    commit. `replaceable(directory)` says why an existing directory may not be replaced (None:
    it may); it is asked again of what an exchange took out, which is put back if refused."""

    def __init__(self, path: str, force: bool, replaceable: Callable[[str], str | None]):
        self.path = os.path.abspath(path)
        self.force = force
        self.replaceable = replaceable
        self.staging = None
        self._committed = None  # "created", "exchanged" or "moved" (the old one under self._kept)
        self._kept = None

    def open(self) -> str:
        check_directory_destination("output", self.path, self.force)
        remove_stale_temporaries(self.path)
        self.staging = spare_name(self.path)  # named before it exists: an interrupt at any point is discarded
        os.mkdir(self.staging, 0o700)
        return self.staging

    def sync(self) -> None:
        _fsync_dir(self.staging)

    def commit(self) -> None:
        if os.path.lexists(self.path) and self.force:
            self._replace()
        else:
            try:
                _rename_noreplace(self.staging, self.path, claim_directory=True)
            except FileExistsError:
                raise UserError(f"output {quoted(self.path)} appeared while this ran (another run wrote it?); "
                                "pass --force to replace it") from None
            self._committed = "created"
        _fsync_dir(os.path.dirname(self.path))

    def _refuse(self, directory: str) -> None:
        why = self.replaceable(directory)
        if why:
            raise UserError(why)

    def _replace(self) -> None:
        check_directory_destination("output", self.path, self.force)
        self._refuse(self.path)
        if _exchange(self.staging, self.path):
            self._committed = "exchanged"  # the replaced directory is whole under the hidden name
            try:
                self._refuse(self.staging)
            except UserError:  # something else took the name since the check: put it back
                self.undo()
                raise
            return
        # No RENAME_EXCHANGE: the old directory moves aside to `.old`, and the new one takes its
        # name; a kill between the two renames leaves both, and the next run moves `.old` back.
        self._kept = spare_name(self.path, ".old")
        os.rename(self.path, self._kept)
        os.rename(self.staging, self.path)
        self._committed = "moved"

    def undo(self) -> None:
        committed, self._committed = self._committed, None
        if committed == "exchanged":
            _exchange(self.staging, self.path)
        elif committed == "created":
            os.rename(self.path, self.staging)
        elif committed == "moved":
            os.rename(self.path, self.staging)
            os.rename(self._kept, self.path)
            self._kept = None

    def discard(self) -> None:
        """Remove the hidden directory: the new one never committed (or taken back), or the old
        one a commit replaced."""
        for name in (self.staging, self._kept):
            if name and os.path.lexists(name):
                remove(name)


class OutputGroup:
    """Outputs committed together: each is written and synced under a hidden (or no) name, then
    all are given their names; if one cannot be, those already named are taken back (a file or
    directory --force replaced gets its name again), so that a failure leaves none of them and
    every replaced one as it was. What --force replaced is removed only once all are in place.

        with OutputGroup(force) as outputs:
            report = outputs.file(json_path)       # opened at once: a read-only disk fails here
            ...                                    # write them all
        # a clean exit commits all; an exception leaves none
    """

    def __init__(self, force: bool = False):
        self.force = force
        self.outputs = []

    def file(self, path: str) -> AtomicOutput:
        return self._opened(AtomicOutput(path, self.force))

    def directory(self, path: str, replaceable: Callable[[str], str | None]) -> StagedDirectory:
        return self._opened(StagedDirectory(path, self.force, replaceable))

    def _opened(self, output):
        self.outputs.append(output)  # before anything is made: an interrupt inside open() still discards it
        output.open()
        return output

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._commit()
        finally:
            for output in self.outputs:
                try:
                    output.discard()
                except OSError:
                    pass  # the others are still removed; the first error is the one to report
        return False

    def _commit(self) -> None:
        for output in self.outputs:
            output.sync()
        done = []
        try:
            for output in self.outputs:
                output.commit()
                done.append(output)
        except BaseException:
            for output in reversed(done):
                try:
                    output.undo()
                except OSError:
                    pass  # the first error is the one to report
            raise


def write_texts(texts: dict[str | None, str], force: bool) -> None:
    """Text files (path -> text; a None path is skipped) written as one OutputGroup: all or none."""
    with OutputGroup(force) as outputs:
        for path, text in texts.items():
            if path:
                outputs.file(path).file.write(text.encode("utf-8"))
