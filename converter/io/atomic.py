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
longer alive, left for the same destination. Hidden names are at most about 160 bytes, whatever
the destination's (a long name is cut and a hash of it added).

`check_outputs` checks every output of a command together, before anything is written: an output
never names, contains or replaces an input, and replaces nothing but a regular file.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from typing import Callable

from ..errors import UserError, quoted
from .sink import OutputFile  # written in few large writes, tensor data straight from its buffer or source file

_LONGEST_KEPT_NAME = 100  # bytes of the destination's name a hidden name keeps whole
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


def _raise(code: int, src: str, dst: str):
    raise OSError(code, os.strerror(code), src, None, dst)


def _exchange(a: str, b: str) -> bool:
    """Swap the names `a` and `b` atomically (both must exist); False where the file system
    cannot (the caller falls back to two renames)."""
    code = _renameat2(a, b, _RENAME_EXCHANGE)
    if code in _UNSUPPORTED:
        return False
    if code:
        _raise(code, a, b)
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
        _raise(code, src, dst)
    if claim_directory:
        os.mkdir(dst)
        os.rename(src, dst)
    else:
        os.link(src, dst)
        os.unlink(src)


def _hidden_prefix(path: str) -> str:
    """`.DST.<host>.`: the hidden temporaries of `path` made on this machine (on a file system
    that several machines share, a process id says nothing about another machine's runs). A
    name over _LONGEST_KEPT_NAME bytes is cut and a hash of the whole added, so that the hidden
    name stays within NAME_MAX."""
    import hashlib
    import re
    import socket
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    raw = os.fsencode(os.path.basename(path))
    if len(raw) > _LONGEST_KEPT_NAME:
        raw = raw[:40] + b"~" + hashlib.sha256(raw).hexdigest()[:16].encode()
    return f".{os.fsdecode(raw)}.{host}."


def _hidden_name(path: str) -> str:
    """The start of this process's hidden names for `path`: `.DST.<host>.<pid>.`; a random part
    and `.partial` (or `.old`, a directory moved aside where renameat2 is missing) follow."""
    return _hidden_prefix(path) + f"{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _remove(path: str) -> None:
    """Remove a file, a link or (not through links) a directory tree; what cannot be removed stays."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the hidden temporaries (files and directories) that runs no longer alive left for
    `path`; their names. A destination moved aside (`.old`) by a run killed before the new one
    took its place is moved back when the destination is missing."""
    directory, prefix = os.path.dirname(path), _hidden_prefix(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in sorted(names, key=lambda n: not n.endswith(".old")):  # restore before removing the rest
        if not (name.startswith(prefix) and name.endswith((".partial", ".old"))):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        full = os.path.join(directory, name)
        if name.endswith(".old") and not os.path.lexists(path):
            try:
                os.rename(full, path)
                continue
            except OSError:
                pass
        _remove(full)
        removed.append(name)
    return removed


# ---- what an output may be


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _within(path: str, directory: str) -> bool:
    """Whether `path`, links resolved, is `directory` or lies anywhere under it (compared by
    device and inode, so that another path to the same directory counts)."""
    try:
        top = os.stat(directory)
    except OSError:
        return False
    if not stat.S_ISDIR(top.st_mode):
        return False
    here = os.path.realpath(path)
    while True:
        try:
            if os.path.samestat(os.stat(here), top):
                return True
        except OSError:
            pass
        parent = os.path.dirname(here)
        if parent == here:
            return False
        here = parent


def _apart(what: str, path: str, source: str) -> None:
    """`path` (an output) may not be the input `source`, lie inside it, or contain it."""
    if _same_file(path, source):
        raise UserError(f"{what} {quoted(path)} is also an input ({quoted(source)}); write it to another path")
    if _within(path, source):
        raise UserError(f"{what} {quoted(path)} is inside the input directory {quoted(source)}; "
                        "write it outside the inputs")
    if _within(source, path):
        raise UserError(f"{what} {quoted(path)} contains the input {quoted(source)}; write it to another path")


def check_directory_destination(what: str, path: str, force: bool) -> None:
    """A directory output: its parent exists; it does not exist, or (with --force) is a real
    directory (not a link to one). Whether the directory may be replaced is the caller's to say."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise UserError(f"{what} directory {quoted(parent)} does not exist; create it first")
    if os.path.islink(path):
        raise UserError(f"{what} {quoted(path)} is a symbolic link (to {quoted(os.path.realpath(path))}); "
                        "give a new path or the directory itself")
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise UserError(f"{what} {quoted(path)} is {_kind(os.lstat(path).st_mode)}; a model directory converts "
                        "into a directory: give a new path")
    if not force:
        raise UserError(f"{what} {quoted(path)} already exists; pass --force to replace it")


def check_outputs(outputs: dict[str, str | None], inputs: list[str | None], force: bool,
                  directories: dict[str, str | None] | None = None) -> None:
    """Every output (option name -> path; None: not asked for) is checked before anything is
    written: its directory exists, it is nothing but a regular file (or, in `directories`, a
    directory), it exists only with --force, it is not an input, not inside an input directory
    and contains no input (links resolved, a hard link counts as the same file), and no output is
    another or inside another."""
    files = [(what, path) for what, path in outputs.items() if path]
    trees = [(what, path) for what, path in (directories or {}).items() if path]
    for what, path in files:
        AtomicOutput(path, force).check_destination(what)
    for what, path in trees:
        check_directory_destination(what, path, force)
    sources = [source for source in inputs if source and os.path.exists(source)]
    for what, path in files + trees:
        for source in sources:
            _apart(what, path, source)
    for what, path in trees:
        _holds_no_input(what, path, sources)
    named = files + trees
    for i, (what, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if _same_file(path, other_path):
                raise UserError(f"{what} and {other} are the same file {quoted(path)}; give each its own path")
            for (a, a_path), (b, b_path) in (((what, path), (other, other_path)), ((other, other_path), (what, path))):
                if _within(a_path, b_path):
                    raise UserError(f"{a} {quoted(a_path)} is inside {b} {quoted(b_path)}, which this run writes; "
                                    "write it elsewhere")


def _holds_no_input(what: str, path: str, sources: list[str]) -> None:
    """An existing directory output holds no hard link to an input file."""
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        for source in sources:
            if not os.path.isdir(source) and _same_file(os.path.join(path, name), source):
                raise UserError(f"{what} {quoted(path)} holds {quoted(name)}, a hard link to the input "
                                f"{quoted(source)}; write to another path")


# ---- writing


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


def _spare_name(path: str, suffix: str = ".partial") -> str:
    """A hidden name beside `path` that nothing has (the caller creates it at once)."""
    import secrets
    return os.path.join(os.path.dirname(path), f"{_hidden_name(path)}{secrets.token_hex(4)}{suffix}")


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

    def check_destination(self, what: str = "output") -> None:
        if not os.path.isdir(self.directory):
            raise UserError(f"{what} directory {quoted(self.directory)} does not exist; create it first")
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UserError(f"{what} {quoted(self.path)} cannot be examined ({exc.strerror}); "
                            "give another path") from None
        if stat.S_ISDIR(mode):
            raise UserError(f"{what} {quoted(self.path)} is a directory; give a file name")
        if stat.S_ISLNK(mode):
            raise UserError(f"{what} {quoted(self.path)} is a symbolic link (to {quoted(os.path.realpath(self.path))}); "
                            "an output replaces only a regular file: give the file itself or another path")
        if not stat.S_ISREG(mode):
            raise UserError(f"{what} {quoted(self.path)} is {_kind(mode)}, not a regular file; an output replaces "
                            "only a regular file: give another path")
        if not self.force:
            raise UserError(f"{what} {quoted(self.path)} already exists; pass --force to replace it")

    def open(self):
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
        self._join_background()
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
            name = _spare_name(self.path)
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
        self.check_destination()  # what is there now is still a regular file
        if _exchange(self._tmp_name, self.path):
            self._committed = "exchanged"  # the replaced file is now under the hidden name
            mode = os.lstat(self._tmp_name).st_mode
            if not stat.S_ISREG(mode):  # something else took the name since the check: put it back
                _exchange(self._tmp_name, self.path)
                self._committed = None
                raise UserError(f"output {quoted(self.path)} became {_kind(mode)} while this ran; "
                                "an output replaces only a regular file: give another path")
            return
        kept = _spare_name(self.path, ".old")
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
        self.staging = _spare_name(self.path)  # named before it exists: an interrupt at any point is discarded
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
        self._kept = _spare_name(self.path, ".old")
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
                _remove(name)


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
        output = AtomicOutput(path, self.force)
        self.outputs.append(output)  # before anything is made: an interrupt inside open() still discards it
        output.open()
        return output

    def directory(self, path: str, replaceable: Callable[[str], str | None]) -> StagedDirectory:
        output = StagedDirectory(path, self.force, replaceable)
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
