"""A module called more than once gives a call each: paddle.vision's SqueezeNet pools three times
with one MaxPool2D where torchvision has three MaxPool2d modules. Each call is recorded, paired with
the module that runs at its place on the other side, compared, judged and named, its row saying
which call it is; the same where torch calls one module several times against separate paddle
layers. Pools with padding 1 on 11x11: the first pool's input (11) is odd, where rounding up and
down agree; the second's (6) is even, where they differ."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.capture import Allowance, CaptureTooLarge, capture_calls, call_key, module_path
from converter.compare.session import Options
from converter.frameworks import torch_side
from converter.spec import spec_from_functions
from converter.verify.run import verify

C = 4
STRATEGIES = ("full", "binary")


class TorchThreePools(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (torch.nn.Conv2d(C if i else 3, C, 3, padding=1) for i in range(3))
        self.pool1, self.pool2, self.pool3 = (torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True) for _ in range(3))
        self.head = torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        return self.head(self.pool3(self.conv3(x))).flatten(1)


class PaddleSharedPool(paddle.nn.Layer):
    def __init__(self, ceil_mode=True):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (paddle.nn.Conv2D(C if i else 3, C, 3, padding=1) for i in range(3))
        self.pool = paddle.nn.MaxPool2D(3, 2, 1, ceil_mode=ceil_mode)
        self.head = paddle.nn.AdaptiveAvgPool2D(1)

    def forward(self, x):
        x = self.pool(self.conv1(x))
        x = self.pool(self.conv2(x))
        return self.head(self.pool(self.conv3(x))).flatten(1)


class TorchSharedPool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (torch.nn.Conv2d(C if i else 3, C, 3, padding=1) for i in range(3))
        self.pool = torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)
        self.head = torch.nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        x = self.pool(self.conv1(x))
        x = self.pool(self.conv2(x))
        return self.head(self.pool(self.conv3(x))).flatten(1)


class PaddleThreePools(paddle.nn.Layer):
    def __init__(self, floor_at=None):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (paddle.nn.Conv2D(C if i else 3, C, 3, padding=1) for i in range(3))
        self.pool1, self.pool2, self.pool3 = (paddle.nn.MaxPool2D(3, 2, 1, ceil_mode=i != floor_at)
                                              for i in (1, 2, 3))
        self.head = paddle.nn.AdaptiveAvgPool2D(1)

    def forward(self, x):
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        return self.head(self.pool3(self.conv3(x))).flatten(1)


def _seeded(cls):
    def make():
        torch.manual_seed(0)
        return cls().eval()
    return make


def _inputs():
    return (np.random.default_rng(0).standard_normal((1, 3, 11, 11)).astype("float32"),)


def _verify(torch_model, paddle_model, strategy):
    spec = spec_from_functions(torch_model, paddle_model, _inputs, label="shared pool")
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


def _row(report, torch_path):
    return next(r for r in report.layers if r.torch == torch_path)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_shared_paddle_pool_rounding_down_is_named_at_its_second_call(strategy):
    report = _verify(_seeded(TorchThreePools), lambda: PaddleSharedPool(ceil_mode=False), strategy)
    bad = report.first_bad
    assert report.verdict == "fail" and (bad.torch, bad.paddle) == ("pool2", call_key("pool", 2)), bad
    assert "paddle pool, call 2 of 3" in bad.note, bad.note  # binary: from its unit's boundary
    assert "[1, 4, 4, 4]" in bad.note and "[1, 4, 3, 3]" in bad.note, bad.note  # 6 rounded up, and down
    if strategy == "full":
        first = _row(report, "pool1")
        assert first.paddle == "pool" and first.within_budget and "paddle pool, call 1 of 3" in first.note
        assert any("ceil_mode" in d.cause for d in report.diagnosis), report.diagnosis


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_call_of_a_clean_shared_paddle_pool_is_judged(strategy):
    report = _verify(_seeded(TorchThreePools), PaddleSharedPool, strategy)
    assert report.verdict == "pass", report.first_bad
    if strategy == "full":  # binary probes the units' boundaries alone where none is over budget
        for k, torch_path in enumerate(("pool1", "pool2", "pool3"), 1):
            row = _row(report, torch_path)
            assert row.paddle == call_key("pool", k) and row.ratio is not None and row.within_budget, row
            assert f"paddle pool, call {k} of 3" in row.note, row.note


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_paddle_pool_rounding_down_is_named_at_the_second_call_of_a_shared_torch_pool(strategy):
    report = _verify(_seeded(TorchSharedPool), lambda: PaddleThreePools(floor_at=2), strategy)
    bad = report.first_bad
    assert report.verdict == "fail" and (bad.torch, bad.paddle) == (call_key("pool", 2), "pool2"), bad
    assert "torch pool, call 2 of 3" in bad.note, bad.note
    if strategy == "full":
        assert _row(report, "pool").within_budget


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_call_of_a_clean_shared_torch_pool_is_judged(strategy):
    report = _verify(_seeded(TorchSharedPool), PaddleThreePools, strategy)
    assert report.verdict == "pass", report.first_bad
    if strategy == "full":
        for k, paddle_path in enumerate(("pool1", "pool2", "pool3"), 1):
            row = _row(report, call_key("pool", k))
            assert row.paddle == paddle_path and row.ratio is not None and row.within_budget, row
            assert f"torch pool, call {k} of 3" in row.note, row.note


def test_each_call_is_recorded_and_held_like_any_other():
    """Every call of the shared pool is a Call of its own (its key, which call of how many, its own
    output), and what the calls hold counts against the capture's allowance: a limit that one
    call's tensors fit under but not the three calls' stops the capture."""
    model, (x,) = _seeded(TorchSharedPool)(), _inputs()
    run = lambda: model(torch.from_numpy(x))
    with torch.no_grad():
        calls = capture_calls(torch_side, model, run, {"pool"}).calls
        assert list(calls) == ["pool", "pool@2", "pool@3"]
        assert [(c.index, c.count) for c in calls.values()] == [(1, 3), (2, 3), (3, 3)]
        assert [c.shapes for c in calls.values()] == [[(1, C, 6, 6)], [(1, C, 4, 4)], [(1, C, 3, 3)]]
        assert all(module_path(key) == "pool" for key in calls)
        assert list(capture_calls(torch_side, model, run, {"pool@2"}).calls) == ["pool@2"]
        held = lambda shape: 2 * 4 * int(np.prod(shape))  # a call's outputs, and its inputs alike
        with pytest.raises(CaptureTooLarge):
            capture_calls(torch_side, model, run, {"pool"}, allowance=Allowance(held((1, C, 6, 6)) + 1))


class TorchTwice(torch.nn.Module):
    """One Linear applied twice (as ALBERT applies its one layer), a GELU between."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(torch.nn.functional.gelu(self.proj(x)))


class PaddleTwice(paddle.nn.Layer):
    def __init__(self, between="gelu"):
        super().__init__()
        self.dense, self._between = paddle.nn.Linear(8, 8), between

    def forward(self, x):
        return self.dense(getattr(paddle.nn.functional, self._between)(self.dense(x)))


def _twice_inputs():
    return (np.random.default_rng(0).standard_normal((4, 8)).astype("float32"),)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_second_call_of_a_layer_applied_twice_is_judged_on_torchs_inputs(strategy):
    """The Linear's second call pairs with its partner's second call (they are paired by their
    weights, under other names), and is judged on torch's inputs of that call: where the port's
    own code between the two calls differs (tanh for GELU), that code, the model's own forward, is
    named, not the second call, which computes what torch's does on the same inputs."""
    spec = lambda between: spec_from_functions(_seeded(TorchTwice), lambda: PaddleTwice(between), _twice_inputs)
    clean = verify(spec("gelu"), Options(device="cpu", strategy=strategy), bisect=True)
    assert clean.verdict == "pass", clean.first_bad
    buggy = verify(spec("tanh"), Options(device="cpu", strategy=strategy), bisect=True)
    assert buggy.verdict == "fail" and buggy.first_bad.torch == "", buggy.first_bad
    rows = {r.torch: r for r in buggy.layers}
    second = rows[call_key("proj", 2)]
    assert second.paddle == call_key("dense", 2) and second.ratio is not None and second.within_budget, second
    if strategy == "full":
        assert "torch proj, call 2 of 2; paddle dense, call 2 of 2" in second.note, second.note
