"""Dotted paths of modules, layers and state-dict names ("encoder.layer.0.attention"); the model
itself is the empty path "", which every path is under."""

from __future__ import annotations

from typing import Iterable

ROOT = ""


def is_under(path: str, parent: str) -> bool:
    """`path` is `parent` or inside it ("a.b" is under "a" and under "", not under "a.b.c" or "a.bc")."""
    return parent == ROOT or path == parent or path.startswith(parent + ".")


def is_inside(path: str, parent: str) -> bool:
    """`path` is under `parent` and is not `parent` itself."""
    return path != parent and is_under(path, parent)


def parent(path: str) -> str:
    """The path one level up ("a.b" -> "a", "a" -> ""); the root's parent is the root."""
    return path.rpartition(".")[0]


def name(path: str) -> str:
    """The last part of a path ("a.b" -> "b")."""
    return path.rpartition(".")[2]


def join(*parts: str) -> str:
    """The parts joined with dots, empty ones (the root) left out."""
    return ".".join(p for p in parts if p)


def relative(path: str, parent: str) -> str | None:
    """`path` as seen from `parent` ("a.b.c" from "a" -> "b.c"; `parent` itself -> ""), or None where
    it is not under it."""
    if not is_under(path, parent):
        return None
    return path if parent == ROOT else path[len(parent) + 1:]


def depth(path: str) -> int:
    """How many levels below the model: the root 0, "a" 1, "a.b" 2."""
    return 0 if path == ROOT else path.count(".") + 1


def common_parent(paths: Iterable[str]) -> str:
    """The deepest path every one of `paths` is under (the root where they share none)."""
    split = [p.split(".") if p else [] for p in paths]
    if not split:
        return ROOT
    shared = []
    for parts in zip(*split):
        if any(q != parts[0] for q in parts):
            break
        shared.append(parts[0])
    return ".".join(shared)


def prefixes(path: str) -> list[str]:
    """Every path `path` is under, from the root to `path` itself ("a.b" -> ["", "a", "a.b"])."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts) + 1)]
