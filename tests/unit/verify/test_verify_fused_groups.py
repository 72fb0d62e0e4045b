"""A paddle layer fusing q|k|v interleaved per key/value group (PaddleFormers' `qkv_proj`: per KV
group, that group's query heads, then its key head, then its value head), its weights merged by
groups: each torch projection is judged on its own positions of the fused output, gathered in
its own order, against its own budget; the layout is no difference, and a wrong key head inside
the fused layer is named at k_proj by both strategies."""

import json
import math

import numpy as np
import paddle
import pytest
import torch

from converter.compare.align import align
from converter.compare.capture import Call
from converter.compare.fused import Slice, fused_slices, merge_layouts, sliced
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

H, HEADS, KV_HEADS, FFN = 32, 4, 2, 48
HEAD = H // HEADS
GROUP = HEADS // KV_HEADS  # query heads per key/value head
BLOCK = (GROUP + 2) * HEAD  # one group's q heads, k head and v head on the fused output axis


class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(H, H)
        self.k_proj, self.v_proj = torch.nn.Linear(H, KV_HEADS * HEAD), torch.nn.Linear(H, KV_HEADS * HEAD)
        self.o_proj = torch.nn.Linear(H, H, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, HEAD).transpose(1, 2)
        k, v = (p(x).view(b, t, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(GROUP, 1)
                for p in (self.k_proj, self.v_proj))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD), -1) @ v
        return self.o_proj(a.transpose(1, 2).reshape(b, t, H))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.attn = torch.nn.LayerNorm(H), TorchAttention()
        self.gate_proj, self.up_proj = torch.nn.Linear(H, FFN, bias=False), torch.nn.Linear(H, FFN, bias=False)
        self.down_proj = torch.nn.Linear(FFN, H, bias=False)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class PaddleAttention(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.qkv_proj = paddle.nn.Linear(H, KV_HEADS * BLOCK)
        self.o_proj = paddle.nn.Linear(H, H, bias_attr=False)

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv_proj(x).reshape([b, t, KV_HEADS, GROUP + 2, HEAD])
        q = qkv[:, :, :, :GROUP].reshape([b, t, HEADS, HEAD]).transpose([0, 2, 1, 3])
        k, v = (qkv[:, :, :, i].transpose([0, 2, 1, 3]).repeat_interleave(GROUP, 1) for i in (GROUP, GROUP + 1))
        a = paddle.nn.functional.softmax(paddle.matmul(q, k, transpose_y=True) / math.sqrt(HEAD), -1) @ v
        return self.o_proj(a.transpose([0, 2, 1, 3]).reshape([b, t, H]))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.norm, self.attn = paddle.nn.LayerNorm(H), PaddleAttention()
        self.up_gate_proj = paddle.nn.Linear(H, 2 * FFN, bias_attr=False)
        self.down_proj = paddle.nn.Linear(FFN, H, bias_attr=False)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        gate, up = paddle.split(self.up_gate_proj(x), 2, axis=-1)
        return x + self.down_proj(paddle.nn.functional.silu(gate) * up)


class PaddleModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.layers = paddle.nn.LayerList([PaddleBlock() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


RULES = {"name": "grouped", "unmatched": "keep", "rules": [
    {"kind": "merge", "match": [r"(.*)\.q_proj\.(weight|bias)", r"(.*)\.k_proj\.(weight|bias)", r"(.*)\.v_proj\.(weight|bias)"],
     "to": r"\1.qkv_proj.\2", "axis": -1, "groups": KV_HEADS},
    {"kind": "merge", "match": [r"(.*)\.gate_proj\.weight", r"(.*)\.up_proj\.weight"], "to": r"\1.up_gate_proj.weight",
     "axis": 1},
    {"kind": "transpose", "match": r".*_proj\.weight"},
]}


def torch_model():
    torch.manual_seed(0)
    return TorchModel()


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 6, H)).astype(np.float32),)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("grouped") / "grouped.json"
    path.write_text(json.dumps(RULES))
    return str(path)


def _plan(rules):
    from converter.inmemory import convert_in_memory
    return convert_in_memory(torch_model(), PaddleModel(), rules)


def _q_k_v_runs():
    """Each projection's positions in the fused output, worked out from the layout by hand."""
    q = tuple((g * BLOCK, g * BLOCK + GROUP * HEAD) for g in range(KV_HEADS))
    k = tuple((g * BLOCK + GROUP * HEAD, g * BLOCK + (GROUP + 1) * HEAD) for g in range(KV_HEADS))
    v = tuple((g * BLOCK + (GROUP + 1) * HEAD, (g + 1) * BLOCK) for g in range(KV_HEADS))
    return q, k, v


def test_a_merge_by_groups_pairs_each_projection_with_its_runs_of_the_fused_output(rules):
    plan = _plan(rules)[1]
    layouts = merge_layouts(plan)
    assert [m.rpartition(".")[2] for m, _, _ in layouts["layers.0.attn.qkv_proj"]] == ["q_proj", "k_proj", "v_proj"] * 2
    x = torch.ones(2, 6, H)
    t_calls = {f"layers.0.attn.{m}_proj": Call(f"layers.0.attn.{m}_proj", "Linear", i, i, args=(x,), shapes=[(2, 6, n)])
               for i, (m, n) in enumerate((("q", H), ("k", KV_HEADS * HEAD), ("v", KV_HEADS * HEAD)))}
    p_calls = {"layers.0.attn.qkv_proj": Call("layers.0.attn.qkv_proj", "Linear", 0, 0, shapes=[(2, 6, KV_HEADS * BLOCK)])}
    found = fused_slices(t_calls, p_calls, plan)
    assert {t: s.spans for t, (_, s) in found.items()} == dict(zip(t_calls, _q_k_v_runs()))
    assert "elements 0:16, 32:48" in found["layers.0.attn.q_proj"][1].note and "in 2 groups" in found[
        "layers.0.attn.q_proj"][1].note
    assert [(p.torch, p.paddle) for p in align(t_calls, p_calls, plan)] == [(t, "layers.0.attn.qkv_proj") for t in t_calls]
    # an output one head narrower than the layout: the runs cannot be placed, nothing is paired by them
    p_calls["layers.0.attn.qkv_proj"] = Call("layers.0.attn.qkv_proj", "Linear", 0, 0, shapes=[(2, 6, KV_HEADS * BLOCK - HEAD)])
    assert fused_slices(t_calls, p_calls, plan) == {}


def test_a_slice_of_several_runs_gathers_them_in_torch_order_from_paddle_and_numpy_alike():
    a = np.arange(2 * 3 * 10, dtype=np.float32).reshape(2, 3, 10)
    s = Slice(-1, 1, 9, ("a", "b"), runs=((7, 9), (1, 3)))
    want = np.concatenate([a[..., 7:9], a[..., 1:3]], axis=-1)
    assert np.array_equal(s.of([a])[0], want)
    assert np.array_equal(s.of([paddle.to_tensor(a)])[0].numpy(), want)
    on_axis = Slice(-2, 0, 3, ("a", "b"), runs=((2, 3), (0, 1)))
    assert np.array_equal(sliced(type("P", (), {"part": on_axis})(), [a])[0], a[:, [2, 0], :])


def _rows(report):
    return {r.torch: r for r in report.layers}


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_clean_grouped_port_passes_each_projection_judged_on_its_own_positions(rules, strategy):
    spec = spec_from_functions(torch_model, PaddleModel, inputs, mapping=rules)
    report = verify(spec, Options(device="cpu", strategy=strategy), bisect=True)
    assert report.verdict == "pass", [(r.torch, r.ratio, r.note) for r in report.layers if r.within_budget is False]
    if strategy == "full":
        rows = _rows(report)
        for name, runs in zip(("q_proj", "k_proj", "v_proj"), _q_k_v_runs()):
            row = rows[f"layers.1.attn.{name}"]
            assert row.paddle == "layers.1.attn.qkv_proj" and row.within_budget, row
            assert row.shape == (2, 6, sum(b - a for a, b in runs))
            assert "elements " + ", ".join(f"{a}:{b}" for a, b in runs) in row.note
        for name, (a, b) in (("gate_proj", (0, FFN)), ("up_proj", (FFN, 2 * FFN))):
            assert f"elements {a}:{b} " in rows[f"layers.0.{name}"].note


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_key_heads_exchanged_inside_the_fused_layer_are_named_at_k_proj(rules, strategy, tmp_path):
    """A converter that put group 1's key head where group 0's goes, and back: k_proj is named,
    q_proj and v_proj, read from the same fused layer, are within budget."""
    from converter.io.base import TensorInfo
    from converter.io.pdparams import write_pdparams
    state = _plan(rules)[0]
    k0, k1 = (slice(g * BLOCK + GROUP * HEAD, g * BLOCK + (GROUP + 1) * HEAD) for g in range(KV_HEADS))
    for key in ("layers.1.attn.qkv_proj.weight", "layers.1.attn.qkv_proj.bias"):
        w = state[key].copy()
        w[..., k0], w[..., k1] = state[key][..., k1], state[key][..., k0]
        state[key] = w
    path = tmp_path / "k_heads.pdparams"
    with open(path, "wb") as f:
        write_pdparams(f, [TensorInfo(k, "float32", v.shape) for k, v in state.items()], lambda info: state[info.name])
    spec = spec_from_functions(torch_model, PaddleModel, inputs, mapping=rules)
    report = verify(spec, Options(device="cpu", strategy=strategy), converted=str(path), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "layers.1.attn.k_proj", report.first_bad
    assert report.first_bad.ratio > 10
    rows = _rows(report)
    assert rows["layers.1.attn.q_proj"].within_budget and rows["layers.1.attn.v_proj"].within_budget
