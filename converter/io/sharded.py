"""Sharded checkpoints: `*.index.json` with a `weight_map` from key to shard file."""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import UserError
from .base import Source


class ShardedSource(Source):
    def __init__(self, index_path: str, open_file):
        super().__init__(index_path)
        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise UserError(f"'{index_path}' is not a checkpoint index: it needs a JSON object with a 'weight_map'") from None
        base = os.path.dirname(os.path.abspath(index_path))
        shards: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            shards.setdefault(shard, []).append(key)
        missing = sorted(s for s in shards if not os.path.isfile(os.path.join(base, s)))
        if missing:
            raise UserError(f"'{index_path}' names shard(s) that do not exist: {', '.join(missing)}; "
                            "download every shard next to the index")
        self._shards: list[Source] = []
        self._owner: dict[str, Source] = {}
        try:
            for shard in sorted(shards):
                source = open_file(os.path.join(base, shard))
                self._shards.append(source)
                absent = sorted(set(shards[shard]) - set(source.infos))
                if absent:
                    raise UserError(f"shard '{shard}' lacks key(s) its index maps to it: {', '.join(absent[:8])}; "
                                    "the shard and its index do not belong together")
                self.notes.extend(f"{shard}: {n}" for n in source.notes)
                for name, info in source.infos.items():
                    if name in self.infos:
                        raise UserError(f"key '{name}' is in more than one shard; the checkpoint is inconsistent")
                    self.infos[name] = info
                    self._owner[name] = source
        except Exception:
            self.close()
            raise

    def read(self, name: str) -> np.ndarray:
        return self._owner[name].read(name)

    def release(self, name: str) -> None:
        self._owner[name].release(name)

    def close(self) -> None:
        for s in self._shards:
            s.close()
        self._shards = []
