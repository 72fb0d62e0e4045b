"""Bytes copied from a source file to the output in the kernel (io/copyrange.py) and the output
file written at counted offsets (io/sink.py): every method, odd sizes and offsets, a source that
shrinks, and conversions whose tensors are copied byte for byte as the computed path writes them."""

import json
import os

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from helpers.cli import run_convert
from converter.errors import UserError
from converter.io import copyrange
from converter.io.copyrange import METHODS, copy_range, pwrite_all, source_bytes
from converter.io.sink import OutputFile
from converter.io.stable import StableFile

WAYS = [METHODS, ("sendfile", "pread"), ("pread",)]


def _random_file(path, size, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("methods", WAYS, ids=lambda m: m[0])
def test_every_method_copies_odd_ranges_to_odd_offsets(tmp, monkeypatch, methods):
    monkeypatch.setattr(copyrange, "BUFFER", 4096 + 5)  # the pread fallback's buffer refilled many times
    monkeypatch.setattr(copyrange, "PIECE", 10_007)  # several kernel calls per range
    data = _random_file(tmp / "src", 100_003)
    src = StableFile(str(tmp / "src"))
    try:
        for offset, count, at in [(0, 0, 0), (0, 1, 0), (1, 7, 3), (4095, 4097, 4093), (13, 50_000, 1),
                                  (99_000, 1003, 77_777), (0, 100_003, 5)]:
            fd = os.open(tmp / "dst", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.pwrite(fd, b"\xee" * at, 0)
                copy_range(src, offset, count, fd, at, methods)
            finally:
                os.close(fd)
            assert (tmp / "dst").read_bytes() == b"\xee" * at + data[offset:offset + count], (offset, count, at)
    finally:
        src.close()


@pytest.mark.parametrize("methods", WAYS, ids=lambda m: m[0])
def test_a_range_past_the_opened_size_or_a_source_that_shrank_is_src_changed(tmp, methods):
    _random_file(tmp / "src", 50_000)
    src = StableFile(str(tmp / "src"))
    fd = os.open(tmp / "dst", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(UserError, match="SRC changed while it was being read"):
            copy_range(src, 49_990, 11, fd, 0, methods)
        assert os.path.getsize(tmp / "dst") == 0  # refused before anything is copied
        os.truncate(tmp / "src", 20_000)  # the file shrinks after it was opened
        with pytest.raises(UserError, match="SRC changed while it was being read"):
            copy_range(src, 10_000, 30_000, fd, 0, methods)
    finally:
        os.close(fd)
        src.close()


def test_a_copy_across_file_systems_falls_back_where_the_kernel_refuses(tmp):
    """tmpfs to the test folder's file system: copy_file_range may answer EXDEV; the bytes arrive."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    import tempfile
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        path = os.path.join(shm, "src")
        data = np.random.default_rng(3).integers(0, 256, 70_001, dtype=np.uint8).tobytes()
        with open(path, "wb") as f:
            f.write(data)
        src = StableFile(path)
        fd = os.open(tmp / "dst", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            copy_range(src, 3, 70_000 - 5, fd, 2)
        finally:
            os.close(fd)
            src.close()
    assert (tmp / "dst").read_bytes() == b"\0\0" + data[3:70_000 - 2]


def test_pwrite_all_writes_buffers_back_to_back_in_pieces(tmp):
    parts = [b"", b"abc", bytearray(b"0123456789" * 3), memoryview(b"xyz"), np.arange(7, dtype=np.uint16)]
    fd = os.open(tmp / "out", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert pwrite_all(fd, parts, 4, piece=7) == 3 + 30 + 3 + 14
    finally:
        os.close(fd)
    assert (tmp / "out").read_bytes() == b"\0" * 4 + b"".join(bytes(memoryview(p).cast("B")) for p in parts)


def test_output_file_keeps_writes_and_copies_in_order(tmp, monkeypatch):
    import converter.io.sink as sink
    monkeypatch.setattr(sink, "WRITE_PIECE", 4099)
    data = _random_file(tmp / "src", 300_001, seed=1)
    src = StableFile(str(tmp / "src"))
    big = np.random.default_rng(2).integers(0, 256, sink.SMALL + 4097, dtype=np.uint8)
    expected = []
    out = OutputFile(os.open(tmp / "out", os.O_WRONLY | os.O_CREAT, 0o644))
    try:
        for step in range(40):  # small writes gathered, large ones at once, copies between them
            small = bytes([step]) * (step * 37 % 501)
            assert out.write(small) == len(small)
            expected.append(small)
            if step % 3 == 0:
                out.copy_from(src, step * 7001, 5003 + step)
                expected.append(data[step * 7001:step * 7001 + 5003 + step])
            if step % 5 == 0:
                out.write(big)
                expected.append(big.tobytes())
            assert out.tell() == sum(map(len, expected))
        out.flush()
        assert os.path.getsize(tmp / "out") == out.tell()
        out.write(b"tail")
        expected.append(b"tail")
    finally:
        out.close()
        src.close()
    assert (tmp / "out").read_bytes() == b"".join(expected)


def _entry(parts, shape, source_dtype="float32", dtype="float32"):
    from converter.rules.plan import TargetEntry
    return TargetEntry("t", parts, None if len(parts) == 1 else 0, source_dtype, dtype, shape)


def test_source_bytes_are_the_tensors_bytes_or_none(tmp):
    from converter.io.safetensors_io import SafetensorsSource
    from converter.rules.plan import Part as _Part
    rng = np.random.default_rng(4)
    arrays = {"m": rng.standard_normal((6, 5)).astype(np.float32), "v": rng.standard_normal(7).astype(np.float32),
              "flag": np.array([True, False])}
    save_file(arrays, str(tmp / "s.safetensors"))
    with SafetensorsSource(str(tmp / "s.safetensors")) as source:
        def got(entry):
            file, offset, nbytes = source_bytes(entry, source)
            return np.frombuffer(os.pread(file.fd, nbytes, offset), np.float32).reshape(entry.shape)
        assert np.array_equal(got(_entry([_Part("m")], (6, 5))), arrays["m"])
        assert np.array_equal(got(_entry([_Part("m", reshape=(30,))], (30,))), arrays["m"].reshape(30))
        assert np.array_equal(got(_entry([_Part("m", piece=(0, 2, 5))], (3, 5))), arrays["m"][2:5])
        assert np.array_equal(got(_entry([_Part("m", reshape=(1, 6, 5), piece=(1, 1, 3))], (1, 2, 5))),
                              arrays["m"][1:3].reshape(1, 2, 5))
        assert np.array_equal(got(_entry([_Part("v", perm=(0,))], (7,))), arrays["v"])
        for entry in [_entry([_Part("m", perm=(1, 0))], (5, 6)),  # a transpose is computed
                      _entry([_Part("m", piece=(1, 0, 2))], (6, 2)),  # columns are not one run of bytes
                      _entry([_Part("v")], (7,), dtype="float16"),  # a cast
                      _entry([_Part("v"), _Part("v")], (14,)),  # a merge
                      _entry([_Part("flag")], (2,), "bool", "bool")]:  # bools are read and checked
            assert source_bytes(entry, source) is None


def test_torch_zip_ranges_follow_the_view_and_refuse_other_layouts(tmp):
    from converter.io.torch_io import unwrap_state
    from converter.io.torch_zip import TorchZipSource
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"whole": base, "rows": base[1:3], "turned": base.t(), "cols": base[:, 2:4]}, tmp / "m.pt")
    with TorchZipSource(str(tmp / "m.pt"), unwrap_state) as source:
        file, offset, nbytes = source.byte_range("rows")
        assert np.frombuffer(os.pread(file.fd, nbytes, offset), np.float32).tolist() == base[1:3].flatten().tolist()
        assert source.byte_range("whole")[2] == 96
        assert source.byte_range("turned") is None and source.byte_range("cols") is None


def test_pdparams_ranges_are_the_arrays_bytes(tmp):
    from converter.io.base import TensorInfo
    from converter.io.pdparams import PdparamsSource, write_pdparams
    state = {"m": np.arange(35, dtype=np.float32).reshape(5, 7), "b": np.arange(3, dtype=np.int64)}
    with open(tmp / "m.pdparams", "wb") as f:
        write_pdparams(f, [TensorInfo(k, str(v.dtype), v.shape) for k, v in state.items()], lambda i: state[i.name])
    with PdparamsSource(str(tmp / "m.pdparams")) as source:
        for name, array in state.items():
            file, offset, nbytes = source.byte_range(name)
            assert os.pread(file.fd, nbytes, offset) == array.tobytes()


def _rules(tmp, rules):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "test", "rules": rules}))
    return path


@pytest.mark.parametrize("suffix", ["safetensors", "bin", "pdparams"])
@pytest.mark.parametrize("out", ["pdparams", "safetensors"])
def test_copied_tensors_give_the_file_the_computed_path_gives(tmp, monkeypatch, suffix, out):
    """Odd sizes (3 bytes of int8, 1-element and empty tensors), slices of rows, a transposed weight
    between copied ones: the file is byte for byte the one written with every tensor computed."""
    import converter.convert
    rng = np.random.default_rng(5)
    state = {"emb": rng.standard_normal((33, 7)).astype(np.float32), "odd": rng.integers(-9, 9, 3).astype(np.int8),
             "one": np.float32([1.5]), "empty": np.zeros((0, 4), np.float32),
             "qkv": rng.standard_normal((6, 5)).astype(np.float32), "w": rng.standard_normal((9, 4)).astype(np.float32),
             "h": rng.standard_normal(11).astype(np.float16)}
    if suffix == "safetensors":
        save_file(state, str(tmp / "m.safetensors"))
    elif suffix == "bin":
        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, tmp / "m.bin")
    else:
        from converter.io.pdparams import write_pdparams
        from converter.io.base import TensorInfo
        with open(tmp / "m.pdparams", "wb") as f:
            write_pdparams(f, [TensorInfo(k, str(v.dtype), v.shape) for k, v in state.items()], lambda i: state[i.name])
    rules = _rules(tmp, [{"kind": "rename", "match": "(emb|odd|one|empty|w|h)", "to": r"\1"},
                         {"kind": "split", "key": "qkv", "to": ["q", "k", "v"], "axis": 0},
                         {"kind": "transpose", "key": "w"}])
    r = run_convert(tmp / f"m.{suffix}", tmp / f"copied.{out}", "--mapping", rules)
    assert r.code == 0, r
    monkeypatch.setattr(converter.convert, "source_bytes", lambda entry, source: None)
    r = run_convert(tmp / f"m.{suffix}", tmp / f"computed.{out}", "--mapping", rules)
    assert r.code == 0, r
    assert (tmp / f"copied.{out}").read_bytes() == (tmp / f"computed.{out}").read_bytes()
