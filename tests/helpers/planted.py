"""Planted porting bugs, each with the torch module that must be named and a word the
diagnosis must contain. Every bug is a change a person porting by hand really makes."""

import math
import types
from dataclasses import dataclass
from typing import Callable

import numpy as np
import paddle
import paddle.nn.functional as F

from converter.examples import bert_port as B


@dataclass
class PlantedBug:
    name: str
    architecture: str
    culprit: str  # torch path that must be named
    diagnosis: str  # a word the diagnosis must contain
    mutate_model: Callable | None = None  # paddle model -> None, before weights are loaded
    mutate_weights: Callable | None = None  # converted state dict -> None


def clean_bert():
    return B.paddle_model_fixed()


def _forward(layer, fn):
    layer.forward = types.MethodType(fn, layer)


def _scale_by_head_dim(self, x):  # forgot the square root
    b, t = x.shape[0], x.shape[1]
    split = lambda y: y.reshape([b, t, B.HEADS, B.HIDDEN // B.HEADS]).transpose([0, 2, 1, 3])
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scores = q @ k.transpose([0, 1, 3, 2]) / (B.HIDDEN // B.HEADS)
    return (F.softmax(scores, axis=-1) @ v).transpose([0, 2, 1, 3]).reshape([b, t, B.HIDDEN])


def _softmax_wrong_axis(self, x):
    b, t = x.shape[0], x.shape[1]
    split = lambda y: y.reshape([b, t, B.HEADS, B.HIDDEN // B.HEADS]).transpose([0, 2, 1, 3])
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scores = q @ k.transpose([0, 1, 3, 2]) / math.sqrt(B.HIDDEN // B.HEADS)
    return (F.softmax(scores, axis=-2) @ v).transpose([0, 2, 1, 3]).reshape([b, t, B.HIDDEN])


def _no_residual(self, h, residual):
    return self.LayerNorm(self.dense(h))


def _functional_dropout(self, x):  # paddle's F.dropout defaults to training=True
    return F.dropout(self.intermediate_act_fn(self.dense(x)), 0.1)


def _positions_from_one(self, input_ids, token_type_ids):
    pos = paddle.arange(1, input_ids.shape[1] + 1).unsqueeze(0)
    x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
    return self.LayerNorm(x)


def _untranspose(name):
    def mutate(state):
        state[name] = np.ascontiguousarray(state[name].T)
    return mutate


def _fp16_round_trip(name):
    def mutate(state):
        state[name] = state[name].astype(np.float16).astype(np.float32)
    return mutate


def _bert_eps(model):
    model.encoder.layer[1].output.LayerNorm = paddle.nn.LayerNorm(B.HIDDEN, epsilon=1e-5)


def _bert_gelu(model):
    model.encoder.layer[0].intermediate.intermediate_act_fn = paddle.nn.GELU(approximate=True)


BERT_BUGS = [
    PlantedBug("layernorm-epsilon", "bert", "encoder.layer.1.output.LayerNorm", "epsilon", _bert_eps),
    PlantedBug("gelu-tanh", "bert", "encoder.layer.0.intermediate.intermediate_act_fn", "GELU", _bert_gelu),
    PlantedBug("attention-scale", "bert", "encoder.layer.2.attention.self", "own forward",
               lambda m: _forward(m.encoder.layer[2].attention.self, _scale_by_head_dim)),
    PlantedBug("softmax-axis", "bert", "encoder.layer.1.attention.self",
               "softmax(..., axis=-2); re-run on torch's recorded inputs with axis=-1",
               lambda m: _forward(m.encoder.layer[1].attention.self, _softmax_wrong_axis)),
    PlantedBug("dropped-residual", "bert", "encoder.layer.3.attention.output", "own forward",
               lambda m: _forward(m.encoder.layer[3].attention.output, _no_residual)),
    PlantedBug("dropout-in-eval", "bert", "encoder.layer.1.intermediate", "dropout",
               lambda m: _forward(m.encoder.layer[1].intermediate, _functional_dropout)),
    PlantedBug("position-ids-from-one", "bert", "embeddings", "own forward",
               lambda m: _forward(m.embeddings, _positions_from_one)),
    PlantedBug("square-weight-untransposed", "bert", "encoder.layer.2.attention.self.query", "untransposed",
               mutate_weights=_untranspose("encoder.layer.2.attention.self.query.weight")),
    # a key bias that went through fp16: softmax is blind to it, so the output moves by < 1e-6
    PlantedBug("key-bias-fp16-tiny", "bert", "encoder.layer.3.attention.self.key", "differs",
               mutate_weights=_fp16_round_trip("encoder.layer.3.attention.self.key.bias")),
]


class _TrainingBatchNorm(paddle.nn.BatchNorm2D):
    """A BatchNorm whose forward hard-codes training=True."""

    def forward(self, x):
        return F.batch_norm(x, self._mean, self._variance, self.weight, self.bias, training=True,
                            momentum=self._momentum, epsilon=self._epsilon)


def _set(attr, factory):
    return lambda m: setattr(m, attr, factory())


CNN_BUGS = [
    PlantedBug("batchnorm-epsilon", "cnn", "bn", "epsilon", _set("bn", lambda: paddle.nn.BatchNorm2D(16, epsilon=1e-2))),
    PlantedBug("batchnorm-batch-stats", "cnn", "bn", "batch", _set("bn", lambda: _TrainingBatchNorm(16))),
    PlantedBug("avgpool-exclusive", "cnn", "pool", "AvgPool",
               _set("pool", lambda: paddle.nn.AvgPool2D(3, stride=2, padding=1))),
    PlantedBug("upsample-align-corners", "cnn", "up", "interpolation",
               _set("up", lambda: paddle.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True))),
    PlantedBug("padding-mode", "cnn", "conv1", "padding mode",
               _set("conv1", lambda: paddle.nn.Conv2D(3, 16, 3, padding=1))),
    PlantedBug("relu-for-relu6", "cnn", "act", "activation variant", _set("act", lambda: paddle.nn.ReLU())),
]

ALL_BUGS = BERT_BUGS + CNN_BUGS
