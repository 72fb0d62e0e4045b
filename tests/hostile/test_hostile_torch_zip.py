"""Hostile and broken torch files: exit 2 with one line, or exit 0 with the exact bytes; never a
crash, a hang, a memory bomb or bytes from outside a tensor's storage."""

import json
import struct
import zipfile

import numpy as np
import pytest
import torch

from helpers.cli import run_convert
from helpers.hostile_forge import (assert_one_line_error, float_bytes, no_leftovers, p_dict, p_int, p_str, p_tensor,
                           pickle_of, run_bounded, torch_zip)

KEEP_ALL = [{"kind": "rename", "match": "(.*)", "to": r"\1"}]


def _rules(tmp):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    return path


def _one_tensor_zip(tmp, name="m.bin", **tensor):
    storage = float_bytes([1.0, 2.0, 3.0, 4.0])
    torch_zip(tmp / name, pickle_of(p_dict([(p_str("w"), p_tensor(**tensor))])), {"0": storage})
    return tmp / name


GEOMETRY = {
    "negative stride (segfaulted)": dict(shape=(2,), stride=(-(2 ** 30),)),
    "stride -1 at offset 0 (read before the storage)": dict(shape=(2,), stride=(-1,)),
    "negative shape": dict(shape=(-2,), stride=(1,)),
    "negative offset": dict(offset=-1, shape=(2,), stride=(1,)),
    "overflowing shape": dict(shape=(2 ** 62, 2 ** 62), stride=(1, 1)),
    "overflowing stride": dict(shape=(2,), stride=(2 ** 70,)),
    "more than 64 dimensions": dict(shape=(1,) * 65, stride=(1,) * 65),
    "shape and stride of different lengths": dict(shape=(2, 2), stride=(1,)),
    "view past the storage": dict(shape=(5,), stride=(1,)),
    "storage numel larger than its bytes": dict(numel=1000, shape=(4,), stride=(1,)),
    "an empty tensor with a size no tensor can have": dict(shape=(2 ** 63, 0), stride=(1, 1)),
    "an empty tensor with a stride past int64": dict(shape=(0,), stride=(2 ** 63,)),
}


@pytest.mark.parametrize("case", list(GEOMETRY))
@pytest.mark.slow
def test_bad_tensor_geometry_is_refused(tmp, case):
    path = _one_tensor_zip(tmp, **GEOMETRY[case])
    r = run_bounded(path, tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=60, memory_gb=4)
    assert_one_line_error(r, "m.bin")
    assert not (tmp / "o.pdparams").exists() and not no_leftovers(tmp)


@pytest.mark.slow


def test_zero_stride_view_larger_than_storage_is_not_materialised(tmp):
    """4 bytes of storage viewed with stride 0 as 2**31 floats would be 8 GB written out: past the
    1 GiB that expanded views may add, so refused before anything is read."""
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor(numel=1, shape=(2 ** 31,), stride=(0,)))])),
              {"0": float_bytes([1.0])})
    r = run_bounded(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=60, memory_gb=4)
    assert_one_line_error(r, "repeat stored elements", "8589934588 bytes", ".contiguous()")
    assert not (tmp / "o.pdparams").exists()


def test_a_small_expanded_view_within_its_storage_is_converted(tmp):
    """Stride 0 itself is legal (torch.expand saves so): a view no larger than its storage."""
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor(numel=4, shape=(2, 2), stride=(0, 1)))])),
              {"0": float_bytes([1.0, 2.0, 3.0, 4.0])})
    r = run_convert(tmp / "m.bin", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    from safetensors.numpy import load_file
    assert np.array_equal(load_file(str(tmp / "o.safetensors"))["w"], torch.load(tmp / "m.bin")["w"].numpy())


@pytest.mark.slow


def test_build_cannot_rewrite_a_tensor_after_its_check(tmp):
    """A BUILD opcode after the rebuild call sets a new shape on the tensor stand-in."""
    state = b"}" + b"(" + p_str("shape") + p_int(1 << 20) + b"\x85" + b"u"  # {'shape': (1 << 20,)}
    tensor = p_tensor(shape=(2,), stride=(1,)) + state + b"b"  # BUILD
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), tensor)])), {"0": float_bytes([1, 2, 3, 4])})
    r = run_bounded(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=60, memory_gb=4)
    assert_one_line_error(r, "m.bin")
    assert not (tmp / "o.pdparams").exists()


def test_keys_1_and_str_1_do_not_merge(tmp):
    items = [(p_int(1), p_tensor(shape=(2,), stride=(1,))), (p_str("1"), p_tensor(offset=2, shape=(2,), stride=(1,)))]
    torch_zip(tmp / "m.bin", pickle_of(p_dict(items)), {"0": float_bytes([1, 2, 3, 4])})
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "1", "'1'")
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.slow


def test_deeply_nested_shared_tuple_key_does_not_hash_for_ever(tmp):
    key = b")q\x000" + b"h\x00h\x00\x86q\x000" * 120 + b"h\x00"  # t = (t, t), 120 times: hashing it takes 2**120 steps
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(key, p_tensor(shape=(2,), stride=(1,)))])), {"0": float_bytes([1, 2, 3, 4])})
    r = run_bounded(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=30)
    assert_one_line_error(r, "m.bin")


@pytest.mark.slow


def test_data_pkl_that_inflates_to_256_mb_is_not_read_whole(tmp):
    import zlib
    path = tmp / "bomb.bin"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("archive/data.pkl", "w", force_zip64=True) as f:
            chunk = bytes(16 << 20)
            for _ in range(16):
                f.write(chunk)
        z.writestr("archive/data/0", b"\0" * 16)
    assert path.stat().st_size < 2 << 20
    del zlib
    r = run_bounded(path, tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=60)
    assert_one_line_error(r, "bomb.bin", "data.pkl")
    assert "MiB" in r.stderr


def test_deflated_storages_are_inflated_and_exact(tmp):
    """`zip -r` of a checkpoint deflates every member; torch.load(mmap=True) reads such a file wrong."""
    torch.manual_seed(0)
    state = {"a": torch.randn(64, 33), "b": torch.arange(10)}
    torch.save(state, tmp / "plain.pt")
    with zipfile.ZipFile(tmp / "plain.pt") as src, zipfile.ZipFile(tmp / "zipped.pt", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zipfile.ZipFile(tmp / "zipped.pt").infolist())
    r = run_convert(tmp / "zipped.pt", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    from safetensors.torch import load_file
    back = load_file(str(tmp / "o.safetensors"))
    for k, v in state.items():
        assert torch.equal(back[k], v), k


def test_deflated_storage_that_inflates_past_its_size_is_refused(tmp):
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor(shape=(4,), stride=(1,)))])),
              {"0": float_bytes([1, 2, 3, 4]) + bytes(1 << 20)}, compress=zipfile.ZIP_DEFLATED)
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "m.bin")


def test_storage_whose_crc_does_not_match_is_refused(tmp):
    torch.save({"w": torch.arange(16, dtype=torch.float32)}, tmp / "m.pt")
    data = bytearray((tmp / "m.pt").read_bytes())
    with zipfile.ZipFile(tmp / "m.pt") as z:
        info = z.getinfo("m/data/0")
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start + 5] ^= 0x10  # one flipped bit in the storage, the zip's CRC left as it was
    (tmp / "bad.pt").write_bytes(bytes(data))
    r = run_convert(tmp / "bad.pt", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "bad.pt", "CRC")
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("content,words", [
    (b"just some notes\nabout the model\n", ["not a torch checkpoint"]),
    (b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n", ["not a torch checkpoint", "HTML"]),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 1340000000\n",
     ["not a torch checkpoint", "Git LFS pointer"]),
    (b"\x80\x04K\x01.", ["not a torch checkpoint"]),  # a pickle of the number 1
])
def test_text_html_and_lfs_pointers_are_not_torch_checkpoints(tmp, content, words):
    (tmp / "pytorch_model.bin").write_bytes(content)
    r = run_convert(tmp / "pytorch_model.bin", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "pytorch_model.bin", *words)
    assert "asks to import" not in r.stderr


def test_dtype_bf16_on_a_0_dim_tensor(tmp):
    torch.save({"w": torch.tensor(1.5), "x": torch.tensor(float("nan")), "steps": torch.tensor(3)}, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.safetensors", "--mapping", _rules(tmp), "--dtype", "bf16")
    assert r.code == 0, r
    from safetensors.torch import load_file
    back = load_file(str(tmp / "o.safetensors"))
    assert back["w"].dtype == torch.bfloat16 and back["w"].shape == () and float(back["w"]) == 1.5
    assert torch.isnan(back["x"]) and back["steps"].dtype == torch.int64


def test_structured_to_parameter_name_key_is_refused_for_pdparams(tmp):
    torch.save({"StructuredToParameterName@@": torch.zeros(2), "w": torch.ones(2)}, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "StructuredToParameterName@@")
    assert not (tmp / "o.pdparams").exists()


def test_a_key_with_a_newline_cannot_forge_output_lines(tmp):
    torch.save({"fc.weight\nerror: forged line": torch.zeros(2), "\x1b[2Jclear": torch.zeros(1)}, tmp / "m.pt")
    rules = tmp / "r.json"
    rules.write_text(json.dumps({"name": "x", "rules": [{"kind": "drop", "key": "nothing"}]}))
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 2, r
    assert not any(line.startswith("error: forged") for line in r.stderr.splitlines()), r.stderr
    assert "\x1b" not in r.stderr
    assert "\\n" in r.stderr


@pytest.mark.slow


def test_the_pre_1_6_format_is_read_and_checked_first(tmp):
    """torch's format before the zip (pickles one after another) still converts; a hash bomb in
    it is refused by our scan before torch.load would hash it."""
    import pickle
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    torch.save(state, tmp / "legacy.pt", _use_new_zipfile_serialization=False)
    r = run_convert(tmp / "legacy.pt", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    from safetensors.torch import load_file
    back = load_file(str(tmp / "o.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in state.items())
    from converter.io.torch_io import LEGACY_MAGIC
    key = b")q\x000" + b"h\x00h\x00\x86q\x000" * 120 + b"h\x00"
    bomb = b"\x80\x02}" + key + b"Ns."
    (tmp / "bomb.pt").write_bytes(pickle.dumps(LEGACY_MAGIC, protocol=2) + pickle.dumps(1001, protocol=2)
                                  + pickle.dumps({"little_endian": True}, protocol=2) + bomb)
    r = run_bounded(tmp / "bomb.pt", tmp / "o.pdparams", "--mapping", _rules(tmp), timeout=60)
    assert_one_line_error(r, "bomb.pt", "tuple")


@pytest.mark.parametrize("fmt", ["zip", "safetensors"])
def test_a_bool_tensor_holding_other_bytes_is_refused(tmp, fmt):
    """A bool byte of 0x14 reads as True but is copied on as 0x14: found by the fuzz tests, where
    torch's own copy of an expanded view normalised it and ours did not."""
    if fmt == "zip":
        torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor(numel=2, shape=(2,), stride=(1,),
                                                                        storage_type="BoolStorage"))])), {"0": b"\x14\x01"})
    else:
        from helpers.hostile_forge import safetensors_raw
        safetensors_raw(tmp / "m.bin", {"w": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x14")
        (tmp / "m.bin").rename(tmp / "m.safetensors")
    src = tmp / ("m.bin" if fmt == "zip" else "m.safetensors")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "bool tensor 'w'", "other than 0 and 1")


def _tensor_of_kind(kind):
    import torch
    if kind == "nested":
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    if kind == "meta":
        return torch.empty(3, 4, device="meta")
    if kind == "sparse COO":
        return torch.eye(3).to_sparse()
    if kind == "sparse CSR":
        return torch.eye(3).to_sparse_csr()
    return torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)


@pytest.mark.parametrize("kind,words", [
    ("nested", ("a nested tensor",)), ("meta", ("meta device", "no data")), ("sparse COO", ("sparse", "to_dense")),
    ("sparse CSR", ("sparse", "to_dense")), ("quantized", ("quantized", "torch.qint8", "dequantize")),
])
def test_tensor_kinds_without_plain_bytes_are_refused_by_name(tmp, kind, words):
    """A nested tensor ended in exit 3 (an internal error from torch), a meta one at reading time."""
    import warnings

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({"w": _tensor_of_kind(kind), "b": torch.ones(2)}, str(tmp / "m.pt"))
    (tmp / "rules.json").write_text(json.dumps({"name": "k", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}))
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", tmp / "rules.json")
    assert_one_line_error(r, "tensor 'w' is", *words)
    assert not (tmp / "o.pdparams").exists()
