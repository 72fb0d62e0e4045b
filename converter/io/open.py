"""Pick a reader by file name, and a writer by output extension."""

from __future__ import annotations

import glob
import os
import stat

from ..errors import UserError, is_text, quoted
from .base import Source, strip_wrapper_prefixes
from .inputs import kind_of

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
OUTPUT_FORMATS = {".pdparams": "pdparams", ".safetensors": "safetensors"}


def _open_file(path: str, allow_outside_shards: bool = False) -> Source:
    if not os.path.exists(path):
        raise UserError(f"checkpoint '{path}' does not exist; check the path")
    if os.path.isdir(path):
        raise UserError(f"'{path}' is a directory with no checkpoint index or weights file in it")
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise UserError(f"checkpoint {quoted(path)} is {kind_of(mode)}, not a regular file; give a weights file")
    if os.path.getsize(path) == 0:
        raise UserError(f"checkpoint '{path}' is empty (0 bytes); re-download or re-save it")
    lower = path.lower()
    if lower.endswith(".index.json"):
        from .sharded import ShardedSource
        return ShardedSource(path, _open_file, allow_outside_shards)
    if lower.endswith(".safetensors"):
        from .safetensors_io import SafetensorsSource
        return SafetensorsSource(path)
    if lower.endswith(TORCH_SUFFIXES):
        from .torch_io import TorchSource, not_a_checkpoint, unwrap_state
        from .torch_zip import NotPlain, TorchZipSource
        with open(path, "rb") as f:
            why = not_a_checkpoint(path, f.read(512))
        if why:
            raise UserError(why)
        try:  # the plain zip state dict, read without importing torch
            return TorchZipSource(path, unwrap_state)
        except NotPlain:  # anything else: torch.load(weights_only=True) decides
            return TorchSource(path)
    if lower.endswith(".pdparams"):
        from .pdparams import PdparamsSource
        return PdparamsSource(path)
    raise UserError(f"cannot tell the format of '{path}'; use a .pt/.pth/.bin, .safetensors or *.index.json file")


def open_source(path: str, allow_outside_shards: bool = False) -> Source:
    """Open a checkpoint file, an index, or a directory holding one. Shards an index names
    outside its directory are refused unless `allow_outside_shards`."""
    if os.path.isdir(path):
        for pattern in ("model.safetensors.index.json", "*.safetensors.index.json", "model.safetensors",
                        "pytorch_model.bin.index.json", "*.bin.index.json", "pytorch_model.bin"):
            found = sorted(glob.glob(os.path.join(glob.escape(path), pattern)))  # a name may hold [ or *
            if found:
                path = found[0]
                break
    source = _open_file(path, allow_outside_shards)
    bad = next((name for name in source.infos if not is_text(name)), None)
    if bad is not None:
        source.close()
        raise UserError(f"{quoted(path)} has a key that is not valid Unicode text ({quoted(bad)}: a lone "
                        "surrogate); the file is corrupt: re-save it")
    return strip_wrapper_prefixes(source)


def open_sink_format(path: str) -> str:
    for suffix, fmt in OUTPUT_FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    raise UserError(f"cannot tell the output format of '{path}'; end its name in .pdparams or .safetensors")
