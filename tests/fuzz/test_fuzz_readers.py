"""Property-based tests: malformed torch zips, safetensors headers and sharded indexes, generated
by hypothesis with a fixed budget of examples (derandomized, so every run tries the same ones).

Every input must end in exit 0 with output bit-identical to what the reference reader (torch.load,
the safetensors library) makes of the same file, or in exit 2 with one line; within bounded time
and memory (see hostile_forge.run_in_process)."""

import pytest
import json
import os
import tempfile
import zipfile

import numpy as np
import safetensors.torch
import torch
from hypothesis import event, given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from helpers.hostile_forge import (assert_clean_verdict, fuzz_settings, p_dict, p_int, p_str, p_tensor, pickle_of, run_in_process,
                           safetensors_raw, torch_zip)

KEEP_ALL = json.dumps({"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]})


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


# ---- torch zips

STORAGES = {"FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8, "BoolStorage": 1,
            "ByteStorage": 1, "DoubleStorage": 8, "IntStorage": 4}
HOSTILE_INTS = [-1, -2, -(2 ** 30), 2 ** 31, 2 ** 62, 2 ** 63, 2 ** 64 + 1, 13, 100]
MUTATIONS = [None, None, None, "shape", "stride", "offset", "numel", "size", "kind", "build", "flip", "int key",
             "deflate", "dims"]


def _contiguous(shape):
    stride, step = [], 1
    for d in reversed(shape):
        stride.insert(0, step)
        step *= max(d, 1)
    return stride


@st.composite
def _tensor(draw, numel):
    """(shape, stride, offset) of a valid view of a storage of `numel` elements."""
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    if int(np.prod(shape)) > numel:
        shape = [numel]
    stride = _contiguous(shape)
    if len(shape) == 2 and draw(st.booleans()):  # a transposed view, as torch saves w.t()
        shape, stride = shape[::-1], stride[::-1]
    if len(shape) == 2 and shape[0] > 1 and draw(st.integers(0, 4)) == 0:  # an expanded view (stride 0)
        stride = [0, stride[1]]
    span = 1 + sum((d - 1) * st_ for d, st_ in zip(shape, stride)) if all(shape) else 0
    offset = draw(st.integers(0, max(numel - span, 0)))
    return shape, stride, offset


@st.composite
def tensor_zips(draw):
    """A valid data.pkl of 1-3 tensors over 1-2 storages, then (often) one hostile change."""
    storages = {}
    for key in ("0", "1")[:draw(st.integers(1, 2))]:
        kind = draw(st.sampled_from(sorted(STORAGES)))
        numel = draw(st.integers(0, 12))
        storages[key] = [kind, numel, numel * STORAGES[kind]]
    names = draw(st.lists(st.sampled_from(["w", "b", "1", "layer.0.weight", "a\nb", "StructuredToParameterName@@", "\ud800x"]),
                          min_size=1, max_size=3, unique=True))
    records = []
    for name in names:
        key = draw(st.sampled_from(sorted(storages)))
        shape, stride, offset = draw(_tensor(storages[key][1]))
        records.append([name, key, shape, stride, offset])
    mutation = draw(st.sampled_from(MUTATIONS))
    build = False
    record = records[draw(st.integers(0, len(records) - 1))]
    if mutation in ("shape", "stride") and record[2]:
        field = 2 if mutation == "shape" else 3
        record[field] = list(record[field])
        record[field][draw(st.integers(0, len(record[2]) - 1))] = draw(st.sampled_from(HOSTILE_INTS + [0]))
    elif mutation == "offset":
        record[4] = draw(st.sampled_from(HOSTILE_INTS))
    elif mutation == "dims":
        record[2], record[3] = [1] * 65, [1] * 65
    elif mutation == "numel":
        storages[record[1]][1] += draw(st.sampled_from([-1, 1, 2 ** 40]))
    elif mutation == "size":
        storages[record[1]][2] += draw(st.sampled_from([-1, 1, 3]))
    elif mutation == "kind":
        storages[record[1]][0] = draw(st.sampled_from(["ComplexFloatStorage", "QInt8Storage", "Nonsense"]))
    elif mutation == "build":
        build = True
    elif mutation == "int key":
        record[0] = 1
    items = []
    for name, key, shape, stride, offset in records:
        kind, numel, _ = storages[key]
        tensor = p_tensor(key, numel, offset, tuple(shape), tuple(stride), kind)
        if build and name == record[0]:
            tensor += b"}(" + p_str("shape") + p_int(1 << 20) + b"\x85ub"
        items.append((p_int(name) if isinstance(name, int) else p_str(name), tensor))
    data_pkl = pickle_of(p_dict(items))
    if mutation == "flip":
        raw = bytearray(data_pkl)
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        data_pkl = bytes(raw)
    compress = zipfile.ZIP_DEFLATED if mutation == "deflate" else zipfile.ZIP_STORED
    data = {key: os.urandom(max(size, 0)) for key, (_, _, size) in storages.items()}
    return data_pkl, data, compress


@fuzz_settings(250)
@given(tensor_zips(), st.sampled_from(["pdparams", "safetensors"]))
@pytest.mark.slow
def test_fuzz_torch_zip(case, fmt):
    data_pkl, storages, compress = case
    with tempfile.TemporaryDirectory() as d:
        src, out, rules = os.path.join(d, "m.bin"), os.path.join(d, f"o.{fmt}"), os.path.join(d, "r.json")
        torch_zip(src, data_pkl, storages, compress)
        with open(rules, "w") as f:
            f.write(KEEP_ALL)
        r = run_in_process(src, out, "--mapping", rules)
        event(f"exit {r.code}")
        assert_clean_verdict(r)
        if r.code != 0:
            assert not os.path.exists(out)
            return
        reference = torch.load(src, weights_only=True, map_location="cpu")  # what torch makes of the same file
        got = _read_output(out)
        assert sorted(got) == sorted(str(k) for k in reference)
        for key, tensor in reference.items():
            assert _same_bits(got[str(key)], _bits(tensor)), key


def _read_output(path: str) -> dict:
    if path.endswith(".safetensors"):
        return {k: _bits(v) for k, v in safetensors.torch.load_file(path).items()}
    from converter.io.pdparams import load_pdparams
    return load_pdparams(path)


# ---- safetensors headers

DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "BOOL": 1, "U8": 1, "F64": 8, "I8": 1, "I32": 4}
json_junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3),
                      st.lists(st.integers(-2, 3), max_size=2), st.just(["2"]), st.just([2.5]))
HEADER_MUTATIONS = [None, None, None, "begin", "end", "field", "duplicate", "metadata", "trailing", "short",
                    "dtype", "quote", "length", "negative", "huge"]


@st.composite
def safetensors_files(draw):
    """A valid header and data, then (often) one change: offsets, types, duplicates, lengths."""
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d.e", "\ud800"]), max_size=3, unique=True))
    header, offset = {}, 0
    for name in names:
        dtype = draw(st.sampled_from(sorted(DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if draw(st.booleans()):
        header["__metadata__"] = {"format": "pt"}
    data_size = offset
    mutation = draw(st.sampled_from(HEADER_MUTATIONS))
    entry = header[names[draw(st.integers(0, len(names) - 1))]] if names else None
    if entry and mutation in ("begin", "end"):
        entry["data_offsets"][0 if mutation == "begin" else 1] += draw(st.sampled_from([-4, -1, 1, 2, 4]))
    elif entry and mutation == "field":
        entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(json_junk)
    elif entry and mutation == "dtype":
        entry["dtype"] = draw(st.sampled_from(["U16", "F8_E4M3", "C64", "XX", "f32"]))
    elif entry and mutation == "negative":
        entry["shape"] = [-1] + entry["shape"]
    elif entry and mutation == "huge":  # zero bytes of data, but no tensor can have this extent
        entry["shape"] = [2 ** 62, 0] + entry["shape"]
    elif mutation == "metadata":
        header["__metadata__"] = draw(json_junk)
    elif mutation in ("trailing", "short"):
        data_size += 3 if mutation == "trailing" else -1
    raw = json.dumps(header).encode()
    if mutation == "duplicate" and names:
        raw = raw[:-1] + b", " + json.dumps(names[0]).encode() + b": " + json.dumps(header[names[0]]).encode() + b"}"
    elif mutation == "quote":
        raw = raw.replace(b'"', b"'", 1)
    data = os.urandom(max(data_size, 0))
    return raw, data, mutation != "length"


@fuzz_settings(250)
@given(safetensors_files())
@pytest.mark.slow
def test_fuzz_safetensors_header(case):
    raw, data, pad = case
    with tempfile.TemporaryDirectory() as d:
        src, out, rules = os.path.join(d, "m.safetensors"), os.path.join(d, "o.safetensors"), os.path.join(d, "r.json")
        safetensors_raw(src, raw, data, pad)
        with open(rules, "w") as f:
            f.write(KEEP_ALL)
        try:  # the library's own reader (torch's, which knows bf16) is the reference
            reference = {k: _bits(v) for k, v in safetensors.torch.load_file(src).items()}
        except Exception:
            reference = None
        r = run_in_process(src, out, "--mapping", rules)
        event(f"exit {r.code}")
        assert_clean_verdict(r)
        if reference is None:  # what the library refuses is refused
            assert r.code == 2, r
        if r.code == 0:
            assert reference is not None
            got = _read_output(out)
            assert sorted(got) == sorted(reference)
            for key, array in reference.items():
                assert _same_bits(got[key], array), key


# ---- sharded indexes

BAD_SHARDS = ["missing.safetensors", "../outside.safetensors", "model.safetensors.index.json", "sub/../s1.safetensors",
              "", "/abs/outside.safetensors", "link.safetensors", "s1.safetensors\x00"]
HOME = {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}


@st.composite
def index_layouts(draw):
    """The right weight_map for two shards, then (often) one key pointed somewhere else."""
    weight_map = {k: HOME[k] for k in draw(st.lists(st.sampled_from(sorted(HOME)), min_size=1, max_size=3, unique=True))}
    if draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(weight_map) + ["z"]))
        weight_map[key] = draw(st.one_of(st.sampled_from(BAD_SHARDS + sorted(set(HOME.values()))), json_junk))
    return weight_map, draw(st.booleans())


@fuzz_settings(120)
@given(index_layouts())
@pytest.mark.slow
def test_fuzz_index(case):
    weight_map, allow = case
    with tempfile.TemporaryDirectory() as top:
        d = os.path.join(top, "ckpt")
        os.mkdir(d)
        shards = {"s1.safetensors": {"a": np.arange(3, dtype=np.float32), "b": np.ones(2, np.int64)},
                  "s2.safetensors": {"c": np.full(2, 7, np.float16)}}
        for name, tensors in shards.items():
            save_file(tensors, os.path.join(d, name))
        save_file({"z": np.zeros(1, np.float32)}, os.path.join(top, "outside.safetensors"))
        os.symlink(os.path.join(top, "outside.safetensors"), os.path.join(d, "link.safetensors"))
        weight_map = {k: (v.replace("/abs", top) if isinstance(v, str) else v) for k, v in weight_map.items()}
        index = os.path.join(d, "model.safetensors.index.json")
        with open(index, "w") as f:
            json.dump({"weight_map": weight_map}, f)
        out, rules = os.path.join(top, "o.safetensors"), os.path.join(top, "r.json")
        with open(rules, "w") as f:
            f.write(KEEP_ALL)
        r = run_in_process(index, out, "--mapping", rules, *(["--allow-outside-shards"] if allow else []))
        event(f"exit {r.code}")
        assert_clean_verdict(r)
        if r.code != 0:
            return
        named = set(weight_map.values())
        expected = {}
        for shard in named:
            path = os.path.realpath(os.path.join(d, shard))
            if not allow:  # without the flag every shard lies in the index's directory
                assert os.path.dirname(path) == os.path.realpath(d), shard
            expected.update(load_file(path))
        got = load_file(out)
        assert sorted(got) == sorted(expected)
        for key, array in expected.items():
            assert _same_bits(got[key], array), key
