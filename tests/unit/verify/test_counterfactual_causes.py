"""Causes found by re-running the first layer over budget with one of its settings changed
(verify/counterfactual.py): layer types no family of the project covers get a cause confirmed by
re-running, read from the two layers' own settings; a clean pair gets none."""

import numpy as np
import paddle
import pytest
import torch

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions
from converter.verify.counterfactual import candidates, settings

STRATEGIES = ("full", "binary")


def conv_sandwich(torch_layer, paddle_layer, size=10):
    """conv -> the layer -> conv -> adaptive pool, so that the layer sits inside a model and a
    layer changing the size still leaves the final outputs comparable."""
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch_layer(), torch.nn.Conv2d(4, 2, 1),
                                   torch.nn.AdaptiveAvgPool2d(2)).eval()

    def paddle_model():
        return paddle.nn.Sequential(paddle.nn.Conv2D(4, 4, 3, padding=1), paddle_layer(), paddle.nn.Conv2D(4, 2, 1),
                                    paddle.nn.AdaptiveAvgPool2D(2))
    x = np.random.RandomState(0).randn(2, 4, size, size).astype("float32")
    return spec_from_functions(torch_model, paddle_model, lambda: (x,))


def forward_of(spec, strategy):
    report = verify_port(spec, VerifyOptions(strategy=strategy, bisect=True))
    return report, report.forward


CASES = {
    # (torch layer, paddle layer, what the cause says, what the hint says)
    "local-response-norm-k": (lambda: torch.nn.LocalResponseNorm(3, k=2.0), lambda: paddle.nn.LocalResponseNorm(3),
                              "has k=1.0; re-run on torch's recorded inputs with k=2.0",
                              "construct paddle's LocalResponseNorm with k=2.0"),
    "softmax-axis": (lambda: torch.nn.Softmax(dim=1), lambda: paddle.nn.Softmax(axis=-1),
                     "has _axis=-1; re-run on torch's recorded inputs with _axis=1",
                     "construct paddle's Softmax with axis=1"),
    # the pool's output is another size: the search pairs the re-run's outputs with torch's afresh
    "max-pool-ceil-mode": (lambda: torch.nn.MaxPool2d(3, 2, ceil_mode=True), lambda: paddle.nn.MaxPool2D(3, 2),
                           "has ceil_mode=False; re-run on torch's recorded inputs with ceil_mode=True",
                           "construct paddle's MaxPool2D with ceil_mode=True"),
    # two settings changed together: a range's two ends
    "hardtanh-range": (lambda: torch.nn.Hardtanh(-2.0, 2.0), lambda: paddle.nn.Hardtanh(),
                       "has _min=-1.0, _max=1.0; re-run on torch's recorded inputs with _min=-2.0, _max=2.0",
                       "construct paddle's Hardtanh with min=-2.0, max=2.0"),
    # paddle's default is an int: torch's float is tried in its place
    "softplus-beta": (lambda: torch.nn.Softplus(beta=2.0), lambda: paddle.nn.Softplus(),
                      "has _beta=1; re-run on torch's recorded inputs with _beta=2.0",
                      "construct paddle's Softplus with beta=2.0"),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(CASES))
def test_a_setting_that_differs_is_confirmed_by_re_running(name, strategy):
    torch_layer, paddle_layer, cause, hint = CASES[name]
    report, forward = forward_of(conv_sandwich(torch_layer, paddle_layer), strategy)
    assert report.exit_code == 1 and forward.first_bad.torch == "1", forward.first_bad
    found = [d for d in forward.diagnosis if d.kind == "setting"]
    assert found, [d.cause for d in forward.diagnosis]
    assert cause in found[0].cause and "confirmed by re-running" in found[0].cause, found[0].cause
    assert found[0].hint == hint


def test_torch_side_is_searched_where_no_paddle_setting_reproduces_torch():
    """Paddle's CELU with torch's alpha lands just outside the budget of torch's fp32 output (its
    own kernel rounds otherwise); torch's module re-run with paddle's alpha gives paddle's output."""
    report, forward = forward_of(conv_sandwich(lambda: torch.nn.CELU(alpha=2.0), lambda: paddle.nn.CELU()), "full")
    found = [d for d in forward.diagnosis if d.kind == "setting"]
    assert found and "computes what torch's 1 (CELU) computes with alpha=1.0 (torch's has alpha=2.0)" in found[0].cause
    assert found[0].hint == "give paddle's CELU the setting that matches torch's alpha=2.0"


class TorchRNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class PaddleRNN(paddle.nn.Layer):
    def __init__(self, time_major):
        super().__init__()
        self.lstm = paddle.nn.LSTM(6, 5, time_major=time_major)
        self.head = paddle.nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


@pytest.mark.parametrize("time_major", [False, True])
def test_lstm_read_time_major_is_named_with_its_setting(time_major):
    """An LSTM read time-major on one side and batch-major on the other: the flag is the cause."""
    x = np.random.RandomState(1).randn(3, 7, 6).astype("float32")  # batch 3, 7 steps

    def torch_model():
        torch.manual_seed(0)
        return TorchRNN().eval()
    spec = spec_from_functions(torch_model, lambda: PaddleRNN(time_major), lambda: (x,))
    report, forward = forward_of(spec, "full")
    if not time_major:
        assert report.exit_code == 0 and not [d for d in forward.diagnosis or [] if d.kind == "setting"]
        return
    assert report.exit_code == 1 and forward.first_bad.torch == "lstm", forward.first_bad
    found = [d for d in forward.diagnosis if d.kind == "setting"]
    assert found and "time_major=True; re-run on torch's recorded inputs with time_major=False" in found[0].cause
    assert found[0].hint == "construct paddle's LSTM with time_major=False"


def test_clean_pair_gets_no_setting_cause():
    report, forward = forward_of(conv_sandwich(lambda: torch.nn.LocalResponseNorm(3), lambda: paddle.nn.LocalResponseNorm(3)),
                                 "full")
    assert report.exit_code == 0 and str(report.verdict) == "pass"
    assert not forward.diagnosis


def test_settings_are_what_a_layer_keeps_beyond_its_framework():
    keys = frozenset(vars(paddle.nn.Layer()))
    assert settings(paddle.nn.MaxPool2D(3, 2), keys) == {"ksize": 3, "stride": 2, "padding": 0, "return_mask": False,
                                                         "ceil_mode": False, "data_format": "NCHW"}


def test_candidates_come_from_the_counterpart():
    assert candidates(True, []) == [False]
    assert candidates(0.1, [0.9, 0.1, "x"]) == [0.9]  # the complement and torch's value are one candidate
    assert candidates(1, [2.0, 768, (3, 3), -1]) == [2.0, -1, 3]  # sizes are no candidates
    assert candidates([1, 1], [2, (2, 2), (1, 2, 3)]) == [[2, 2]]
    assert candidates("NCHW", ["NHWC", "bilinear", "not an identifier"]) == ["NHWC", "bilinear"]
    # a layer that holds weights keeps its whole numbers: they are its structure
    assert candidates(1, [2, 0], sizes=False) == [] and candidates(0.5, [0.1], sizes=False) == [0.1]
