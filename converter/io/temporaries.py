"""The hidden names an output is written under beside its destination, `.DST.<host>.<pid>.<random>`
and `.partial` (or `.old`, a destination moved aside), at most about 160 bytes whatever the
destination's (a long name is cut and a hash of it added); and the removal of those that runs on
this machine, no longer alive, left for the same destination."""

from __future__ import annotations

import os
import shutil
import tempfile

_LONGEST_KEPT_NAME = 100  # bytes of the destination's name a hidden name keeps whole


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


def hidden_file(path: str) -> tuple[int, str]:
    """(fd, name): a new file under a hidden name beside `path`, open for writing."""
    return tempfile.mkstemp(prefix=_hidden_name(path), suffix=".partial", dir=os.path.dirname(path))


def spare_name(path: str, suffix: str = ".partial") -> str:
    """A hidden name beside `path` that nothing has (the caller creates it at once)."""
    import secrets
    return os.path.join(os.path.dirname(path), f"{_hidden_name(path)}{secrets.token_hex(4)}{suffix}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove(path: str) -> None:
    """Remove a file, a link or (not through links) a directory tree; what cannot be removed stays."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def remove_stale_temporaries(path: str) -> None:
    """Remove the hidden temporaries (files and directories) that runs no longer alive left for
    `path`. A destination moved aside (`.old`) by a run killed before the new one
    took its place is moved back when the destination is missing."""
    directory, prefix = os.path.dirname(path), _hidden_prefix(path)
    try:
        names = os.listdir(directory)
    except OSError:
        return
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
        remove(full)
