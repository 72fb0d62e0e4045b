"""A measurement the training checks cannot take is counted in the report's notes: a layer whose
forward reads what its parent sets around the call cannot be re-run alone on its recorded inputs,
its row says so, and the report says how many measurements were skipped and which."""

import paddle
import torch

from helpers.cli import spec_path
from converter.compare.session import Options, PortSession
from converter.spec import PortSpec
from converter.train.report import render_text
from converter.results import Skipped, skipped_notes
from converter.train.run import train_on
from converter.train.spec import TrainSpec


class TorchScale(torch.nn.Module):
    def forward(self, x):
        return x * self.factor  # set by the parent around the call


class PaddleScale(paddle.nn.Layer):
    def forward(self, x):
        return x * self.factor


def _scaled_mlp():
    """train_mlp with its output scaled by a layer that reads a factor its parent sets only around the call."""
    spec = PortSpec.from_file(spec_path("train_mlp"))
    module = spec.module

    def wrapped(base, scale):
        class Scaled(base):
            def __init__(self):
                super().__init__()
                self.scale = scale()

            def forward(self, x):
                self.scale.factor = 2.0
                try:
                    return self.scale(super().forward(x))
                finally:
                    del self.scale.factor
        return Scaled

    torch_class, paddle_class = wrapped(module.TorchMLP, TorchScale), wrapped(module.PaddleMLP, PaddleScale)
    module.torch_model = lambda: (torch.manual_seed(0), torch_class())[1]
    module.paddle_model = paddle_class
    return spec


def test_a_layer_that_cannot_be_rerun_alone_is_counted_in_the_notes():
    spec = _scaled_mlp()
    with PortSession(spec, Options(device="cpu")) as port:
        report = train_on(port, TrainSpec(spec), steps=2)
    left = [r for r in report.rows if r.phase == "backward" and r.torch == "scale"]
    assert len(left) == 1 and left[0].ratio is None and left[0].note.startswith("not re-run alone (AttributeError: ")
    skipped = [n for n in report.notes if "skipped" in n]
    assert skipped == ["1 measurement skipped: the local backward of 'scale' (AttributeError: 'TorchScale' object has "
                       "no attribute 'factor')"]
    assert f"  note: {skipped[0]}" in render_text(report).splitlines()
    assert report.verdict == "pass", report.first_bad  # every other measurement was taken and is within budget


def test_the_note_names_the_first_skipped_and_counts_the_rest():
    skipped = [Skipped(f"measurement {i}", "ValueError: no") for i in range(5)]
    assert skipped_notes([]) == []
    assert skipped_notes(skipped[:1]) == ["1 measurement skipped: measurement 0 (ValueError: no)"]
    assert skipped_notes(skipped) == ["5 measurements skipped: measurement 0 (ValueError: no); measurement 1 "
                                      "(ValueError: no); measurement 2 (ValueError: no); and 2 more"]
    said = Skipped.of("a run", RuntimeError("line one\n   line two " + "x" * 200))
    assert said.why.startswith("RuntimeError: line one line two xxx") and len(said.why) == len("RuntimeError: ") + 120


def _in_place_activation_mlp():
    """train_mlp with torch's activation a module that works in place on its input (torchvision's
    MobileNetV2 has ReLU6(inplace=True) in every block); paddle's computes the same out of place."""
    spec = PortSpec.from_file(spec_path("train_mlp"))
    module = spec.module

    class TorchInPlace(module.TorchMLP):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.ReLU6(inplace=True)

        def forward(self, x):
            return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))

    class PaddleAct(module.PaddleMLP):
        def __init__(self):
            super().__init__()
            self.act = paddle.nn.ReLU6()

        def forward(self, x):
            return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))
    module.torch_model = lambda: (torch.manual_seed(0), TorchInPlace())[1]
    module.paddle_model = PaddleAct
    return spec


def test_a_module_working_in_place_on_its_input_is_re_run_alone():
    spec = _in_place_activation_mlp()
    with PortSession(spec, Options(device="cpu")) as port:
        report = train_on(port, TrainSpec(spec), steps=2)
    rows = [r for r in report.rows if r.phase == "backward" and r.torch.startswith("act ")]
    assert rows and all(r.ratio is not None for r in rows), rows  # its local backward measured
    assert not [n for n in report.notes if "skipped" in n], report.notes
    assert report.verdict == "pass", report.first_bad
