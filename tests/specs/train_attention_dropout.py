"""Training pair: a one-block attention classifier whose dropouts are not all modules. Torch's
attention hands its rate to scaled_dot_product_attention from a float attribute (as HF's sdpa
attention does), its hidden dropout keeps the rate in `drop_prob` (as HF DeBERTa's StableDropout),
and its head reads `config.classifier_dropout` at every call; paddle's port applies the same
rates through an attention attribute, a Dropout layer and its own config. `build(...)` makes
either side with other rates."""

import numpy as np
import paddle
import torch

V, D, C, B, T = 13, 8, 3, 4, 6
ATTENTION, HIDDEN, CLASSIFIER = 0.1, 0.2, 0.3


class Config:
    def __init__(self, attention=ATTENTION, hidden=HIDDEN, classifier=CLASSIFIER):
        self.attention_probs_dropout_prob = attention
        self.hidden_dropout_prob = hidden
        self.classifier_dropout = classifier
        self.use_dropout = True  # a flag, not a rate


class StableDropout(torch.nn.Module):
    def __init__(self, drop_prob):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.training and self.drop_prob > 0:
            mask = (torch.rand_like(x) >= self.drop_prob).to(x.dtype)
            return x * mask / (1 - self.drop_prob)
        return x


class TorchAttention(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))
        self.dropout_prob = config.attention_probs_dropout_prob

    def forward(self, x):
        return torch.nn.functional.scaled_dot_product_attention(
            self.q(x), self.k(x), self.v(x), dropout_p=self.dropout_prob if self.training else 0.0)


class TorchNet(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.emb = torch.nn.Embedding(V, D)
        self.attn = TorchAttention(config)
        self.drop = StableDropout(config.hidden_dropout_prob)
        self.head = torch.nn.Linear(D, C)

    def forward(self, ids):
        h = self.drop(self.attn(self.emb(ids))).mean(dim=1)
        h = torch.nn.functional.dropout(h, self.config.classifier_dropout, self.training)
        return self.head(h)


class PaddleAttention(paddle.nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.q, self.k, self.v = (paddle.nn.Linear(D, D) for _ in range(3))
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, x):
        scores = paddle.matmul(self.q(x), self.k(x), transpose_y=True) / np.sqrt(D)
        probs = paddle.nn.functional.dropout(paddle.nn.functional.softmax(scores, -1), self.attention_dropout,
                                             training=self.training)
        return paddle.matmul(probs, self.v(x))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.emb = paddle.nn.Embedding(V, D)
        self.attn = PaddleAttention(config)
        self.drop = paddle.nn.Dropout(config.hidden_dropout_prob)
        self.head = paddle.nn.Linear(D, C)

    def forward(self, ids):
        h = self.drop(self.attn(self.emb(ids))).mean(axis=1)
        h = paddle.nn.functional.dropout(h, self.config.classifier_dropout, training=self.training)
        return self.head(h)


def build(side, **rates):
    torch.manual_seed(0)
    return TorchNet(Config(**rates)) if side == "torch" else PaddleNet(Config(**rates))


def torch_model():
    return build("torch")


def paddle_model():
    return build("paddle")


def inputs():
    return (np.random.default_rng(0).integers(0, V, (B, T)),)


def batches():
    rng = np.random.default_rng(1)
    return [((rng.integers(0, V, (B, T)),), rng.integers(0, C, B)) for _ in range(3)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2)
