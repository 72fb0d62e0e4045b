"""The .pdparams reader (verify-port --converted, a .pdparams SRC): every protocol paddle.save
writes is read, without running code; object, string and structured arrays never come out."""

import json
import pickle
import struct

import numpy as np
import pytest

from helpers.cli import run_convert
from helpers.hostile_forge import assert_one_line_error, run_bounded


def _paddle_state():
    import paddle
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 4)
    state = dict(layer.state_dict())
    state["steps"] = paddle.to_tensor(np.arange(5, dtype=np.int64))
    state["mask"] = paddle.to_tensor(np.array([True, False]))
    state["half"] = paddle.to_tensor(np.arange(3, dtype=np.float16))
    state["double"] = paddle.to_tensor(np.arange(3, dtype=np.float64))
    state["bf"] = paddle.to_tensor(np.arange(4, dtype=np.float32)).cast("bfloat16")
    return state


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_every_protocol_paddle_save_writes_is_read(tmp, protocol):
    import paddle
    from converter.io.pdparams import load_pdparams
    path = str(tmp / f"p{protocol}.pdparams")
    paddle.save(_paddle_state(), path, protocol=protocol)
    got = load_pdparams(path)
    expected = paddle.load(path, return_numpy=True)
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v), k


def test_a_pdparams_source_converts_bit_exact(tmp):
    import paddle
    path = tmp / "p2.pdparams"
    paddle.save(_paddle_state(), str(path), protocol=2)
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}))
    r = run_convert(path, tmp / "o.pdparams", "--mapping", tmp / "rules.json")
    assert r.code == 0, r
    back, source = paddle.load(str(tmp / "o.pdparams"), return_numpy=True), paddle.load(str(path), return_numpy=True)
    assert sorted(back) == sorted(source)
    for k in source:
        assert back[k].dtype == source[k].dtype and np.array_equal(back[k], source[k]), k


def test_arrays_paddle_split_with_protocol_2_are_joined(tmp):
    """paddle.save(protocol=2 or 3) splits arrays of 1 GiB or more into slices; the layout is
    written here by hand at a small size, and read back by paddle.load and by our reader."""
    import paddle
    from converter.io.pdparams import load_pdparams
    full = np.arange(12, dtype=np.float32).reshape(3, 4)
    flat = full.reshape(-1)
    obj = {"w@@.0": flat[:5], "w@@.1": flat[5:], "b": np.ones(2, np.float32),
           "UnpackBigParamInfor@@": {"w": {"OriginShape": (3, 4), "slices": ["w@@.0", "w@@.1"]}}}
    (tmp / "big.pdparams").write_bytes(pickle.dumps(obj, protocol=2))
    got = load_pdparams(str(tmp / "big.pdparams"))
    expected = paddle.load(str(tmp / "big.pdparams"), return_numpy=True)
    assert sorted(got) == sorted(expected) == ["b", "w"]
    assert np.array_equal(got["w"], expected["w"]) and np.array_equal(got["w"], full)


def _array_pickle(dtype_code: str, order: str, raw: bytes, shape, fortran: bytes = b"\x89") -> bytes:
    """numpy's own opcodes for an array, with the dtype and raw bytes chosen by the caller."""
    def s(text):
        return b"X" + struct.pack("<I", len(text)) + text.encode()
    dtype = b"cnumpy\ndtype\n" + s(dtype_code) + b"\x89\x88\x87R" + b"(K\x03" + s(order) + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    head = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R"
    state = b"(K\x01" + b"".join(b"K" + bytes([d]) for d in shape) + {1: b"\x85", 2: b"\x86"}[len(shape)] + dtype + fortran
    state += b"B" + struct.pack("<I", len(raw)) + raw + b"tb"
    return b"\x80\x03}" + s("w") + head + state + b"s."


@pytest.mark.parametrize("code,order,raw,shape,why", [
    ("O8", "|", b"\x41" * 16, (2,), "object pointers chosen by the file"),
    ("U3", "<", b"a\0\0\0b\0\0\0c\0\0\0", (1,), "a string array"),
    ("S4", "|", b"abcd", (1,), "a bytes array"),
    ("V4", "|", b"abcd", (1,), "a structured array"),
    ("f4", ">", b"\0\0\x80\x3f", (1,), "a big-endian array"),
    ("f4", "<", b"\0\0\x80\x3f", (2,), "fewer bytes than its shape needs"),
])
def test_arrays_that_are_not_plain_numbers_are_refused(tmp, code, order, raw, shape, why):
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    path = tmp / "bad.pdparams"
    path.write_bytes(_array_pickle(code, order, raw, shape))
    with pytest.raises(UserError, match="refusing to read"):
        load_pdparams(str(path))


@pytest.mark.parametrize("flag", [b"\x88", b"K\x01", b"K\x02", b"\x89", b"K\x00"])
def test_a_fortran_ordered_array_is_read_as_numpy_reads_it(tmp, flag):
    """numpy takes the Fortran-order flag as an integer: 1 means Fortran order as True does (it
    was written transposed); the output must hold what numpy and paddle.load read."""
    import paddle
    raw = np.arange(6, dtype=np.float32).tobytes()
    src = tmp / "f.pdparams"
    src.write_bytes(_array_pickle("f4", "<", raw, (2, 3), flag))
    expected = pickle.loads(src.read_bytes())["w"]
    assert np.array_equal(paddle.load(str(src), return_numpy=True)["w"], expected)
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": [{"kind": "rename", "key": "w", "to": "w"}]}))
    for out in ("o.pdparams", "o.safetensors"):
        r = run_convert(src, tmp / out, "--mapping", tmp / "rules.json")
        assert r.code == 0, r
    assert np.array_equal(paddle.load(str(tmp / "o.pdparams"), return_numpy=True)["w"], expected)
    from safetensors.numpy import load_file
    assert np.array_equal(load_file(str(tmp / "o.safetensors"))["w"], expected)
    assert expected[1, 0] == (1.0 if flag in (b"\x88", b"K\x01", b"K\x02") else 3.0)


def test_a_fortran_flag_that_is_not_an_integer_is_refused(tmp):
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    path = tmp / "f.pdparams"
    path.write_bytes(_array_pickle("f4", "<", np.zeros(6, np.float32).tobytes(), (2, 3), b"G?\xf0\x00\x00\x00\x00\x00\x00"))
    with pytest.raises(UserError, match="Fortran-order flag"):
        load_pdparams(str(path))
    with pytest.raises(TypeError):  # numpy refuses it too
        pickle.loads(path.read_bytes())


def test_a_plain_array_crafted_the_same_way_is_read(tmp):
    from converter.io.pdparams import load_pdparams
    (tmp / "ok.pdparams").write_bytes(_array_pickle("f4", "<", struct.pack("<2f", 1.5, -2.0), (2,)))
    got = load_pdparams(str(tmp / "ok.pdparams"))
    assert np.array_equal(got["w"], np.array([1.5, -2.0], np.float32))
    assert np.array_equal(got["w"], pickle.loads((tmp / "ok.pdparams").read_bytes())["w"])


@pytest.mark.slow


def test_a_hash_bomb_key_in_a_pdparams_is_refused_in_bounded_time(tmp):
    key = b")q\x000" + b"h\x00h\x00\x86q\x000" * 120 + b"h\x00"
    (tmp / "bomb.pdparams").write_bytes(b"\x80\x04}" + key + b"N" + b"s.")
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": [{"kind": "drop", "match": ".*"}]}))
    r = run_bounded(tmp / "bomb.pdparams", tmp / "o.pdparams", "--mapping", tmp / "rules.json", timeout=30)
    assert_one_line_error(r, "bomb.pdparams", "tuple")


@pytest.mark.slow


def test_a_huge_memo_index_allocates_nothing(tmp):
    """LONG_BINPUT 2**32 - 16: Python's unpickler sizes its memo table by the index."""
    body = b"\x80\x02}r\xf0\xff\xff\xff."
    (tmp / "memo.pdparams").write_bytes(body)
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": [{"kind": "drop", "match": ".*"}]}))
    r = run_bounded(tmp / "memo.pdparams", tmp / "o.pdparams", "--mapping", tmp / "rules.json", timeout=30, memory_gb=2)
    assert r.code in (0, 2) and "internal error" not in r.stderr and "out of memory" not in r.stderr, r


@pytest.mark.parametrize("body", [b"\x80\x04K\x01.", b"\x80\x04]\x94.", b"", b"\x80\x04}", b"garbage"])
def test_files_that_are_not_a_dict_of_arrays(tmp, body):
    (tmp / "x.pdparams").write_bytes(body)
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": [{"kind": "drop", "match": ".*"}]}))
    r = run_convert(tmp / "x.pdparams", tmp / "o.pdparams", "--mapping", tmp / "rules.json")
    assert_one_line_error(r, "x.pdparams")


@pytest.mark.parametrize("code,order,raw", [("O8", "|", b"\x41" * 16), ("U2", "<", b"a\0\0\0b\0\0\0"), ("V8", "|", b"x" * 16)])
def test_verify_port_converted_with_an_object_string_or_structured_array(tmp, code, order, raw):
    from helpers.cli import run_verify, spec_path
    path = tmp / "bad.pdparams"
    path.write_bytes(_array_pickle(code, order, raw, (2,) if code != "U2" else (1,)))
    r = run_verify("--spec", spec_path("cnn"), "--converted", path)
    assert_one_line_error(r, "bad.pdparams", "refusing to read")


@pytest.mark.parametrize("info", [{"w": {"OriginShape": (3, 4), "slices": ["w@@.0", "w@@.0"]}},
                                  {"w": {"OriginShape": (True, -1), "slices": ["w@@.0"]}},
                                  {"w": {"OriginShape": (2, 2), "slices": ["w@@.0"]}}, {"w": "x"}, 3])
def test_a_broken_split_array_table(tmp, info):
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    obj = {"w@@.0": np.arange(6, dtype=np.float32), "UnpackBigParamInfor@@": info}
    (tmp / "big.pdparams").write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(UserError, match="refusing to read"):
        load_pdparams(str(tmp / "big.pdparams"))


ODD_DTYPES = {"str": "U3", "bytes": "S3", "structured": [("a", "f4"), ("b", "i8")], "object": object,
              "complex": np.complex64}


@pytest.mark.parametrize("kind", sorted(ODD_DTYPES))
def test_arrays_numpy_itself_pickled_that_are_not_plain_numbers(tmp, kind):
    """A state dict that fits the model but for one array of another dtype, pickled by numpy
    itself (as paddle.save writes it): the reader refuses it, and verify-port --converted says so
    in one line (it ended in an internal error)."""
    from helpers.cli import run_verify, spec_path
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    from converter.spec import load_spec
    state = {k: v.numpy() for k, v in load_spec(spec_path("cnn")).paddle_model().state_dict().items()}
    first = next(iter(state))
    state[first] = np.zeros(state[first].shape, dtype=ODD_DTYPES[kind])
    path = tmp / f"{kind}.pdparams"
    path.write_bytes(pickle.dumps(state, protocol=4))
    with pytest.raises(UserError, match="refusing to read"):
        load_pdparams(str(path))
    r = run_verify("--spec", spec_path("cnn"), "--converted", path)
    assert_one_line_error(r, f"{kind}.pdparams", "refusing to read")
