"""The per-layer backward of an attention that returns the keys and values it used beside its output
(HF's decoder attention returns them as its cache): the gradient recorded for such an output is the
one the rest of the model gives it, not the one its own attention passes back into it, so a
correct port whose attention returns only its output agrees, self-attention (the same tensor as
query, key and value, a causal mask) and cross-attention (the same tensor as key and value) alike."""

import numpy as np
import paddle
import torch

from helpers.train import train_check
from converter.spec import PortSpec

D, HEADS, B, T, S, V = 16, 2, 2, 5, 6, 13
HEAD = D // HEADS


class TorchAttention(torch.nn.Module):
    """HF's BartAttention as a decoder has it: (output, None, (keys, values)), the mask additive."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = torch.nn.Linear(D, D), torch.nn.Linear(D, D)
        self.v_proj, self.out_proj = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

    def _heads(self, x):
        return x.reshape(x.shape[0], -1, HEADS, HEAD).transpose(1, 2)

    def forward(self, hidden_states, key_value_states=None, attention_mask=None):
        memory = hidden_states if key_value_states is None else key_value_states
        q = self._heads(self.q_proj(hidden_states)) * HEAD ** -0.5
        k, v = self._heads(self.k_proj(memory)), self._heads(self.v_proj(memory))
        scores = q @ k.transpose(-1, -2)
        if attention_mask is not None:
            scores = scores + attention_mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(hidden_states.shape)
        return self.out_proj(out), None, (k, v)


class TorchDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(V, D)
        self.self_attn, self.cross_attn = TorchAttention(), TorchAttention()
        self.head = torch.nn.Linear(D, V)

    def forward(self, ids, memory):
        x = self.embed(ids)
        causal = torch.triu(torch.full((T, T), -1e9), diagonal=1)[None, None].expand(B, 1, T, T)
        x = x + self.self_attn(x, attention_mask=causal)[0]
        x = x + self.cross_attn(x, key_value_states=memory)[0]
        return self.head(x)


class PaddleDecoder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(V, D)
        self.self_attn, self.cross_attn = paddle.nn.MultiHeadAttention(D, HEADS), paddle.nn.MultiHeadAttention(D, HEADS)
        self.head = paddle.nn.Linear(D, V)

    def forward(self, ids, memory):
        x = self.embed(ids)
        causal = paddle.triu(paddle.full([T, T], -1e9), diagonal=1)
        x = x + self.self_attn(x, x, x, causal)
        x = x + self.cross_attn(x, memory, memory)
        return self.head(x)


def _inputs(rng):
    return rng.integers(0, V, (B, T)).astype(np.int64), rng.standard_normal((B, S, D)).astype(np.float32)


def _spec():
    rng = np.random.default_rng(1)
    return PortSpec(
        TorchDecoder, PaddleDecoder, _inputs(np.random.default_rng(0)),
        batches=[(_inputs(rng), rng.integers(0, V, (B, T)).astype(np.int64)) for _ in range(2)],
        torch_loss=lambda out, y: torch.nn.functional.cross_entropy(out.reshape(-1, V), y.reshape(-1)),
        paddle_loss=lambda out, y: paddle.nn.functional.cross_entropy(out.reshape([-1, V]), y.reshape([-1])),
        torch_optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3))


def test_an_attention_returning_its_keys_and_values_agrees_with_one_returning_its_output_alone():
    report = train_check(_spec(), steps=2, device="cpu")
    local = [r for r in report.rows if r.phase == "backward" and "local backward of" in r.note and r.ratio is not None]
    for layer in ("self_attn", "cross_attn"):
        rows = [r for r in local if r.torch.startswith(f"{layer}.k_proj") or r.torch.startswith(f"{layer} d input")]
        assert rows, [r.torch for r in local]
        assert not [r for r in rows if r.ratio > 1], [(r.torch, r.ratio, r.max_abs) for r in rows if r.ratio > 1]
    assert report.first_bad is None, report.first_bad
    assert report.verdict == "pass"
