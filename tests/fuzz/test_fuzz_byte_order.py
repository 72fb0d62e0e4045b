"""Property test of every reader over byte orders, dtypes and shapes: a state dict of tensors of
any dtype, of 0 to 3 dimensions (empty ones too), as views (transposed, offset, expanded),
written by torch.save (the zip format, stored or deflated, and the format before zip files),
as safetensors or as a .pdparams pickle, little- or big-endian where the format has an order.
What each reader gives (`read`, and `reference`, the self-check's second decoding) must be bit
for bit what an independent decoder makes of the same file: torch.load, the safetensors library,
Python's own unpickler; or, for a format that has no big-endian form, one line refusing it.

A fixed, derandomized budget of examples (FUZZ_SCALE=20 runs twenty times as many, random)."""

import os
import pickle
import tempfile
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from helpers.hostile_forge import big_endian_copy, fuzz_settings

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
FORMATS = ["zip", "zip deflated", "zip read by torch.load", "legacy", "safetensors", "pdparams"]


def _bits(t) -> np.ndarray:
    """A tensor's (or array's) elements as C-ordered raw bits: bf16 as uint16, floats as integers, so
    that NaN payloads and signed zeros compare exactly."""
    if isinstance(t, torch.Tensor):
        t = t.detach().contiguous()
        t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        t = t.numpy()
    a = np.ascontiguousarray(t)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fc" else a


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    raw = draw(st.binary(min_size=64 * 8, max_size=64 * 8))
    n = max(int(np.prod(shape)), 1) * 4
    if dtype == torch.bool:
        base = torch.tensor(list(raw[:n])) % 2 == 1
    else:
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty(0, dtype=dtype).element_size()]
        need = n * torch.empty(0, dtype=dtype).element_size()
        data = (raw * (need // len(raw) + 1))[:need]
        base = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(bits).view(dtype)
    view = draw(st.sampled_from(["contiguous", "transposed", "offset", "expanded"]))
    size = int(np.prod(shape))
    if view == "transposed" and len(shape) >= 2:
        t = base[:size].reshape(shape[::-1]).transpose(0, -1) if len(shape) == 2 else base[:size].reshape(shape).permute(2, 1, 0)
    elif view == "offset":
        t = base[3:3 + size].reshape(shape)
    elif view == "expanded" and shape:
        t = base[:shape[-1]].expand(*shape)
    else:
        t = base[:size].reshape(shape)
    return t


@st.composite
def checkpoints(draw):
    fmt = draw(st.sampled_from(FORMATS))
    order = draw(st.sampled_from(["little", "big"]))
    names = draw(st.lists(st.sampled_from(["w", "b", "layer.0.weight", "h"]), min_size=1, max_size=3, unique=True))
    return fmt, order, {name: draw(tensors()) for name in names}


def _write(fmt: str, order: str, state: dict, d: str) -> tuple[str, object]:
    """The checkpoint written in `fmt`, and what an independent decoder makes of it."""
    path = os.path.join(d, "m.safetensors" if fmt == "safetensors" else "m.pdparams" if fmt == "pdparams" else "m.pt")
    if fmt == "safetensors":
        from safetensors.torch import load_file, save_file
        save_file({k: v.clone() for k, v in state.items()}, path)
        return path, load_file(path)
    if fmt == "pdparams":
        arrays = {k: _bits(v).view(_numpy_dtype(v.dtype)) if v.dtype != torch.bfloat16 else _bits(v)
                  for k, v in state.items()}
        if order == "big":
            arrays = {k: a.astype(a.dtype.newbyteorder(">")) for k, a in arrays.items()}
        with open(path, "wb") as f:
            pickle.dump(arrays, f, protocol=4)
        with open(path, "rb") as f:
            return path, pickle.load(f)  # numpy's own unpickling
    if fmt == "legacy":
        torch.save(state, path, _use_new_zipfile_serialization=False)
        if order == "big":  # the writer said so in its system record; the numbers stay little-endian
            _legacy_big_endian_record(path)
        return path, torch.load(path, weights_only=True)
    saved = state if fmt != "zip read by torch.load" else {"state_dict": state, "dtype": torch.float32}
    torch.save(saved, path + ".le")
    compress = zipfile.ZIP_DEFLATED if fmt == "zip deflated" else None
    if order == "big":
        big_endian_copy(path + ".le", path, compress=compress)
    else:
        with zipfile.ZipFile(path + ".le") as zin, zipfile.ZipFile(path, "w") as zout:
            for info in zin.infolist():
                zout.writestr(info.filename, zin.read(info), compress_type=compress or info.compress_type)
    loaded = torch.load(path, weights_only=True)
    return path, loaded.get("state_dict", loaded)


def _numpy_dtype(dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _legacy_big_endian_record(path: str) -> None:
    import io
    with open(path, "rb") as f:
        raw = f.read()
    stream = io.BytesIO(raw)
    for _ in range(2):
        pickle.load(stream)
    start = stream.tell()
    info = pickle.load(stream)
    end = stream.tell()
    info["little_endian"] = False
    with open(path, "wb") as f:
        f.write(raw[:start] + pickle.dumps(info, protocol=2) + raw[end:])


@fuzz_settings(200)
@given(checkpoints())
@pytest.mark.slow
def test_every_reader_decodes_every_byte_order_dtype_and_shape_bit_for_bit(case):
    from converter.errors import UserError
    from converter.io import open_source
    fmt, order, state = case
    event(f"{fmt}, {order}")
    with tempfile.TemporaryDirectory() as d:
        path, expected = _write(fmt, order, state, d)
        if fmt == "pdparams" and order == "big" and any(a.dtype.itemsize > 1 for a in expected.values()):
            with pytest.raises(UserError, match="big-endian"):
                open_source(path)
            return
        with open_source(path) as source:
            assert sorted(source.infos) == sorted(expected)
            for name, want in expected.items():
                want = _bits(want)
                for got in (source.read(name), source.reference(name)):
                    got = _bits(got)
                    assert got.shape == want.shape and got.dtype.itemsize == want.dtype.itemsize, (name, fmt)
                    assert got.tobytes() == want.tobytes(), (name, fmt, order)
