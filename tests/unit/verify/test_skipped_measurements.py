"""A measurement the forward check could not take is counted in the report's notes with why,
not skipped in silence: here paddle's own error of a layer that refuses to run in float64."""

import numpy as np
import paddle
import torch

from converter import VerifyOptions, verify_port
from converter.report import render_json, render_text
from converter.results import Skipped, skipped_notes
from converter.spec import spec_from_functions

MIX = np.random.RandomState(2).randn(6, 6).astype("float32")


class TorchMix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = torch.from_numpy(MIX)

    def forward(self, x):
        return x @ self.mix.to(x.dtype)


class PaddleMix(paddle.nn.Layer):
    """A layer whose code computes in float32 only (as a custom kernel may): its float64 copy raises."""

    def __init__(self):
        super().__init__()
        self.mix = paddle.to_tensor(MIX)

    def forward(self, x):
        if x.dtype != paddle.float32:
            raise TypeError("PaddleMix computes in float32 only")
        return paddle.matmul(x, self.mix)


def _spec():
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 6), TorchMix(), torch.nn.Linear(6, 2)).eval()

    def paddle_model():
        return paddle.nn.Sequential(paddle.nn.Linear(6, 6), PaddleMix(), paddle.nn.Linear(6, 2))
    x = np.random.RandomState(0).randn(3, 6).astype("float32")
    return spec_from_functions(torch_model, paddle_model, lambda: (x,))


def test_a_layer_that_refuses_float64_is_counted_with_its_reason():
    report = verify_port(_spec(), VerifyOptions(strategy="full"))
    assert report.exit_code == 0
    said = [n for n in report.forward.notes if "skipped" in n]
    assert said == ["1 measurement skipped: paddle's own error in '1', on a float64 copy of it (torch's stands in) "
                    "(TypeError: PaddleMix computes in float32 only)"]
    assert "note: " + said[0] in render_text(report)
    assert said[0] in render_json(report)


def test_clean_run_counts_nothing():
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()).eval()
    spec = spec_from_functions(torch_model, lambda: paddle.nn.Sequential(paddle.nn.Linear(6, 6), paddle.nn.Tanh()),
                               lambda: (np.ones((2, 6), "float32"),))
    report = verify_port(spec, VerifyOptions(strategy="full"))
    assert report.exit_code == 0 and not [n for n in report.forward.notes if "skipped" in n]


def test_the_note_names_three_and_counts_the_rest():
    skipped = [Skipped.of(f"m{i}", ValueError(f"bad\n  value {i}")) for i in range(5)]
    assert skipped_notes([]) == []
    assert skipped_notes(skipped[:1]) == ["1 measurement skipped: m0 (ValueError: bad value 0)"]
    assert skipped_notes(skipped) == ["5 measurements skipped: m0 (ValueError: bad value 0); m1 (ValueError: bad "
                                      "value 1); m2 (ValueError: bad value 2); and 2 more"]
