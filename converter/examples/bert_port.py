"""The bundled example port: a small BERT-like encoder in torch (HF naming) and a hand
port to paddle with one realistic porting bug.

The bug: the feed-forward activation was ported as paddle.nn.GELU(approximate=True),
the tanh approximation, while BERT uses the exact erf GELU. Outputs differ by about
1e-3 after four layers: small enough to look like noise to a fixed tolerance, and a
real difference that fine-tuning then amplifies. `verify-port --bisect` names
encoder.layer.0.intermediate.intermediate_act_fn and the cause.
"""

import math

import numpy as np
import paddle
import torch

VOCAB, HIDDEN, LAYERS, HEADS, FFN, MAX_POS, SEQ, BATCH = 1000, 256, 4, 4, 1024, 128, 64, 2


def resize(hidden=HIDDEN, layers=LAYERS, heads=HEADS, ffn=FFN, seq=SEQ, batch=BATCH):
    """Change the example's sizes (for benchmarks); models built afterwards use them."""
    global HIDDEN, LAYERS, HEADS, FFN, SEQ, BATCH, MAX_POS
    HIDDEN, LAYERS, HEADS, FFN, SEQ, BATCH = hidden, layers, heads, ffn, seq, batch
    MAX_POS = max(MAX_POS, seq)


# ---------------------------------------------------------------- torch (the original)
class TorchEmbeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = torch.nn.Embedding(MAX_POS, HIDDEN)
        self.token_type_embeddings = torch.nn.Embedding(2, HIDDEN)
        self.LayerNorm = torch.nn.LayerNorm(HIDDEN, eps=1e-12)

    def forward(self, input_ids, token_type_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class TorchSelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.query = torch.nn.Linear(HIDDEN, HIDDEN)
        self.key = torch.nn.Linear(HIDDEN, HIDDEN)
        self.value = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HIDDEN // HEADS)
        ctx = torch.softmax(scores, dim=-1) @ v
        return ctx.transpose(1, 2).reshape(b, t, HIDDEN)


class TorchAddNorm(torch.nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.dense = torch.nn.Linear(d_in, HIDDEN)
        self.LayerNorm = torch.nn.LayerNorm(HIDDEN, eps=1e-12)

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self = TorchSelfAttention()
        self.output = TorchAddNorm(HIDDEN)

    def forward(self, x):
        return self.output(self.self(x), x)


class TorchIntermediate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(HIDDEN, FFN)
        self.intermediate_act_fn = torch.nn.GELU()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class TorchLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = TorchAttention()
        self.intermediate = TorchIntermediate()
        self.output = TorchAddNorm(FFN)

    def forward(self, x):
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class TorchEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.ModuleList([TorchLayer() for _ in range(LAYERS)])

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class TorchBert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = TorchEmbeddings()
        self.encoder = TorchEncoder()

    def forward(self, input_ids, token_type_ids):
        return self.encoder(self.embeddings(input_ids, token_type_ids))


# ---------------------------------------------------------------- paddle (the port)
class PaddleEmbeddings(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.word_embeddings = paddle.nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = paddle.nn.Embedding(MAX_POS, HIDDEN)
        self.token_type_embeddings = paddle.nn.Embedding(2, HIDDEN)
        self.LayerNorm = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-12)

    def forward(self, input_ids, token_type_ids):
        pos = paddle.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class PaddleSelfAttention(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.query = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.key = paddle.nn.Linear(HIDDEN, HIDDEN)
        self.value = paddle.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, t = x.shape[0], x.shape[1]
        split = lambda y: y.reshape([b, t, HEADS, HIDDEN // HEADS]).transpose([0, 2, 1, 3])
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose([0, 1, 3, 2]) / math.sqrt(HIDDEN // HEADS)
        ctx = paddle.nn.functional.softmax(scores, axis=-1) @ v
        return ctx.transpose([0, 2, 1, 3]).reshape([b, t, HIDDEN])


class PaddleAddNorm(paddle.nn.Layer):
    def __init__(self, d_in):
        super().__init__()
        self.dense = paddle.nn.Linear(d_in, HIDDEN)
        self.LayerNorm = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-12)

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class PaddleAttention(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.self = PaddleSelfAttention()
        self.output = PaddleAddNorm(HIDDEN)

    def forward(self, x):
        return self.output(self.self(x), x)


class PaddleIntermediate(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.dense = paddle.nn.Linear(HIDDEN, FFN)
        self.intermediate_act_fn = paddle.nn.GELU(approximate=True)  # the porting bug

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class PaddleLayer(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.attention = PaddleAttention()
        self.intermediate = PaddleIntermediate()
        self.output = PaddleAddNorm(FFN)

    def forward(self, x):
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class PaddleEncoder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.layer = paddle.nn.LayerList([PaddleLayer() for _ in range(LAYERS)])

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class PaddleBert(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embeddings = PaddleEmbeddings()
        self.encoder = PaddleEncoder()

    def forward(self, input_ids, token_type_ids):
        return self.encoder(self.embeddings(input_ids, token_type_ids))


# ---------------------------------------------------------------- the spec contract
def torch_model():
    torch.manual_seed(0)
    model = TorchBert()
    with torch.no_grad():  # BERT's initialisation: N(0, 0.02) weights
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model


def paddle_model():
    return PaddleBert()


def paddle_model_fixed():
    """The port with its bug fixed: the exact GELU in every layer."""
    model = PaddleBert()
    for layer in model.encoder.layer:
        layer.intermediate.intermediate_act_fn = paddle.nn.GELU()
    return model


def inputs():
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64),
            "token_type_ids": (np.arange(SEQ)[None, :] >= SEQ // 2).repeat(BATCH, 0).astype(np.int64)}
