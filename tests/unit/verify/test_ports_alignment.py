"""What real ports do that the two sides' names and shapes do not say: a wrapper on one side and a
bare layer on the other (the rule file decides the pairing, not the names), an in-place activation
(its budget from its input as it was before the call), and a dropout that sees [B, C, 1, 1] on one
side and [B, C] on the other (compared squeezed, never broadcast into a grid). Clean pairs pass;
the planted bug is named at its layer."""
import json

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.spec import spec_from_functions

STRATEGIES = ["full", "binary"]


def x_of(*shape):
    return lambda: (np.random.default_rng(0).standard_normal(shape).astype("float32"),)


# ------------------------------------------------------------------ a wrapper against a bare layer

class TorchPooler(torch.nn.Module):
    """As HF's BertPooler: the first position, a dense layer and a tanh."""

    def __init__(self):
        super().__init__()
        self.dense, self.activation = torch.nn.Linear(8, 8), torch.nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class TorchPooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.pooler = torch.nn.Linear(8, 8), TorchPooler()

    def forward(self, x):
        h = self.enc(x)
        return h, self.pooler(h)


class PaddlePooled(paddle.nn.Layer):
    """The port keeps a bare Linear named `pooler` and applies the tanh in its own forward."""

    def __init__(self):
        super().__init__()
        self.enc, self.pooler = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)

    def forward(self, x):
        h = self.enc(x)
        return h, paddle.tanh(self.pooler(h[:, 0]))


POOLER_RULES = {"name": "pooler", "rules": [
    {"kind": "rename", "key": "enc.weight", "to": "enc.weight"}, {"kind": "transpose", "key": "enc.weight"},
    {"kind": "rename", "key": "enc.bias", "to": "enc.bias"},
    {"kind": "rename", "key": "pooler.dense.weight", "to": "pooler.weight"},
    {"kind": "transpose", "key": "pooler.dense.weight"},
    {"kind": "rename", "key": "pooler.dense.bias", "to": "pooler.bias"}]}


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_the_rule_file_pairs_a_wrapper_with_the_bare_layer_it_maps(tmp, train):
    rules = tmp / "rules.json"
    rules.write_text(json.dumps(POOLER_RULES))

    def torch_model():
        torch.manual_seed(0)
        return TorchPooled()
    spec = spec_from_functions(torch_model, PaddlePooled, x_of(2, 5, 8), mapping=str(rules))
    report = verify_port(spec, VerifyOptions(train=train, steps=2))
    assert report.exit_code == 0, (report.forward.first_bad, report.train and report.train.first_bad)
    pairs = {(row.torch, row.paddle) for row in report.forward.layers}
    assert ("pooler.dense", "pooler") in pairs and ("pooler", "pooler") not in pairs


# ------------------------------------------------------------------ an in-place activation

class TorchInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = torch.nn.Linear(8, 8), torch.nn.LeakyReLU(0.2, inplace=True), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class PaddleLeaky(paddle.nn.Layer):
    def __init__(self, slope):
        super().__init__()
        self.fc, self.act, self.out = paddle.nn.Linear(8, 8), paddle.nn.LeakyReLU(slope), paddle.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("slope", [0.2, 0.1], ids=["clean", "wrong-slope"])
def test_an_in_place_activation_is_budgeted_from_its_input_before_the_call(strategy, slope):
    def torch_model():
        torch.manual_seed(0)
        return TorchInPlace()
    spec = spec_from_functions(torch_model, lambda: PaddleLeaky(slope), x_of(2, 5, 8))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    if slope == 0.2:
        assert report.exit_code == 0, report.forward.first_bad
    else:
        act = report.forward.first_bad
        assert report.exit_code == 1 and act.torch == "act", act
        assert act.budget < 1e-5, act  # fp32 noise on values of order 1, not the input the call overwrote


# ------------------------------------------------------------------ [B, C, 1, 1] against [B, C]

class TorchHead(torch.nn.Module):
    """As torchvision's Inception-v3 head: pool, dropout on [B, C, 1, 1], flatten, fc."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.pool, self.dropout, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Dropout(0.5), torch.nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.dropout(self.pool(self.conv(x))), 1))


class PaddleHead(paddle.nn.Layer):
    """As paddle.vision's: pool, flatten, then dropout on [B, C]."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 6, 3)
        self.pool, self.dropout, self.fc = paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Dropout(0.5), paddle.nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(self.dropout(paddle.flatten(self.pool(self.conv(x)), 1)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_outputs_that_differ_in_axes_of_size_one_are_compared_squeezed(strategy):
    def torch_model():
        torch.manual_seed(0)
        return TorchHead()
    spec = spec_from_functions(torch_model, PaddleHead, x_of(2, 3, 8, 8))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    assert report.exit_code == 0, report.forward.first_bad
    dropout = next(row for row in report.forward.layers if row.torch == "dropout")
    assert dropout.max_abs < 1e-5 and list(dropout.shape) in ([2, 6], [2, 6, 1, 1]), dropout


# ------------------------------------------------------------------ DenseNet's two ways of writing one block

class TorchDenseLayer(torch.nn.Module):
    """As torchvision's: handed the list of features so far, it joins them itself."""

    def __init__(self, c):
        super().__init__()
        self.norm, self.relu, self.conv = torch.nn.BatchNorm2d(c), torch.nn.ReLU(), torch.nn.Conv2d(c, 4, 3, padding=1)

    def forward(self, features):
        return self.conv(self.relu(self.norm(torch.cat(features, 1))))


class TorchTransition(torch.nn.Sequential):
    def __init__(self, c):
        super().__init__()
        self.norm, self.relu, self.conv = torch.nn.BatchNorm2d(c), torch.nn.ReLU(), torch.nn.Conv2d(c, 4, 1)
        self.pool = torch.nn.AvgPool2d(2)


class TorchDense(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.layers = torch.nn.ModuleList([TorchDenseLayer(4 + 4 * i) for i in range(3)])
        self.transition = TorchTransition(16)

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(features))  # the list each layer was handed grows after the call
        return self.transition(torch.cat(features, 1))


class NormActConv(paddle.nn.Layer):
    """As paddle.vision's: the legacy BatchNorm applies the activation inside it."""

    def __init__(self, c, out, k):
        super().__init__()
        self.norm, self.conv = paddle.nn.BatchNorm(c, act="relu"), paddle.nn.Conv2D(c, out, k, padding=k // 2)

    def forward(self, x):
        return self.conv(self.norm(x))


class PaddleDenseLayer(paddle.nn.Layer):
    """As paddle.vision's: handed the joined features, it returns them with its own joined on."""

    def __init__(self, c):
        super().__init__()
        self.norm, self.conv = paddle.nn.BatchNorm(c, act="relu"), paddle.nn.Conv2D(c, 4, 3, padding=1)

    def forward(self, x):
        return paddle.concat([x, self.conv(self.norm(x))], axis=1)


class PaddleTransition(paddle.nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.body, self.pool = NormActConv(c, 4, 1), paddle.nn.AvgPool2D(2)

    def forward(self, x):
        return self.pool(self.body(x))


class PaddleDense(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.blocks = paddle.nn.Sequential(*[PaddleDenseLayer(4 + 4 * i) for i in range(3)])
        self.transition = PaddleTransition(16)

    def forward(self, x):
        return self.transition(self.blocks(self.stem(x)))


def dense_rules(tmp):
    rules = [{"kind": "rename", "key": "stem.weight", "to": "stem.weight"}, {"kind": "rename", "key": "stem.bias", "to": "stem.bias"}]
    for torch_path, paddle_path in [(f"layers.{i}", f"blocks.{i}") for i in range(3)] + [("transition", "transition.body")]:
        for name, paddle_name in (("norm.weight", "norm.weight"), ("norm.bias", "norm.bias"), ("norm.running_mean", "norm._mean"),
                                  ("norm.running_var", "norm._variance"), ("conv.weight", "conv.weight"), ("conv.bias", "conv.bias")):
            rules.append({"kind": "rename", "key": f"{torch_path}.{name}", "to": f"{paddle_path}.{paddle_name}"})
        rules.append({"kind": "drop", "key": f"{torch_path}.norm.num_batches_tracked"})
    path = tmp / "dense.json"
    path.write_text(json.dumps({"name": "dense", "rules": rules}))
    return str(path)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_dense_block_written_both_ways_passes(tmp, strategy):
    """torch hands each layer a list it appends to afterwards, paddle the joined features; paddle's
    layer returns its input and its features joined, torch's its features alone; paddle's BatchNorm
    applies the activation inside it; paddle pools around the layer that holds the transition's
    weights. Each layer is paired and compared on what both compute."""
    def torch_model():
        torch.manual_seed(0)
        return TorchDense().eval()
    spec = spec_from_functions(torch_model, PaddleDense, x_of(1, 3, 8, 8), mapping=dense_rules(tmp))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    assert report.exit_code == 0, report.forward.first_bad
    rows = {row.torch: row for row in report.forward.layers}
    assert rows["layers.1"].paddle == "blocks.1" and rows["transition"].paddle == "transition", rows.keys()
    assert "compared after the activation" in rows["layers.0.norm"].note
    assert "elements 8:12 of paddle's" in rows["layers.1"].note
    assert rows["layers.2"].max_abs < 1e-5


# ------------------------------------------------------------------ a pool whose output shape differs

class TorchPooling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.pool, self.conv2 = torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(3, 2, ceil_mode=True), torch.nn.Conv2d(4, 4, 1)
        self.head = torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.head(self.conv2(self.pool(self.conv1(x))))


class PaddlePooling(paddle.nn.Layer):
    def __init__(self, ceil_mode):
        super().__init__()
        self.conv1, self.pool = paddle.nn.Conv2D(3, 4, 3), paddle.nn.MaxPool2D(3, 2, ceil_mode=ceil_mode)
        self.conv2, self.head = paddle.nn.Conv2D(4, 4, 1), paddle.nn.AdaptiveAvgPool2D(1)

    def forward(self, x):
        return self.head(self.conv2(self.pool(self.conv1(x))))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("ceil_mode", [True, False], ids=["clean", "floor"])
def test_a_pool_that_changes_the_shape_is_the_layer_named(strategy, ceil_mode):
    def torch_model():
        torch.manual_seed(0)
        return TorchPooling()
    spec = spec_from_functions(torch_model, lambda: PaddlePooling(ceil_mode), x_of(1, 3, 10, 10))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    if ceil_mode:
        assert report.exit_code == 0, report.forward.first_bad
    else:
        bad = report.forward.first_bad
        assert report.exit_code == 1 and bad.torch == "pool" and bad.paddle == "pool", bad
        if strategy == "full":
            assert "outputs differ in shape: torch [[1, 4, 4, 4]], paddle [[1, 4, 3, 3]]" in bad.note


# ------------------------------------------------------------------ whose failure it is

def test_a_failure_inside_numpy_called_by_the_tool_is_the_tools():
    from converter.compare.matching import lay_out
    from converter.compare.model_errors import _raised_by_us
    with pytest.raises(ValueError) as ours:
        lay_out(np.ones(3), (2,))  # numpy raises, for this package's own call
    assert _raised_by_us(ours.value)
    with pytest.raises(RuntimeError) as models:
        torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 5))  # a model's own mistake, raised by torch
    assert not _raised_by_us(models.value)


# ------------------------------------------------------------------ state on one side only

class TorchBatchStats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8, track_running_stats=False), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)))


class PaddleRunningStats(paddle.nn.Layer):
    def __init__(self, use_global_stats=None):
        super().__init__()
        self.fc, self.out = paddle.nn.Linear(6, 8), paddle.nn.Linear(8, 3)
        self.bn = paddle.nn.BatchNorm1D(8, use_global_stats=use_global_stats)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)))


@pytest.mark.parametrize("use_global_stats", [None, False], ids=["running-stats", "batch-stats"])
def test_running_statistics_on_paddles_side_only_are_checked_and_named(use_global_stats):
    """torch's BatchNorm keeps no running statistics; paddle's holds them (as parameters it does not
    train), and no torch tensor fills them: the check runs, and the layer is named with the cause,
    confirmed by re-running; built with the hint, the pair passes."""
    def torch_model():
        torch.manual_seed(0)
        return TorchBatchStats()
    spec = spec_from_functions(torch_model, lambda: PaddleRunningStats(use_global_stats), x_of(4, 6))
    report = verify_port(spec, VerifyOptions(bisect=True))
    assert any("bn._mean" in note and "no torch counterpart" in note for note in report.forward.notes), report.forward.notes
    if use_global_stats is False:
        assert report.exit_code == 0, report.forward.first_bad
        return
    assert report.exit_code == 1 and report.forward.first_bad.torch == "bn", report.forward.first_bad
    [cause] = report.forward.diagnosis
    assert "track_running_stats=False" in cause.cause and "use_global_stats=False" in cause.hint


# ------------------------------------------------------------------ a dropout that scales in eval

class TorchDropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.out = torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.drop(self.fc(x)))


class PaddleDropped(paddle.nn.Layer):
    def __init__(self, mode):
        super().__init__()
        self.fc, self.drop, self.out = paddle.nn.Linear(8, 8), paddle.nn.Dropout(0.5, mode=mode), paddle.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.drop(self.fc(x)))


@pytest.mark.parametrize("mode", ["downscale_in_infer", "upscale_in_train"])
def test_a_dropout_that_scales_in_eval_is_named_with_its_mode(mode):
    """paddle.vision's AlexNet, SqueezeNet and Inception-v3 build their dropouts this way."""
    def torch_model():
        torch.manual_seed(0)
        return TorchDropped()
    report = verify_port(spec_from_functions(torch_model, lambda: PaddleDropped(mode), x_of(4, 8)), VerifyOptions(bisect=True))
    if mode == "upscale_in_train":
        assert report.exit_code == 0, report.forward.first_bad
        return
    assert report.exit_code == 1 and report.forward.first_bad.torch == "drop", report.forward.first_bad
    [found] = report.forward.diagnosis
    assert "downscale_in_infer" in found.cause and "1 - p = 0.5" in found.cause and "upscale_in_train" in found.hint
