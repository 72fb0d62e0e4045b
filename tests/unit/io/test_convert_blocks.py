"""Large tensors are laid out, written and checked slab by slab of rows (converter.layout). These
tests make the slabs tiny, so that every tensor here is cut into many, and hold the result to
numpy's own C-ordered copies."""

import json

import numpy as np
import pytest
import torch

from helpers.cli import run_convert
from converter import layout
from converter.io.base import TensorInfo


def _arrays():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 1 << 16, size=(70, 45), dtype=np.uint16)
    wide = rng.standard_normal((3, 4000)).astype(np.float32)
    return {
        "transposed bf16 bits": base.T,
        "transposed bf16 bits, rows of whole words": rng.integers(0, 1 << 16, size=(96, 40), dtype=np.uint16).T,
        "transposed bytes, rows of whole words": rng.integers(0, 256, size=(64, 80), dtype=np.uint8).T,
        "transposed float64": rng.standard_normal((50, 33)).T,
        "transposed bool": (base % 3 == 0).T,
        "a slab of a transposed matrix": base.T[5:30],
        "permuted 3-D": rng.standard_normal((6, 7, 8)).astype(np.float32).transpose(2, 0, 1),
        "C-ordered": base,
        "a row larger than a block": wide.T.T[:, ::-1],
        "1-D": rng.standard_normal(1000).astype(np.float32),
        "0-d": np.array(3.5, dtype=np.float32),
        "no elements": np.zeros((0, 9), dtype=np.float32).T,
    }


@pytest.mark.parametrize("nbytes", [64, 1000, 4096, 1 << 20])
def test_blocks_are_the_c_ordered_bytes_of_each_tensor(nbytes):
    arrays = _arrays()
    infos = [TensorInfo(name, "float32", a.shape) for name, a in arrays.items()]
    got = {name: [] for name in arrays}
    lasts = []
    for info, block, last in layout.c_order_blocks(infos, lambda info: arrays[info.name], nbytes):
        assert block.flags.c_contiguous and block.dtype == arrays[info.name].dtype
        got[info.name].append(block.tobytes())  # the block's memory is reused once the next is asked for
        lasts.append((info.name, last))
    for name, a in arrays.items():
        assert b"".join(got[name]) == np.ascontiguousarray(a).tobytes(), name
    assert [name for name, last in lasts if last] == list(arrays)  # one last block per tensor, in order
    if nbytes == 64:
        assert len(got["transposed bf16 bits"]) == 45  # a row (140 bytes) per block


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.uint16, np.float32, np.float64])
def test_transposes_match_numpy(dtype):
    """Every path of layout.contiguous (bands of elements, 16-byte words for elements of up to 4
    bytes, numpy's own copy for small or other layouts) against numpy's C-ordered copy."""
    rng = np.random.default_rng(1)
    for shape in [(96, 40), (64, 48), (70, 45), (33, 8), (8, 200), (200, 1)]:
        base = rng.integers(0, 200, size=shape).astype(dtype)
        for view in (base.T, base.T[4:12], base.T[:, ::2], base[:, 1:].T):
            assert layout.contiguous(view).tobytes() == np.ascontiguousarray(view).tobytes(), (shape, view.strides)


def test_bit_equal_finds_a_flip_at_every_window_and_band_edge(monkeypatch):
    """The check lays a transposed tensor out a window of rows at a time, in bands: here windows of
    3 rows and bands of 16, and a flipped bit at each edge of either is found."""
    monkeypatch.setattr(layout, "COMPARE_WINDOW", 64)
    monkeypatch.setattr(layout, "COMPARE_ROWS", 3)
    base = np.random.default_rng(2).integers(0, 1 << 16, size=(35, 10), dtype=np.uint16)
    plain = np.ascontiguousarray(base.T)
    assert layout.bit_equal(plain, base.T) and layout.bit_equal(base.T, plain)
    for row in (0, 2, 3, 5, 6, 9):
        for column in (0, 15, 16, 31, 32, 34):
            other = plain.copy()
            other[row, column] ^= 0x8000
            assert not layout.bit_equal(other, base.T) and not layout.bit_equal(base.T, other), (row, column)


@pytest.mark.parametrize("dtype,columns", [(np.uint16, 24), (np.uint32, 12), (np.uint8, 48)])
def test_bit_equal_in_words_finds_a_flip_at_every_window_word_and_band_edge(monkeypatch, dtype, columns):
    """Where 16-byte words tile the rows, the check moves words: windows of one word's rows (16
    bytes of each column), bands of 16 rows; a flipped bit at each edge of any of them is found."""
    monkeypatch.setattr(layout, "COMPARE_WINDOW", 64)
    monkeypatch.setattr(layout, "COMPARE_ROWS", 3)
    base = np.random.default_rng(3).integers(0, 200, size=(35, columns)).astype(dtype)
    assert layout.words_fit(base)
    plain = np.ascontiguousarray(base.T)
    k = 16 // plain.itemsize
    assert layout.bit_equal(plain, base.T) and layout.bit_equal(base.T, plain)
    for row in sorted({0, k - 1, k, 2 * k - 1, columns - 1}):
        for column in (0, 15, 16, 31, 32, 34):
            other = plain.copy()
            other[row, column] ^= 1 << (8 * plain.itemsize - 1)
            assert not layout.bit_equal(other, base.T) and not layout.bit_equal(base.T, other), (row, column)


def test_bit_equal_on_a_slab_of_a_transposed_matrix():
    base = np.arange(70 * 45, dtype=np.uint32).reshape(70, 45)
    slab = base.T[10:20]
    copy = np.ascontiguousarray(slab)
    assert layout.bit_equal(copy, slab) and layout.bit_equal(slab, copy)
    copy[9, 69] ^= 1
    assert not layout.bit_equal(copy, slab) and not layout.bit_equal(slab, copy)


def _rules(tmp, rules):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "t", "unmatched": "keep", "rules": rules}))
    return path


def _state():
    torch.manual_seed(0)
    return {"w": torch.randn(300, 70), "fused": torch.randn(90, 40), "a": torch.randn(20, 30), "b": torch.randn(25, 30),
            "c": torch.randn(12, 9), "d": torch.randn(12, 14), "h": torch.randn(50, 60).to(torch.bfloat16),
            "mask": torch.rand(40, 30) > 0.5, "step": torch.tensor(7), "empty": torch.zeros(0, 5)}


RULES = [{"kind": "transpose", "key": "w"}, {"kind": "transpose", "key": "h"}, {"kind": "transpose", "key": "mask"},
         {"kind": "split", "key": "fused", "to": ["q", "k", "v"], "axis": 0},
         {"kind": "transpose", "match": "fused"},
         {"kind": "merge", "match": ["a", "b"], "to": "ab", "axis": 0},
         {"kind": "merge", "match": ["c", "d"], "to": "cd", "axis": 1}]


def _numpy(state):
    """bf16 as its uint16 bits, as the engine and .pdparams hold it."""
    return {k: v.numpy() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy().view(np.uint16)
            for k, v in state.items()}


def _expected(state):
    n = _numpy(state)
    fused = n["fused"]
    return {"w": n["w"].T, "h": n["h"].T, "mask": n["mask"].T, "q": fused[:30].T, "k": fused[30:60].T,
            "v": fused[60:].T, "ab": np.concatenate([n["a"], n["b"]]), "cd": np.concatenate([n["c"], n["d"]], axis=1),
            "step": n["step"], "empty": n["empty"]}


@pytest.mark.parametrize("suffix", [".pdparams", ".safetensors"])
def test_a_conversion_in_tiny_blocks_is_bit_exact(tmp, monkeypatch, suffix):
    from converter import convert
    monkeypatch.setattr(layout, "BLOCK", 256)
    monkeypatch.setattr(convert, "CHECK_WINDOW", 300)
    state = _state()
    torch.save(state, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / f"o{suffix}", "--mapping", _rules(tmp, RULES))
    assert r.code == 0, r
    if suffix == ".pdparams":
        from converter.io.pdparams import load_pdparams
        out = load_pdparams(str(tmp / "o.pdparams"))
    else:
        from safetensors.torch import load_file
        out = _numpy(load_file(str(tmp / "o.safetensors")))
    expected = _expected(state)
    assert sorted(out) == sorted(expected)
    for name, a in expected.items():
        assert out[name].shape == a.shape and out[name].tobytes() == np.ascontiguousarray(a).tobytes(), name


def test_a_flipped_bit_in_a_middle_block_fails_the_check(tmp, monkeypatch):
    """The check reads the file back and compares it with the source's views, not with the blocks
    the writer laid out: a block laid out wrong is found."""
    monkeypatch.setattr(layout, "BLOCK", 256)
    original = layout.contiguous
    calls = [0]

    def corrupt(a, *rest):
        result = original(a, *rest)
        calls[0] += 1
        if calls[0] == 5 and result.size:
            result = np.array(result)
            result.view(np.uint32).reshape(-1)[0] ^= 1
        return result
    monkeypatch.setattr(layout, "contiguous", corrupt)
    torch.save({"w": torch.randn(300, 70)}, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, [{"kind": "transpose", "key": "w"}]))
    assert r.code == 1, r
    assert "'w': differs from source 'w' at index (" in r.stderr
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("name, index", [("w", (40, 150)), ("ab", (19, 29)), ("ab", (20, 0)), ("ab", (44, 3)),
                                         ("cd", (5, 11)), ("cd", (11, 0)), ("h", (59, 49))])
def test_the_check_names_the_flipped_element_in_any_window(tmp, monkeypatch, name, index):
    """The file is read back 400 bytes of rows at a time (3 rows of 'ab', so that rows 18 to 20
    straddle its two parts): a flipped bit is found in whichever window and merged part it
    falls, and named by its index in the whole tensor."""
    from converter import convert
    from converter.rules.plan import TargetEntry
    monkeypatch.setattr(convert, "CHECK_WINDOW", 400)
    original = TargetEntry.compute

    def corrupt(self, read):
        array = np.ascontiguousarray(original(self, read))
        if self.name == name:
            array = array.copy()
            array.view(f"u{array.itemsize}")[index] ^= 1
        return array
    monkeypatch.setattr(TargetEntry, "compute", corrupt)
    torch.save(_state(), tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, RULES))
    assert r.code == 1, r
    assert f"'{name}': differs from source " in r.stderr and f"at index {index}" in r.stderr, r.stderr
    assert not (tmp / "o.pdparams").exists()
