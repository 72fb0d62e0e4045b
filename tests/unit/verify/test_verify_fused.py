"""A paddle layer that computes what several torch layers compute: a fused q|k|v projection and
a fused gate|up MLP, their weights merged by a rule file. Each torch layer is judged against its
own slice of the fused output; the layout is no difference, a wrong slice is named at its torch
layer, and a bug after the fused layer at its own module, by both strategies."""

import json
import math

import numpy as np
import paddle
import pytest
import torch

from converter.spec import spec_from_functions
from converter.compare.align import align
from converter.compare.capture import Call
from converter.compare.fused import Slice, fused_slices, merged_modules, sliced
from converter.verify.run import verify
from converter.compare.session import Options

H, HEADS, KV_HEADS, FFN = 64, 4, 2, 96
HEAD = H // HEADS
KV = KV_HEADS * HEAD  # grouped-query attention: k and v narrower than q, so the slices differ in size
LAYERS = 2


class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = HEAD
        self.q_proj, self.k_proj, self.v_proj = torch.nn.Linear(H, H), torch.nn.Linear(H, KV), torch.nn.Linear(H, KV)
        self.o_proj = torch.nn.Linear(H, H)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, HEAD).transpose(1, 2)
        k, v = (p(x).view(b, t, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
                for p in (self.k_proj, self.v_proj))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD), -1) @ v
        return self.o_proj(a.transpose(1, 2).reshape(b, t, H))


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(H, FFN, bias=False), torch.nn.Linear(H, FFN, bias=False)
        self.down_proj, self.act = torch.nn.Linear(FFN, H, bias=False), torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = torch.nn.LayerNorm(H), TorchAttention(), torch.nn.LayerNorm(H), TorchMLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(LAYERS)])
        self.head = torch.nn.Linear(H, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def torch_model():
    torch.manual_seed(0)
    return TorchModel()


class FusedLinear(paddle.nn.Linear):
    """A Linear that sums its reduction in two halves (another order than torch's kernel: the
    budget is exercised, not bypassed by bit-identical results); `scale` multiplies its weight's
    columns and `keep` its bias, to plant a wrong slice."""

    def __init__(self, n_in, n_out, bias=True, scale=None, keep=None):
        super().__init__(n_in, n_out, bias_attr=None if bias else False)
        self.scale, self.keep = scale, keep

    def forward(self, x):
        w, b = self.weight, self.bias
        if self.scale is not None:
            w = w * paddle.to_tensor(self.scale)
        if self.keep is not None:
            b = b * paddle.to_tensor(self.keep)
        half = w.shape[0] // 2
        y = paddle.matmul(x[..., :half], w[:half]) + paddle.matmul(x[..., half:], w[half:])
        return y if b is None else y + b


class PaddleAttention(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        scale = np.r_[np.ones(H), np.full(KV, 1.05), np.ones(KV)].astype("float32") if bug == "k weight" else None
        keep = np.r_[np.ones(H + KV), np.zeros(KV)].astype("float32") if bug == "v bias" else None
        self.qkv = FusedLinear(H, H + 2 * KV, scale=scale, keep=keep)
        self.o_proj = paddle.nn.Linear(H, H)
        self.logit_scale = 1 / HEAD if bug == "scale" else 1 / math.sqrt(HEAD)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = paddle.split(self.qkv(x), [H, KV, KV], axis=-1)
        q = q.reshape([b, t, HEADS, HEAD]).transpose([0, 2, 1, 3])
        k, v = (y.reshape([b, t, KV_HEADS, HEAD]).transpose([0, 2, 1, 3]).repeat_interleave(HEADS // KV_HEADS, 1)
                for y in (k, v))
        a = paddle.nn.functional.softmax(paddle.matmul(q, k, transpose_y=True) * self.logit_scale, -1) @ v
        return self.o_proj(a.transpose([0, 2, 1, 3]).reshape([b, t, H]))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        self.gate_up = FusedLinear(H, 2 * FFN, bias=False)
        self.down_proj, self.act = paddle.nn.Linear(FFN, H, bias_attr=False), paddle.nn.Silu()
        self.swapped = bug == "gate and up swapped"

    def forward(self, x):
        gate, up = paddle.split(self.gate_up(x), 2, axis=-1)
        if self.swapped:
            gate, up = up, gate
        return self.down_proj(self.act(gate) * up)


class PaddleBlock(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        self.norm1, self.attn = paddle.nn.LayerNorm(H), PaddleAttention(bug)
        self.norm2, self.mlp = paddle.nn.LayerNorm(H), PaddleMLP(bug)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PaddleModel(paddle.nn.Layer):
    def __init__(self, bug=None, where=1):
        super().__init__()
        self.layers = paddle.nn.LayerList([PaddleBlock(bug if i == where else None) for i in range(LAYERS)])
        self.head = paddle.nn.Linear(H, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


RULES = {"name": "fused", "unmatched": "keep", "rules": [
    {"kind": "merge", "match": [r"(.*)\.attn\.q_proj\.(weight|bias)", r"(.*)\.attn\.k_proj\.(weight|bias)",
                                r"(.*)\.attn\.v_proj\.(weight|bias)"], "to": r"\1.attn.qkv.\2", "axis": -1},
    {"kind": "merge", "match": [r"(.*)\.mlp\.gate_proj\.weight", r"(.*)\.mlp\.up_proj\.weight"],
     "to": r"\1.mlp.gate_up.weight", "axis": 1},
    {"kind": "transpose", "match": r".*(?:proj|head)\.weight"},
]}


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 16, H)).astype(np.float32),)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("fused") / "fused.json"
    path.write_text(json.dumps(RULES))
    return str(path)


def _spec(rules, bug=None):
    return spec_from_functions(torch_model, lambda: PaddleModel(bug), inputs, mapping=rules, label=bug or "clean")


def _rows(report):
    return {r.torch: r for r in report.layers}


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.slow
def test_a_clean_fused_port_passes_with_each_torch_layer_judged_on_its_slice(rules, strategy):
    report = verify(_spec(rules), Options(device="cpu", strategy=strategy), bisect=True)
    assert report.verdict == "pass", [(r.torch, r.ratio, r.note) for r in report.layers if r.within_budget is False]
    assert report.outputs.within_budget
    rows = _rows(report)
    expected = {"layers.0.attn.q_proj": ("qkv", 0, H), "layers.0.attn.k_proj": ("qkv", H, H + KV),
                "layers.0.attn.v_proj": ("qkv", H + KV, H + 2 * KV), "layers.0.mlp.gate_proj": ("gate_up", 0, FFN),
                "layers.0.mlp.up_proj": ("gate_up", FFN, 2 * FFN)}
    if strategy == "full":  # binary judges unit boundaries only, when none is over budget
        for torch_path, (layer, start, stop) in expected.items():
            row = rows[torch_path]
            assert row.paddle.endswith("." + layer), row
            assert row.shape == (2, 16, stop - start)
            assert f"elements {start}:{stop}" in row.note
            # the two halves of the fused layer's sum are another order than torch's: a real error, judged
            assert row.local_max_abs > 0 and 0 < row.ratio < 0.8, (torch_path, row.ratio, row.local_max_abs)
        judged = [r.ratio for r in report.layers if r.ratio is not None]
        assert len(judged) == len(report.layers) and max(judged) < 0.8


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("bug, culprit, cause", [
    ("k weight", "layers.1.attn.k_proj", None),
    ("v bias", "layers.1.attn.v_proj", None),
    ("scale", "layers.1.attn", "attention logit scale"),
    # the planted bug is a flag the block keeps: re-running the block with it flipped reproduces torch
    ("gate and up swapped", "layers.1.mlp", "swapped=True; re-run on torch's recorded inputs with swapped=False"),
])
@pytest.mark.slow
def test_a_planted_bug_is_named_at_its_own_module(rules, strategy, bug, culprit, cause):
    report = verify(_spec(rules, bug), Options(device="cpu", strategy=strategy), bisect=True)
    assert report.verdict == "fail"
    assert report.first_bad.torch == culprit, [(r.torch, r.ratio) for r in report.layers if r.within_budget is False]
    assert report.first_bad.ratio > 10
    rows = _rows(report)
    if culprit.endswith("_proj"):  # the wrong slice alone: the fused layer's other slices are within budget
        siblings = [p for p in rows if p.startswith("layers.1.attn.") and p.endswith("_proj") and p != culprit
                    and rows[p].paddle == "layers.1.attn.qkv"]
        assert len(siblings) == 2 and all(rows[p].within_budget for p in siblings)
    else:  # every slice of the fused layers in the block is within budget: the bug is after them
        slices = [r for r in report.layers if r.torch.startswith("layers.1.") and "elements" in r.note]
        assert len(slices) == 5 and all(r.within_budget for r in slices)
    if cause:
        assert cause in " ".join(d.cause for d in report.diagnosis), report.diagnosis


@pytest.mark.slow


def test_a_converted_file_with_two_slices_exchanged_is_named_at_the_first_wrong_slice(rules, tmp_path):
    """A hand-made converter that merged q|v|k: the first slice that holds the wrong weights is
    named, the others are not blamed."""
    from converter.inmemory import convert_in_memory
    from converter.io.base import TensorInfo
    from converter.io.pdparams import write_pdparams
    state, _, _, _ = convert_in_memory(torch_model(), PaddleModel(), rules)
    for key in ("layers.0.attn.qkv.weight", "layers.0.attn.qkv.bias"):
        q, k, v = np.split(state[key], [H, H + KV], axis=-1)
        state[key] = np.concatenate([q, v, k], axis=-1)
    path = tmp_path / "qvk.pdparams"
    with open(path, "wb") as f:
        write_pdparams(f, [TensorInfo(k, "float32", v.shape) for k, v in state.items()], lambda info: state[info.name])
    for strategy in ("full", "binary"):
        report = verify(_spec(rules), Options(device="cpu", strategy=strategy), converted=str(path), bisect=True)
        assert report.first_bad is not None and report.first_bad.torch == "layers.0.attn.k_proj", strategy
        assert _rows(report)["layers.0.attn.q_proj"].within_budget
        causes = " ".join(d.cause for d in report.diagnosis)
        assert f"'layers.0.attn.qkv.weight' differs from torch's 'layers.0.attn.k_proj.weight' (its elements " \
               f"{H}:{H + KV} along axis 1)" in causes, causes


def _plan(rules):
    from converter.inmemory import convert_in_memory
    return convert_in_memory(torch_model(), PaddleModel(), rules)[1]


def test_the_plan_tells_which_torch_modules_a_paddle_layer_fuses_and_in_which_order(rules):
    fused = merged_modules(_plan(rules))
    assert fused == {f"layers.{i}.{layer}": tuple(f"layers.{i}.{m}" for m in modules) for i in range(LAYERS)
                     for layer, modules in (("attn.qkv", ("attn.q_proj", "attn.k_proj", "attn.v_proj")),
                                            ("mlp.gate_up", ("mlp.gate_proj", "mlp.up_proj")))}


def _call(path, shape, end, x=None):
    return Call(path, "Linear", end, end, args=() if x is None else (x,), shapes=[shape])


def test_slices_follow_the_plan_order_and_need_the_same_input(rules):
    plan = _plan(rules)
    x = torch.ones(2, 16, H)
    t_calls = {f"layers.0.attn.{m}_proj": _call(f"layers.0.attn.{m}_proj", (2, 16, n), i, x)
               for i, (m, n) in enumerate((("q", H), ("k", KV), ("v", KV)))}
    p_calls = {"layers.0.attn.qkv": _call("layers.0.attn.qkv", (2, 16, H + 2 * KV), 0)}
    found = fused_slices(t_calls, p_calls, plan)
    assert {t: (p, s.axis, s.start, s.stop) for t, (p, s) in found.items()} == {
        "layers.0.attn.q_proj": ("layers.0.attn.qkv", -1, 0, H),
        "layers.0.attn.k_proj": ("layers.0.attn.qkv", -1, H, H + KV),
        "layers.0.attn.v_proj": ("layers.0.attn.qkv", -1, H + KV, H + 2 * KV)}
    pairs = align(t_calls, p_calls, plan)
    assert [(p.torch, p.paddle, p.part.start) for p in pairs] == [
        ("layers.0.attn.q_proj", "layers.0.attn.qkv", 0), ("layers.0.attn.k_proj", "layers.0.attn.qkv", H),
        ("layers.0.attn.v_proj", "layers.0.attn.qkv", H + KV)]
    # k and v computed on another input than q (cross-attention): no fused layer computes that
    t_calls["layers.0.attn.k_proj"] = _call("layers.0.attn.k_proj", (2, 16, KV), 1, torch.zeros(2, 16, H))
    assert fused_slices(t_calls, p_calls, plan) == {}
    # outputs that are not side by side (a paddle layer of another width): not sliced
    t_calls["layers.0.attn.k_proj"] = _call("layers.0.attn.k_proj", (2, 16, KV), 1, x)
    p_calls["layers.0.attn.qkv"] = _call("layers.0.attn.qkv", (2, 16, H + KV), 0)
    assert fused_slices(t_calls, p_calls, plan) == {}
    # nor paired with q_proj alone, whose weights are only part of its own: it is judged within its parent
    assert [p for p in align(t_calls, p_calls, plan) if p.paddle == "layers.0.attn.qkv"] == []


def test_a_fused_layer_that_returns_one_output_per_module_pairs_them_in_order(rules):
    plan = _plan(rules)
    x = torch.ones(2, 16, H)
    t_calls = {f"layers.0.attn.{m}_proj": _call(f"layers.0.attn.{m}_proj", (2, 16, n), i, x)
               for i, (m, n) in enumerate((("q", H), ("k", KV), ("v", KV)))}
    p_calls = {"layers.0.attn.qkv": Call("layers.0.attn.qkv", "Linear", 0, 0, shapes=[(2, 16, H), (2, 16, KV), (2, 16, KV)])}
    pairs = align(t_calls, p_calls, plan)
    assert [(p.torch, p.part.output) for p in pairs] == [
        ("layers.0.attn.q_proj", 0), ("layers.0.attn.k_proj", 1), ("layers.0.attn.v_proj", 2)]
    outputs = [np.zeros((2, 16, H)), np.ones((2, 16, KV)), np.full((2, 16, KV), 2.0)]
    assert [sliced(p, outputs)[0][0, 0, 0] for p in pairs] == [0.0, 1.0, 2.0]
    assert "output 1 of paddle's fused layer" in pairs[1].part.note


def test_a_slice_takes_its_part_of_paddle_tensors_and_numpy_arrays_alike():
    a = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    s = Slice(-2, 2, 5, ("a", "b"))
    assert np.array_equal(s.of([a])[0], a[:, 2:5, :])
    assert np.array_equal(s.of([paddle.to_tensor(a)])[0].numpy(), a[:, 2:5, :])
    assert sliced(type("P", (), {"part": None})(), [a]) == [a]


class _TorchTopLevel(torch.nn.Module):  # the fused modules are themselves the binary search's units
    def __init__(self):
        super().__init__()
        self.q, self.k, self.o = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.o(torch.cat([self.q(x), self.k(x)], -1))


class _PaddleTopLevel(paddle.nn.Layer):
    def __init__(self, k_scale=1.0):
        super().__init__()
        self.qk, self.o = FusedLinear(8, 16, scale=np.r_[np.ones(8), np.full(8, k_scale)].astype("float32")), \
            paddle.nn.Linear(16, 4)

    def forward(self, x):
        return self.o(self.qk(x))


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_wrong_slice_of_a_fused_layer_that_is_a_search_unit_is_named_by_both_strategies(tmp_path, strategy):
    rules = tmp_path / "qk.json"
    rules.write_text(json.dumps({"name": "qk", "rules": [
        {"kind": "merge", "match": [r"q\.(weight|bias)", r"k\.(weight|bias)"], "to": r"qk.\1", "axis": -1},
        {"kind": "rename", "match": r"o\.(weight|bias)", "to": r"o.\1"},
        {"kind": "transpose", "match": r"[qko]\.weight"}]}))

    def torch_model():
        torch.manual_seed(0)
        return _TorchTopLevel()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    for k_scale, culprit in ((1.0, None), (1.1, "k")):
        spec = spec_from_functions(torch_model, lambda s=k_scale: _PaddleTopLevel(s), lambda: (x,), mapping=str(rules))
        report = verify(spec, Options(device="cpu", strategy=strategy), bisect=True)
        assert (None if report.first_bad is None else report.first_bad.torch) == culprit, report.first_bad
