"""A port whose layers are called differently on the two sides, as in real ports.

torch: position ids are a [1, T] buffer; the attention takes `hidden_states` alone and is
causal inside. paddle: position ids are built [B, T]; the attention takes (query, key,
value, attn_mask), the same tensor three times and an additive causal mask [1, 1, T, T]
built by the model. `paddle_model(bug)` plants one porting bug (see BUGS).
"""

import math

import numpy as np
import paddle
import torch

VOCAB, T, B, H, HEADS = 50, 10, 2, 16, 2
mapping = None  # the same layer names on both sides: the rules are inferred
BUGS = ("no_causal_mask", "unscaled", "qk_exchanged", "positions_from_one", "last_token_masked")


class TorchEmbeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, H)
        self.pos = torch.nn.Embedding(T + 1, H)
        self.register_buffer("position_ids", torch.arange(T)[None], persistent=False)

    def forward(self, ids):
        return self.tok(ids) + self.pos(self.position_ids[:, : ids.shape[1]])


class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = H // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (torch.nn.Linear(H, H) for _ in range(4))
        self.register_buffer("bias", torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)  # as HF GPT-2

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        split = lambda x: x.view(b, t, HEADS, self.head_dim).transpose(1, 2)
        q, k, v = split(self.q_proj(hidden_states)), split(self.k_proj(hidden_states)), split(self.v_proj(hidden_states))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~self.bias[:t, :t], float("-inf"))
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H))


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.attn, self.norm, self.head = TorchEmbeddings(), TorchAttention(), torch.nn.LayerNorm(H), \
            torch.nn.Linear(H, VOCAB)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        return self.head(self.norm(h + self.attn(h)))


class PaddleEmbeddings(paddle.nn.Layer):
    def __init__(self, start=0):
        super().__init__()
        self.tok = paddle.nn.Embedding(VOCAB, H)
        self.pos = paddle.nn.Embedding(T + 1, H)
        self.start = start

    def forward(self, ids):
        b, t = ids.shape
        positions = paddle.arange(self.start, self.start + t).unsqueeze(0).expand([b, t])
        return self.tok(ids) + self.pos(positions)


class PaddleAttention(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        self.head_dim = H // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (paddle.nn.Linear(H, H) for _ in range(4))
        self.bug = bug

    def forward(self, query, key, value, attn_mask=None):
        b, t, _ = query.shape
        split = lambda x: x.reshape([b, t, HEADS, self.head_dim]).transpose([0, 2, 1, 3])
        q, k, v = split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
        if self.bug == "qk_exchanged":
            q, k = k, q
        scale = 1.0 if self.bug == "unscaled" else 1 / math.sqrt(self.head_dim)
        scores = q @ k.transpose([0, 1, 3, 2]) * scale
        if self.bug != "no_causal_mask":
            scores = scores + attn_mask
        out = paddle.nn.functional.softmax(scores, axis=-1) @ v
        return self.out_proj(out.transpose([0, 2, 1, 3]).reshape([b, t, H]))


class PaddleModel(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        self.emb = PaddleEmbeddings(1 if bug == "positions_from_one" else 0)
        self.attn, self.norm, self.head = PaddleAttention(bug), paddle.nn.LayerNorm(H), paddle.nn.Linear(H, VOCAB)
        self.bug = bug

    def forward(self, input_ids):
        h = self.emb(input_ids)
        t = input_ids.shape[1]
        mask = paddle.triu(paddle.full([t, t], -1e4, dtype="float32"), diagonal=1).reshape([1, 1, t, t])
        if self.bug == "last_token_masked":  # as PaddleNLP masks tokens equal to pad_token_id
            pad = (input_ids == input_ids[0, t - 1]).astype("float32") * -1e4
            mask = mask + pad.reshape([input_ids.shape[0], 1, 1, t])
        return self.head(self.norm(h + self.attn(h, h, h, mask)))


def torch_model():
    torch.manual_seed(0)
    return TorchModel()


def paddle_model(bug=None):
    return PaddleModel(bug)


def inputs():
    return {"input_ids": np.random.default_rng(0).integers(0, VOCAB, (B, T)).astype("int64")}
