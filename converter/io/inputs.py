"""Small input files (rule files, checkpoint indexes, config.json): regular files of bounded size.

A path given by the user or named by a downloaded file may be a fifo (opening it for reading
would wait for a writer forever), a device such as /dev/zero (endless), or a sparse file of
gigabytes. `read_small_file` opens without blocking, refuses anything but a regular file after
it is open (fstat: no race between the check and the read), and reads at most `cap` bytes.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import UserError, quoted

RULE_FILE_CAP = 16 << 20  # the shipped rule files hold a few KiB
INDEX_CAP = 64 << 20  # a sharded checkpoint's index: about 100 bytes per key
CONFIG_CAP = 16 << 20  # an HF config.json holds a few KiB

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a fifo (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_small_file(path: str, what: str, cap: int) -> bytes:
    """The bytes of `path`, a regular file of at most `cap` bytes; otherwise one UserError that
    names `what` the file is (e.g. "mapping file"), the path, and what is wrong."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UserError(f"{what} {quoted(path)} does not exist; check the path") from None
    except OSError as exc:
        reason = "permission denied" if exc.errno == errno.EACCES else (exc.strerror or str(exc))
        raise UserError(f"cannot open {what} {quoted(path)}: {reason}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{what} {quoted(path)} is {kind_of(info.st_mode)}, not a regular file; give a file")
        if info.st_size > cap:
            raise UserError(f"{what} {quoted(path)} is {_size(info.st_size)}, larger than any {what} should be "
                            f"(at most {_size(cap)} are read); check that it is the right file")
        chunks, total = [], 0
        while total <= cap:
            try:
                chunk = os.read(fd, min(cap + 1 - total, 1 << 20))
            except OSError as exc:
                raise UserError(f"cannot read {what} {quoted(path)}: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            raise UserError(f"{what} {quoted(path)} grew past {_size(cap)} while it was read; "
                            "check that it is the right file")
        return b"".join(chunks)
    finally:
        os.close(fd)
