"""What an output may be, checked for every output of a command together before anything is
written: its directory exists, it is nothing but a regular file (or, for a model directory, a real
directory), it exists only with --force, it is not an input, not inside an input directory and
contains no input (links resolved, a hard link counts as the same file), and no output is another
or inside another."""

from __future__ import annotations

import os
import stat

from ..errors import UserError, quoted


def kind(mode: int) -> str:
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


def _parent_exists(what: str, path: str) -> None:
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise UserError(f"{what} directory {quoted(parent)} does not exist; create it first")


def check_file_destination(what: str, path: str, force: bool) -> None:
    """A file output (an absolute path): its directory exists; it does not exist, or (with --force)
    is a regular file."""
    _parent_exists(what, path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserError(f"{what} {quoted(path)} cannot be examined ({exc.strerror}); give another path") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {quoted(path)} is a directory; give a file name")
    if stat.S_ISLNK(mode):
        raise UserError(f"{what} {quoted(path)} is a symbolic link (to {quoted(os.path.realpath(path))}); "
                        "an output replaces only a regular file: give the file itself or another path")
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {quoted(path)} is {kind(mode)}, not a regular file; an output replaces "
                        "only a regular file: give another path")
    if not force:
        raise UserError(f"{what} {quoted(path)} already exists; pass --force to replace it")


def check_directory_destination(what: str, path: str, force: bool) -> None:
    """A directory output: its parent exists; it does not exist, or (with --force) is a real
    directory (not a link to one). Whether the directory may be replaced is the caller's to say."""
    path = os.path.abspath(path)
    _parent_exists(what, path)
    if os.path.islink(path):
        raise UserError(f"{what} {quoted(path)} is a symbolic link (to {quoted(os.path.realpath(path))}); "
                        "give a new path or the directory itself")
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise UserError(f"{what} {quoted(path)} is {kind(os.lstat(path).st_mode)}; a model directory converts "
                        "into a directory: give a new path")
    if not force:
        raise UserError(f"{what} {quoted(path)} already exists; pass --force to replace it")


def check_outputs(outputs: dict[str, str | None], inputs: list[str | None], force: bool,
                  directories: dict[str, str | None] | None = None) -> None:
    """Every output (option name -> path; None: not asked for; `directories`: the model directories)
    checked before anything is written, as this module says."""
    files = [(what, path) for what, path in outputs.items() if path]
    trees = [(what, path) for what, path in (directories or {}).items() if path]
    for what, path in files:
        check_file_destination(what, os.path.abspath(path), force)
    for what, path in trees:
        check_directory_destination(what, path, force)
    sources = [source for source in inputs if source and os.path.exists(source)]
    for what, path in files + trees:
        for source in sources:  # an output is not an input, does not lie inside one, nor contain one
            if _same_file(path, source):
                raise UserError(f"{what} {quoted(path)} is also an input ({quoted(source)}); write it to another path")
            if _within(path, source):
                raise UserError(f"{what} {quoted(path)} is inside the input directory {quoted(source)}; "
                                "write it outside the inputs")
            if _within(source, path):
                raise UserError(f"{what} {quoted(path)} contains the input {quoted(source)}; write it to another path")
    for what, path in trees:  # an existing directory output holds no hard link to an input file
        for name in os.listdir(path) if os.path.isdir(path) else ():
            for source in sources:
                if not os.path.isdir(source) and _same_file(os.path.join(path, name), source):
                    raise UserError(f"{what} {quoted(path)} holds {quoted(name)}, a hard link to the input "
                                    f"{quoted(source)}; write to another path")
    named = files + trees
    for i, (what, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if _same_file(path, other_path):
                raise UserError(f"{what} and {other} are the same file {quoted(path)}; give each its own path")
            for (a, a_path), (b, b_path) in (((what, path), (other, other_path)), ((other, other_path), (what, path))):
                if _within(a_path, b_path):
                    raise UserError(f"{a} {quoted(a_path)} is inside {b} {quoted(b_path)}, which this run writes; "
                                    "write it elsewhere")
