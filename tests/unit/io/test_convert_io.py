"""Formats, dtypes, sharding, wrapping, determinism and atomic commit."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.cli import ROOT, run_convert


def _rules(tmp, rules):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "test", "rules": rules}))
    return path


KEEP_ALL = [{"kind": "rename", "match": "(.*)", "to": r"\1"}]


def _bits(t):
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def test_bf16_round_trip(tmp):
    import paddle
    torch.manual_seed(0)
    state = {"w": torch.randn(5, 7).to(torch.bfloat16), "h": torch.randn(3).half(), "i": torch.arange(4),
             "b": torch.tensor([True, False])}
    torch.save(state, tmp / "m.pt")
    rules = _rules(tmp, KEEP_ALL)
    assert run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules).code == 0
    loaded = paddle.load(str(tmp / "o.pdparams"))
    assert loaded["w"].dtype == paddle.bfloat16
    assert np.array_equal(loaded["w"].cast("float32").numpy(), state["w"].float().numpy())
    assert loaded["h"].dtype == paddle.float16 and loaded["i"].dtype == paddle.int64 and loaded["b"].dtype == paddle.bool
    assert run_convert(tmp / "m.pt", tmp / "o.safetensors", "--mapping", rules).code == 0
    back = load_file(str(tmp / "o.safetensors"))
    for k, v in state.items():
        assert back[k].dtype == v.dtype
        assert np.array_equal(_bits(back[k]), _bits(v))


def test_dtype_cast_on_request(tmp):
    torch.manual_seed(0)
    state = {"w": torch.randn(6, 4), "steps": torch.tensor(3)}
    torch.save(state, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.safetensors", "--mapping", _rules(tmp, KEEP_ALL), "--dtype", "bf16")
    assert r.code == 0, r
    back = load_file(str(tmp / "o.safetensors"))
    assert back["w"].dtype == torch.bfloat16 and back["steps"].dtype == torch.int64
    assert torch.equal(back["w"], state["w"].to(torch.bfloat16))  # torch rounds to nearest even too


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "bool", "int32", "complex64"])
def test_dtype_refuses_what_is_not_a_floating_format(tmp, dtype):
    """--dtype int8 cast floats to integers without a word (0.7 to 0, NaN to INT64_MIN)."""
    save_file({"w": torch.tensor([0.7, float("nan")])}, str(tmp / "m.safetensors"))
    r = run_convert(tmp / "m.safetensors", tmp / "o.pdparams", "--mapping", _rules(tmp, KEEP_ALL), "--dtype", dtype)
    assert r.code == 2, r
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"--dtype '{dtype}'" in errors[0] and "float16" in errors[0], r
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_checkpoint(tmp, kind):
    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(3, 3) for i in range(4)}
    weight_map = {}
    for shard, keys in enumerate([["layer0.weight", "layer1.weight"], ["layer2.weight", "layer3.weight"]]):
        name = f"model-{shard + 1:05d}-of-00002.{kind}"
        part = {k: state[k] for k in keys}
        save_file(part, str(tmp / name)) if kind == "safetensors" else torch.save(part, tmp / name)
        weight_map.update({k: name for k in keys})
    index = tmp / ("model.safetensors.index.json" if kind == "safetensors" else "pytorch_model.bin.index.json")
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    rules = _rules(tmp, [{"kind": "rename", "match": r"layer(\d)\.weight", "to": r"blocks.\1.w"},
                         {"kind": "transpose", "match": r"layer\d\.weight"}])
    for src in (index, tmp):  # the index itself, or the directory holding it
        out = tmp / f"o-{src == tmp}.pdparams"
        r = run_convert(src, out, "--mapping", rules)
        assert r.code == 0, r
        from converter.io.pdparams import load_pdparams
        got = load_pdparams(str(out))
        assert list(got) == [f"blocks.{i}.w" for i in range(4)]
        for i in range(4):
            assert np.array_equal(got[f"blocks.{i}.w"], state[f"layer{i}.weight"].numpy().T)


def test_wrapped_checkpoint_is_unwrapped_with_a_note(tmp):
    torch.manual_seed(0)
    inner = {"module.fc.weight": torch.randn(2, 2)}
    torch.save({"state_dict": inner, "epoch": 3}, tmp / "m.pth")
    r = run_convert(tmp / "m.pth", tmp / "o.pdparams", "--mapping",
                    _rules(tmp, [{"kind": "rename", "key": "fc.weight", "to": "fc.weight"}]))
    assert r.code == 0, r
    assert "unwrapped the 'state_dict' entry (ignored: epoch)" in r.stderr
    assert "stripped the prefix 'module.'" in r.stderr


def test_output_is_byte_identical_across_runs(tmp):
    torch.manual_seed(0)
    torch.save({f"k{i}": torch.randn(8, 8) for i in range(5)}, tmp / "m.pt")
    rules = _rules(tmp, KEEP_ALL)
    for ext in ("pdparams", "safetensors"):
        assert run_convert(tmp / "m.pt", tmp / f"a.{ext}", "--mapping", rules).code == 0
        assert run_convert(tmp / "m.pt", tmp / f"b.{ext}", "--mapping", rules).code == 0
        assert (tmp / f"a.{ext}").read_bytes() == (tmp / f"b.{ext}").read_bytes()


@pytest.mark.slow


def test_kill_9_mid_write_leaves_nothing(tmp):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from converter.io.atomic import AtomicOutput
        with AtomicOutput({str(tmp / 'out.pdparams')!r}) as f:
            f.write(b"x" * (1 << 22))
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script])
    assert p.returncode == -signal.SIGKILL
    assert os.listdir(tmp) == []


def test_split_merge_reshape_cast_rules(tmp):
    torch.manual_seed(0)
    state = {"attn.qkv": torch.randn(6, 4), "a.w": torch.randn(2, 3), "b.w": torch.randn(2, 3),
             "conv.w": torch.randn(5, 4, 1, 1), "norm.w": torch.randn(4)}
    torch.save(state, tmp / "m.pt")
    rules = _rules(tmp, [
        {"kind": "split", "key": "attn.qkv", "to": ["q", "k", "v"], "axis": 0},
        {"kind": "transpose", "key": "attn.qkv"},
        {"kind": "merge", "match": [r"a\.w", r"b\.w"], "to": "ab", "axis": 1},
        {"kind": "rename", "key": "conv.w", "to": "fc.w"},
        {"kind": "reshape", "key": "conv.w", "shape": [5, 4]},
        {"kind": "transpose", "key": "conv.w"},
        {"kind": "rename", "key": "norm.w", "to": "norm.w"},
        {"kind": "cast", "key": "norm.w", "dtype": "float16"},
    ])
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 0, r
    from converter.io.pdparams import load_pdparams
    got = load_pdparams(str(tmp / "o.pdparams"))
    qkv = state["attn.qkv"].numpy()
    assert np.array_equal(got["q"], qkv[0:2].T) and np.array_equal(got["v"], qkv[4:6].T)
    assert np.array_equal(got["ab"], np.concatenate([state["a.w"].numpy(), state["b.w"].numpy()], axis=1))
    assert np.array_equal(got["fc.w"], state["conv.w"].numpy().reshape(5, 4).T)
    assert got["norm.w"].dtype == np.float16


def test_overlapping_rules_are_an_error_not_an_order(tmp):
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp / "m.pt")
    rules = _rules(tmp, [{"kind": "rename", "match": r"fc\..*", "to": "a"},
                         {"kind": "rename", "match": r".*\.weight", "to": "b"}])
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 2 and "matches 2 naming rules" in r.stderr and "rule 1" in r.stderr and "rule 2" in r.stderr


def test_reshape_must_be_declared_and_fit(tmp):
    torch.save({"w": torch.zeros(2, 3)}, tmp / "m.pt")
    rules = _rules(tmp, [{"kind": "rename", "key": "w", "to": "w"}, {"kind": "reshape", "key": "w", "shape": [4, 2]}])
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 2 and "cannot be reshaped to [4, 2]" in r.stderr


@pytest.mark.slow


def test_torch_zip_checkpoint_is_read_without_importing_torch(tmp):
    torch.manual_seed(0)
    base = torch.randn(6, 4)
    state = {"view.t": base.t(), "slice": base[2:5], "bf": torch.randn(3, 2).to(torch.bfloat16),
             "param": torch.nn.Parameter(torch.randn(5)), "shared": base, "ints": torch.arange(7)}
    torch.save(state, tmp / "m.bin")
    rules = _rules(tmp, KEEP_ALL)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        sys.path.insert(0, {ROOT!r})
        from converter.convert import convert
        convert({str(tmp / 'm.bin')!r}, {str(tmp / 'o.safetensors')!r}, mapping={str(rules)!r}, progress=False)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    back = load_file(str(tmp / "o.safetensors"))
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v.detach()), k


@pytest.mark.parametrize("path", ["computed", "copied"])
def test_a_tensor_written_wrong_fails_the_check_and_leaves_no_file(tmp, monkeypatch, path):
    """A wrong bit written by either path of the writer: a tensor computed (the plan's views of
    the source, laid out) or copied from the source file in the kernel (io/copyrange.py)."""
    import converter.convert
    from converter.io.sink import OutputFile
    from converter.rules.plan import TargetEntry
    torch.manual_seed(0)
    torch.save({"a": torch.randn(4, 4), "b": torch.randn(3)}, tmp / "m.pt")
    (tmp / "o.pdparams").write_bytes(b"previous")
    compute, copy_from = TargetEntry.compute, OutputFile.copy_from

    def corrupt(self, read):  # the writer's path only; the check recomputes from the source
        array = np.array(compute(self, read))
        if self.name == "b":
            array.view(np.uint32)[1] ^= 1
        return array

    def corrupt_copy(self, src, offset, count):  # the copy lands, then its second element has a bit flipped
        start = self.position
        copy_from(self, src, offset, count)
        if count == 12:  # 'b'
            word = bytearray(os.pread(src.fd, 4, offset + 4))
            word[0] ^= 1
            os.pwrite(self.fd, bytes(word), start + 4)
    if path == "computed":
        monkeypatch.setattr(converter.convert, "source_bytes", lambda entry, source: None)
        monkeypatch.setattr(TargetEntry, "compute", corrupt)
    else:
        monkeypatch.setattr(OutputFile, "copy_from", corrupt_copy)
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, KEEP_ALL), "--force")
    assert r.code == 1, r
    assert "'b': differs from source 'b' at index (1,)" in r.stderr
    assert (tmp / "o.pdparams").read_bytes() == b"previous"
    assert [p.name for p in tmp.iterdir() if ".partial" in p.name] == []


def test_one_flipped_bit_in_a_transposed_weight_fails_the_check(tmp, monkeypatch):
    """The check compares a transposed tensor band by band; a flip in the last, partial band
    (70 rows in bands of 16) is found and named by its index."""
    from converter.rules.plan import TargetEntry
    torch.manual_seed(0)
    torch.save({"w": torch.randn(70, 45)}, tmp / "m.pt")
    original = TargetEntry.compute

    def corrupt(self, read):
        array = np.ascontiguousarray(original(self, read))
        array.view(np.uint32)[44, 69] ^= 1
        return array
    monkeypatch.setattr(TargetEntry, "compute", corrupt)
    rules = _rules(tmp, KEEP_ALL + [{"kind": "transpose", "key": "w"}])
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 1, r
    assert "'w': differs from source 'w' at index (44, 69)" in r.stderr
    assert not (tmp / "o.pdparams").exists()


def test_bit_equal_is_bit_equality_in_either_layout():
    from converter.layout import bit_equal
    rng = np.random.default_rng(0)
    base = rng.standard_normal((100, 37)).astype(np.float32)
    base[3, 4], base[99, 36] = np.nan, 0.0
    turned = np.ascontiguousarray(base.T)
    assert bit_equal(turned, base.T) and bit_equal(base.T, turned) and bit_equal(base, base.copy())
    changes = {(0, 0): lambda bits: bits ^ 1,  # lowest mantissa bit
               (4, 3): lambda bits: bits ^ 2,  # another NaN payload
               (36, 99): lambda bits: bits | 0x80000000}  # 0.0 to -0.0, which compare equal as floats
    for index, change in changes.items():
        other = turned.copy()
        other.view(np.uint32)[index] = change(other.view(np.uint32)[index])
        assert not bit_equal(other, base.T) and not bit_equal(base.T, other), index
    assert not bit_equal(turned, base)  # shapes differ


def test_pipeline_keeps_order_and_bounds_the_bytes_in_flight():
    import threading
    from converter.pipeline import BoundedWorkers, prefetch
    sizes = [1, 50, 2, 90, 3, 3, 200, 1]
    live, peak, lock = [0], [0], threading.Lock()

    def make(n):
        with lock:
            live[0] += n
            peak[0] = max(peak[0], live[0])
        return n
    got = []
    for n in prefetch(make, sizes, lambda n: n, slack=100):
        got.append(n)
        with lock:
            live[0] -= n
    assert got == sizes
    assert peak[0] <= 200 + 100  # the item in hand plus at most the slack
    for workers in (1, 2):
        checker = BoundedWorkers(lambda n: n * 2, slack=100, workers=workers)
        for n in sizes:
            checker.submit(n, n)
            assert checker.held <= max(100, n)
        assert checker.close() == [n * 2 for n in sizes]


def test_a_checkpoint_torch_load_maps_is_read_from_its_storages_places(tmp):
    """Tensors torch.load memory-maps are read with pread from their storages' places in the zip:
    views, transposes, bf16, empty tensors and a shared storage come out as torch reads them."""
    import paddle
    torch.manual_seed(0)
    sd = {"a": torch.randn(64, 32), "b": torch.arange(10), "h": torch.randn(5, 3).to(torch.bfloat16),
          "t": torch.randn(8, 6).t(), "e": torch.empty(0, 3)}
    sd["v"] = sd["a"][3:7, 2:5]
    torch.save({"model": sd, "shape": torch.Size([2, 3])}, str(tmp / "m.pt"))  # torch.Size: torch.load reads it
    from converter.io.open import open_source
    with open_source(str(tmp / "m.pt")) as source:
        assert len(source._places) == 4  # a (and v), b, h, t; e has no bytes
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, KEEP_ALL))
    assert r.code == 0, r
    back = paddle.load(str(tmp / "o.pdparams"), return_numpy=True)
    for k, t in sd.items():
        expected = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        got = np.asarray(back[k]).view(np.uint16) if t.dtype == torch.bfloat16 else np.asarray(back[k])
        assert got.shape == expected.shape and np.array_equal(got, expected), k
