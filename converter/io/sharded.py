"""Sharded checkpoints: `*.index.json` with a `weight_map` from key to shard file.

Shard names come from the index, a file downloaded with the checkpoint: each must be a
weights file (never another index) that lies, after its links are resolved, inside the
index's directory, unless the caller allows shards elsewhere. The index's directory is taken
both as found and with its links resolved, so that a cache laid out as links into a blob
store (the Hugging Face hub's snapshots/ and blobs/) is inside.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import UserError, quoted
from .base import Source
from .inputs import INDEX_CAP, read_small_file

SHARD_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def _read_index(index_path: str) -> dict[str, str]:
    raw = read_small_file(index_path, "checkpoint index", INDEX_CAP)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        index = None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise UserError(f"{quoted(index_path)} is not a checkpoint index: it needs a JSON object with a "
                        "'weight_map' object from key to shard file")
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "\x00" in shard:
            raise UserError(f"{quoted(index_path)} maps {quoted(key)} to {json.dumps(shard)[:60]}, not a shard "
                            "file name; fix or re-download the index")
    return weight_map


def shard_path(index_path: str, shard: str, allow_outside: bool) -> str:
    """Where the shard named `shard` by the index lies; a UserError when it is not a weights
    file, or lies outside the index's directory and that is not allowed."""
    if shard.lower().endswith(".index.json") or not shard.lower().endswith(SHARD_SUFFIXES):
        raise UserError(f"{quoted(index_path)} names {quoted(shard)} as a shard; a shard must be a weights file "
                        f"({', '.join(SHARD_SUFFIXES)}), not an index; fix or re-download the index")
    base = os.path.dirname(os.path.abspath(index_path))
    path = os.path.join(base, shard)
    if not allow_outside:
        real = os.path.realpath(path)
        homes = {os.path.realpath(base), os.path.dirname(os.path.realpath(index_path))}
        if not any(os.path.commonpath([real, home]) == home for home in homes):
            raise UserError(f"{quoted(index_path)} names shard {quoted(shard)}, which lies outside the index's "
                            f"directory (at {quoted(real)}); move the shards next to the index, or pass "
                            "--allow-outside-shards if you trust this index")
    return path


class ShardedSource(Source):
    def __init__(self, index_path: str, open_file, allow_outside: bool = False):
        super().__init__(index_path)
        weight_map = _read_index(index_path)
        shards: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            shards.setdefault(shard, []).append(key)
        paths = {shard: shard_path(index_path, shard, allow_outside) for shard in shards}
        missing = sorted(s for s, p in paths.items() if not os.path.exists(p))  # the rest: see open._open_file
        if missing:
            raise UserError(f"{quoted(index_path)} names shard(s) that do not exist: "
                            f"{', '.join(quoted(s) for s in missing[:8])}; download every shard next to the index")
        self.files = [os.path.abspath(index_path)] + [os.path.abspath(paths[s]) for s in sorted(shards)]
        self._shards: list[Source] = []
        self._owner: dict[str, Source] = {}
        try:
            for shard in sorted(shards):
                source = open_file(paths[shard])
                self._shards.append(source)
                absent = sorted(set(shards[shard]) - set(source.infos))
                if absent:
                    raise UserError(f"shard {quoted(shard)} lacks key(s) its index maps to it: "
                                    f"{', '.join(quoted(k) for k in absent[:8])}; "
                                    "the shard and its index do not belong together")
                self.notes.extend(f"{shard}: {n}" for n in source.notes)
                for name, info in source.infos.items():
                    if name in self.infos:
                        raise UserError(f"key {quoted(name)} is in more than one shard; the checkpoint is inconsistent")
                    self.infos[name] = info
                    self._owner[name] = source
        except Exception:
            self.close()
            raise

    def read(self, name: str) -> np.ndarray:
        return self._owner[name].read(name)

    def reference(self, name: str) -> np.ndarray:
        return self._owner[name].reference(name)

    def byte_range(self, name: str):
        return self._owner[name].byte_range(name)

    def release(self, name: str) -> None:
        self._owner[name].release(name)

    def check_unchanged(self) -> None:
        for s in self._shards:
            s.check_unchanged()

    def close(self) -> None:
        for s in self._shards:
            s.close()
        self._shards = []
