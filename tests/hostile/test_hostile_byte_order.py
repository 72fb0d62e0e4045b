"""Checkpoints whose numbers are not stored as this (little-endian) machine stores them, and views
that repeat elements: exit 0 with the values torch.load gives, bit for bit, or exit 2 with one
line; never wrong bytes under a passed check."""

import pickle
import zipfile

import numpy as np
import pytest
import torch

from helpers.cli import run_convert
from helpers.hostile_forge import (assert_one_line_error, big_endian_copy, float_bytes, no_leftovers, p_dict, p_str,
                                   p_tensor, pickle_of, torch_zip)

KEEP_ALL = '{"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": "\\\\1"}]}'
VALUES = [0.5, 1.5, 2.5, 3.5]


def _rules(tmp):
    path = tmp / "rules.json"
    path.write_text(KEEP_ALL)
    return path


def _written(path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(path))


def _same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def _converts_as_torch_loads(tmp, src):
    r = run_convert(src, tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    assert "check passed" in r.stderr
    expected, got = torch.load(src, weights_only=True), _written(tmp / "o.safetensors")
    expected = expected.get("state_dict", expected)
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert _same_bits(got[name], t), name


def test_a_big_endian_zip_written_by_hand_converts_to_its_values(tmp):
    """What torch.save writes on s390x: a `byteorder` record of `big`, every number big-endian.
    It was converted as zeros under a passed check."""
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor())])), {"0": float_bytes(VALUES, ">")},
              byteorder=b"big")
    assert torch.load(tmp / "m.bin")["w"].tolist() == VALUES
    _converts_as_torch_loads(tmp, tmp / "m.bin")
    assert _written(tmp / "o.safetensors")["w"].tolist() == VALUES


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]


@pytest.mark.parametrize("compress", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_every_dtype_of_a_big_endian_checkpoint_converts_bit_for_bit(tmp, compress):
    """torch.save's own file, its storages byteswapped: transposed, offset and expanded views too."""
    g = torch.Generator().manual_seed(0)
    state = {}
    for i, dtype in enumerate(DTYPES):
        base = (torch.randn(6, 4, generator=g) * 50).clamp(-120, 120)
        state[f"t{i}"] = base > 0 if dtype == torch.bool else base.to(dtype)
    state["transposed"] = torch.randn(3, 5, generator=g).t()
    state["offset"] = torch.arange(10, dtype=torch.float64)[3:7]
    state["expanded"] = torch.randn(3, generator=g).expand(4, 3)
    torch.save(state, tmp / "little.pt")
    big_endian_copy(tmp / "little.pt", tmp / "m.pt", compress=compress)
    for name, t in torch.load(tmp / "m.pt").items():
        assert _same_bits(t, state[name]), name
    _converts_as_torch_loads(tmp, tmp / "m.pt")


def test_a_big_endian_checkpoint_that_torch_load_reads_converts_to_its_values(tmp):
    """A checkpoint holding more than tensors (a torch dtype beside its state dict) is read by
    torch.load; its big-endian storages must not be read from the file's own bytes."""
    torch.save({"state_dict": {"w": torch.tensor(VALUES)}, "dtype": torch.float32}, tmp / "little.pt")
    big_endian_copy(tmp / "little.pt", tmp / "m.pt", {"0": 4})
    _converts_as_torch_loads(tmp, tmp / "m.pt")
    assert _written(tmp / "o.safetensors")["w"].tolist() == VALUES


def test_a_zip_without_a_byteorder_record_is_little_endian(tmp):
    """torch before 1.11 wrote no record; torch.load takes such a file as little-endian."""
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor())])), {"0": float_bytes(VALUES)}, byteorder=None)
    _converts_as_torch_loads(tmp, tmp / "m.bin")


def test_a_byteorder_record_that_is_neither_little_nor_big_is_refused(tmp):
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor())])), {"0": float_bytes(VALUES)},
              byteorder=b"middle")
    r = run_convert(tmp / "m.bin", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert_one_line_error(r, "byteorder record", "'middle'", "not 'little' or 'big'")
    assert not (tmp / "o.safetensors").exists() and not no_leftovers(tmp)


def test_a_legacy_file_from_a_big_endian_machine_converts_to_its_values(tmp):
    """The format before zip files stores its storages little-endian whatever machine wrote them;
    its system record's `little_endian` says only what the writer was, and torch.load reads the
    numbers the same either way: so does the conversion."""
    torch.save({"w": torch.tensor(VALUES), "i": torch.arange(3)}, tmp / "old.pt", _use_new_zipfile_serialization=False)
    data = (tmp / "old.pt").read_bytes()
    first = pickle.dumps(pickle.loads(data), protocol=2)
    second_end = len(first) + len(pickle.dumps(1001, protocol=2))
    info = pickle.loads(data[second_end:])
    old = pickle.dumps(info, protocol=2)
    assert data[second_end:second_end + len(old)] == old
    info["little_endian"] = False
    (tmp / "m.pt").write_bytes(data[:second_end] + pickle.dumps(info, protocol=2) + data[second_end + len(old):])
    _converts_as_torch_loads(tmp, tmp / "m.pt")
    assert _written(tmp / "o.safetensors")["w"].tolist() == VALUES


@pytest.mark.parametrize("view", ["expanded", "overlapping", "expanded and big-endian"])
def test_a_view_that_repeats_elements_converts_to_the_values_it_shows(tmp, view):
    """x.expand(4, 3) saved as it is: a [4, 3] tensor over 3 stored numbers, which torch.load reads
    back. It was refused as larger than its storage."""
    x = torch.tensor([1.0, 2.0, 3.0])
    t = torch.arange(6.0).as_strided((3, 3), (1, 1)) if view == "overlapping" else x.expand(4, 3)
    torch.save({"w": t}, tmp / "m.pt")
    if view.endswith("big-endian"):
        (tmp / "m.pt").rename(tmp / "little.pt")
        big_endian_copy(tmp / "little.pt", tmp / "m.pt", {"0": 4})
    _converts_as_torch_loads(tmp, tmp / "m.pt")
    assert _same_bits(_written(tmp / "o.safetensors")["w"], t.contiguous())


def test_an_expanded_view_read_by_torch_load_converts_too(tmp):
    """The same view in a checkpoint torch.load reads (it holds a torch dtype beside the weights)."""
    torch.save({"state_dict": {"w": torch.tensor([1.0, 2.0, 3.0]).expand(4, 3)}, "dtype": torch.float32}, tmp / "m.pt")
    _converts_as_torch_loads(tmp, tmp / "m.pt")


def test_the_self_check_decodes_the_source_independently(tmp):
    """The check compares the output with a second decoding of the checkpoint (Python's unpickler,
    zipfile's reading, numpy's byte orders), equal to torch.load's bit for bit, not with the
    conversion's own reading."""
    from converter.io import open_source
    from converter.io.torch_zip import TorchZipSource
    torch_zip(tmp / "m.bin", pickle_of(p_dict([(p_str("w"), p_tensor(numel=4, shape=(2, 2), stride=(1, 2)))])),
              {"0": float_bytes(VALUES, ">")}, byteorder=b"big")
    expected = torch.load(tmp / "m.bin")["w"].numpy()
    with open_source(str(tmp / "m.bin")) as source:
        assert isinstance(source, TorchZipSource)
        reference, read = source.reference("w"), source.read("w")
        assert reference is not read
        assert np.array_equal(reference, expected) and reference.dtype == expected.dtype
        assert np.array_equal(read, expected)
