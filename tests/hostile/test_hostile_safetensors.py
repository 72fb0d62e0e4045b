"""Malformed safetensors headers and sharded indexes: what the safetensors library refuses is
refused, shards stay inside the index's directory, and nothing ends in an internal error."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers.cli import run_convert
from helpers.hostile_forge import assert_one_line_error, no_leftovers, run_bounded, safetensors_raw

KEEP_ALL = [{"kind": "rename", "match": "(.*)", "to": r"\1"}]


def _rules(tmp):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    return path


def _entry(offsets, shape=(2,), dtype="F32"):
    return {"dtype": dtype, "shape": list(shape) if not isinstance(shape, str) else shape, "data_offsets": list(offsets)}


def _library_refuses(path) -> bool:
    try:
        load_file(str(path))
    except Exception:
        return True
    return False


HEADERS = {
    "overlapping offsets": ({"a": _entry([0, 8]), "b": _entry([4, 12])}, 12),
    "a gap between tensors": ({"a": _entry([0, 8]), "b": _entry([12, 20])}, 20),
    "data not starting at 0": ({"a": _entry([4, 12])}, 12),
    "shape given as strings": ({"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}, 8),
    "shape given as a string": ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, 8),
    "shape with a float": ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, 8),
    "shape with a boolean": ({"a": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, 8),
    "negative size": ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8),
    "offsets as strings": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}, 8),
    "three offsets": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, 8),
    "end before begin": ({"a": _entry([8, 0])}, 8),
    "bytes after the last tensor": ({"a": _entry([0, 8])}, 16),
    "dtype not a string": ({"a": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}}, 8),
    "an entry that is a list": ({"a": [1, 2]}, 8),
    "metadata that is not strings": ({"__metadata__": {"x": 1}, "a": _entry([0, 8])}, 8),
    "overflowing shape": ({"a": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40, 2 ** 40], "data_offsets": [0, 8]}}, 8),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_headers_the_library_refuses_are_refused(tmp, case):
    header, size = HEADERS[case]
    path = tmp / "m.safetensors"
    safetensors_raw(path, header, bytes(size))
    assert _library_refuses(path), case  # the reference implementation refuses it too
    r = run_convert(path, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "m.safetensors")
    assert not (tmp / "o.pdparams").exists() and not no_leftovers(tmp)


def test_duplicate_keys_in_a_header_are_refused(tmp):
    raw = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    safetensors_raw(tmp / "m.safetensors", raw, bytes(8))
    r = run_convert(tmp / "m.safetensors", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "m.safetensors", "'a'")


def test_json_nested_100000_deep_is_one_line(tmp):
    raw = b'{"__metadata__": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    safetensors_raw(tmp / "m.safetensors", raw, b"")
    r = run_convert(tmp / "m.safetensors", tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "m.safetensors")


def test_empty_tensors_and_metadata_are_still_read(tmp):
    save_file({"a": np.zeros((0, 3), np.float32), "b": np.arange(3, dtype=np.int64)}, str(tmp / "m.safetensors"),
              metadata={"format": "pt"})
    r = run_convert(tmp / "m.safetensors", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    back = load_file(str(tmp / "o.safetensors"))
    assert back["a"].shape == (0, 3) and np.array_equal(back["b"], np.arange(3))


def _index(tmp, weight_map, name="model.safetensors.index.json"):
    (tmp / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp / name


def test_an_index_naming_itself(tmp):
    index = _index(tmp, {"a": "model.safetensors.index.json"})
    r = run_convert(index, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "model.safetensors.index.json")


def test_an_index_naming_another_index(tmp):
    _index(tmp, {"a": "model.safetensors.index.json"}, "other.safetensors.index.json")
    index = _index(tmp, {"a": "other.safetensors.index.json"})
    r = run_convert(index, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "other.safetensors.index.json")


@pytest.mark.parametrize("weight_map", [{"a": 3}, {"a": None}, {"a": ["x"]}, {"a": ""}, ["a"]])
def test_an_index_with_wrong_types(tmp, weight_map):
    index = _index(tmp, weight_map)
    r = run_convert(index, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "model.safetensors.index.json")


def _outside_layout(tmp):
    (tmp / "ckpt").mkdir()
    save_file({"a": np.arange(4, dtype=np.float32)}, str(tmp / "outside.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(tmp / "ckpt" / "inside.safetensors"))
    return tmp / "ckpt"


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_shards_outside_the_index_directory_need_a_flag(tmp, how):
    ckpt = _outside_layout(tmp)
    if how == "dotdot":
        shard = "../outside.safetensors"
    elif how == "absolute":
        shard = str(tmp / "outside.safetensors")
    else:
        os.symlink(tmp / "outside.safetensors", ckpt / "linked.safetensors")
        shard = "linked.safetensors"
    index = _index(ckpt, {"a": shard, "b": "inside.safetensors"})
    r = run_convert(index, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, "outside", "--allow-outside-shards")
    assert not (tmp / "o.pdparams").exists()
    r = run_convert(index, tmp / "o.pdparams", "--mapping", _rules(tmp), "--allow-outside-shards")
    assert r.code == 0, r


def test_a_hub_cache_layout_with_links_into_blobs_is_inside(tmp):
    """The Hugging Face cache keeps files in blobs/ and links to them from snapshots/<rev>/."""
    blobs, snap = tmp / "blobs", tmp / "snapshots" / "abc123"
    blobs.mkdir()
    snap.mkdir(parents=True)
    save_file({"a": np.arange(4, dtype=np.float32)}, str(blobs / "1111"))
    save_file({"b": np.ones(2, np.float32)}, str(blobs / "2222"))
    (blobs / "3333").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    for name, blob in (("model-1.safetensors", "1111"), ("model-2.safetensors", "2222"),
                       ("model.safetensors.index.json", "3333")):
        os.symlink(os.path.join("..", "..", "blobs", blob), snap / name)
    r = run_convert(snap, tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert r.code == 0, r
    assert sorted(load_file(str(tmp / "o.safetensors"))) == ["a", "b"]


@pytest.mark.parametrize("suffix", [".safetensors", ".pdparams"])
def test_a_git_lfs_pointer_is_named_as_such(tmp, suffix):
    (tmp / f"model{suffix}").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 9\n")
    r = run_convert(tmp / f"model{suffix}", tmp / "o.safetensors", "--mapping", _rules(tmp))
    assert_one_line_error(r, f"model{suffix}", "Git LFS pointer", "git lfs pull")


@pytest.mark.parametrize("fmt", ["safetensors", "zip"])
def test_a_key_that_is_not_valid_unicode_is_refused(tmp, fmt):
    """A lone surrogate: JSON can escape it and a pickle can carry it, but no output can hold it."""
    if fmt == "safetensors":
        safetensors_raw(tmp / "m.safetensors", b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
                        bytes(4))
        src = tmp / "m.safetensors"
    else:
        from helpers.hostile_forge import float_bytes, p_dict, p_tensor, pickle_of, torch_zip
        key = b"X\x03\x00\x00\x00\xed\xa0\x80"
        torch_zip(tmp / "m.bin", pickle_of(p_dict([(key, p_tensor(shape=(2,), stride=(1,)))])), {"0": float_bytes([1, 2, 3, 4])})
        src = tmp / "m.bin"
    for out in ("o.pdparams", "o.safetensors"):
        r = run_convert(src, tmp / out, "--mapping", _rules(tmp))
        assert_one_line_error(r, "not valid Unicode", "\\ud800")


@pytest.mark.parametrize("field", ["to", "match"])
def test_a_rule_that_is_not_valid_unicode_is_refused(tmp, field):
    save_file({"w": np.ones(2, np.float32)}, str(tmp / "m.safetensors"))
    rule = {"kind": "rename", "match": "(.*)", "to": r"\1"}
    rule[field] = "\ud800" + rule[field]
    (tmp / "r.json").write_text(json.dumps({"name": "x", "rules": [rule]}))
    r = run_convert(tmp / "m.safetensors", tmp / "o.pdparams", "--mapping", tmp / "r.json")
    assert_one_line_error(r, "rule 1", "not valid Unicode")


@pytest.mark.slow


def test_a_shard_that_is_a_fifo_is_named_as_such(tmp):
    """It read 'names shard(s) that do not exist'; a fifo is there, it is only not a file."""
    save_file({"a": np.ones(2, np.float32)}, str(tmp / "s1.safetensors"))
    os.mkfifo(tmp / "s2.safetensors")
    _index(tmp, {"a": "s1.safetensors", "b": "s2.safetensors"})
    r = run_bounded(tmp / "model.safetensors.index.json", tmp / "o.pdparams", timeout=60)
    assert_one_line_error(r, "s2.safetensors", "fifo", "not a regular file")
