"""mapping = "loaded" (verify-port --mapping loaded): the paddle model keeps the weights it was
loaded with; each is checked bit for bit against torch's under the rules, and the run verifies
as usual. A loaded weight that differs fails the run with a diagnosis naming it."""

import json
import os
import sys

import numpy as np
import paddle
import pytest
import torch

from helpers.cli import SPECS, run_verify
from converter.api import PortSpec, VerifyOptions, convert_weights, verify_port
from converter.errors import UserError
from converter.verify.page import render_html
from converter.verify.report import render_text

H, FFN = 16, 32


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(H, FFN)
        self.down = torch.nn.Linear(FFN, H)
        self.norm = torch.nn.LayerNorm(H)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.up = paddle.nn.Linear(H, FFN)
        self.down = paddle.nn.Linear(FFN, H)
        self.norm = paddle.nn.LayerNorm(H)

    def forward(self, x):
        return self.norm(x + self.down(paddle.nn.functional.gelu(self.up(x))))


def _torch_model():
    torch.manual_seed(0)
    return TorchMLP().eval()


def _inputs():
    return (np.random.default_rng(0).standard_normal((2, 5, H)).astype("float32"),)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Torch's weights as a user has them on disk for paddle: a checkpoint converted by convert-weights."""
    where = tmp_path_factory.mktemp("loaded")
    torch.save(_torch_model().state_dict(), where / "model.pt")
    src = str(where / "model.pt")
    result = convert_weights(src, str(where / "model.pdparams"), spec=PortSpec(_torch_model, PaddleMLP, _inputs))
    assert result.ok
    return str(where / "model.pdparams")


def _loaded(path, change=None):
    """paddle_model(): the port loaded with its own weights from `path`, then `change`d."""
    def build():
        model = PaddleMLP()
        model.set_state_dict(paddle.load(path))
        if change is not None:
            change(model)
        return model
    return build


def _one_ulp_up(model):
    w = model.down.weight.numpy()
    w[3, 7] = np.nextafter(w[3, 7], np.float32(np.inf))
    model.down.weight.set_value(w)


def test_clean_loaded_weights_pass_and_are_left_as_loaded(converted):
    spec = PortSpec(_torch_model, _loaded(converted), _inputs, mapping="loaded")
    paddle_model = spec.paddle_model()
    before = {k: np.array(v.numpy()) for k, v in paddle_model.state_dict().items()}
    report = verify_port(spec, VerifyOptions(device="cpu", bisect=True)).forward
    assert report.verdict == "pass", render_text(report)
    assert report.weights.checked == len(before) == 6 and report.weights.differ == []
    assert "loaded weights: all 6 equal to torch's under mapping 'inferred', bit for bit" in render_text(report)
    assert report.notes[0].startswith("mapping 'loaded': the paddle model keeps the weights it was loaded with")
    assert "under the rule set 'inferred' (inferred from the two models)" in report.notes[0]
    for k, v in paddle_model.state_dict().items():
        assert np.array_equal(v.numpy(), before[k]), k
    assert report.to_json()["loaded_weights"] == {"mapping": "inferred", "checked": 6, "differ": []}


def test_one_weight_off_by_one_ulp_fails_though_every_layer_is_within_budget(converted):
    spec = PortSpec(_torch_model, _loaded(converted, _one_ulp_up), _inputs, mapping="loaded")
    report = verify_port(spec, VerifyOptions(device="cpu", bisect=True)).forward
    assert report.first_bad is None  # the layers cannot see one ulp ...
    assert report.verdict == "fail" and report.exit_code == 1  # ... the weight check does
    (diff,) = report.weights.differ
    expected = _torch_model().down.weight.detach().numpy().T
    assert diff.paddle == "down.weight" and diff.torch == "down.weight"
    assert diff.index == (3, 7) and diff.differ == 1 and diff.size == FFN * H
    assert diff.torch_value == float(expected[3, 7])
    assert diff.paddle_value == float(np.nextafter(expected[3, 7], np.float32(np.inf)))
    assert diff.max_abs == diff.paddle_value - diff.torch_value > 0
    first = report.diagnosis[0]
    assert first.layer == "down.weight"
    assert "loaded paddle weight 'down.weight' [32, 16] differs from torch's 'down.weight'" in first.cause
    assert "in 1 of 512 element(s); the worst at [3, 7]" in first.cause
    text = render_text(report)
    assert "loaded weights that differ from torch's under mapping 'inferred', bit for bit (1 of 6):" in text
    assert "FAIL: 1 of 6 loaded paddle weight(s) differ from torch's" in text
    row = next(line for line in text.splitlines() if line.startswith("down.weight"))
    assert "1/512" in row and "[3, 7]" in row and f"{diff.torch_value:.9g}" in row
    assert "down.weight" in render_html(report) and "Loaded weights that differ" in render_html(report)
    body = report.to_json()
    assert body["verdict"] == "fail" and body["loaded_weights"]["differ"][0]["index"] == [3, 7]


def test_a_weight_changed_enough_to_matter_is_named_before_the_layer_it_breaks(converted):
    def scaled(model):
        model.up.bias.set_value(model.up.bias.numpy() * 1.5)
    spec = PortSpec(_torch_model, _loaded(converted, scaled), _inputs, mapping="loaded")
    report = verify_port(spec, VerifyOptions(device="cpu", bisect=True)).forward
    assert report.verdict == "fail"
    assert report.first_bad is not None and report.first_bad.torch == "up"
    assert [d.paddle for d in report.weights.differ] == ["up.bias"]
    assert report.diagnosis[0].layer == "up.bias" and "loaded paddle weight 'up.bias'" in report.diagnosis[0].cause
    assert sum(d.layer == "up.bias" for d in report.diagnosis) == 1  # said once, not again by the generic check


def test_a_square_weight_loaded_untransposed_is_said_so():
    class TorchSquare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(H, H)

        def forward(self, x):
            return self.proj(x)

    def paddle_model():
        model = paddle.nn.Sequential()
        model.add_sublayer("proj", paddle.nn.Linear(H, H))
        t = torch_model()
        model.set_state_dict({"proj.weight": t.proj.weight.detach().numpy(),  # [out, in]: not transposed
                              "proj.bias": t.proj.bias.detach().numpy()})
        return model

    def torch_model():
        torch.manual_seed(1)
        return TorchSquare()

    report = verify_port(PortSpec(torch_model, paddle_model, _inputs, mapping="loaded"),
                         VerifyOptions(device="cpu")).forward
    assert report.verdict == "fail"
    (diff,) = report.weights.differ
    assert diff.paddle == "proj.weight" and diff.note == "it holds torch's tensor transposed"
    assert "is torch's 'proj.weight' transposed" in report.diagnosis[0].cause


@pytest.mark.slow


def test_loaded_pairs_through_the_shipped_rule_set_when_none_can_be_inferred():
    """HF BERT names against a PaddleNLP-style port: inference cannot pair them, the shipped `bert`
    set does; the port loaded with torch's weights converted under it passes."""
    sys.path.insert(0, SPECS)
    import bert_paddlenlp_names as S
    from converter.inmemory import convert_in_memory

    def paddle_model():
        model = S.paddle_model()
        model.set_state_dict(convert_in_memory(S.torch_model(), S.paddle_model(), "bert")[0])
        return model
    report = verify_port(PortSpec(S.torch_model, paddle_model, S.inputs, mapping="loaded"),
                         VerifyOptions(device="cpu")).forward
    assert report.verdict == "pass", render_text(report)
    assert "under the rule set 'bert' (detected from torch's keys)" in report.notes[0]
    assert report.weights.differ == [] and report.weights.checked == len(S.paddle_model().state_dict())


def test_loaded_with_rules_nothing_can_give_is_one_line():
    class Other(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.first = paddle.nn.Linear(H, FFN)
            self.second = paddle.nn.Linear(FFN, H)
            self.third = paddle.nn.LayerNorm(H)
            self.fourth = paddle.nn.Linear(H, H)

    with pytest.raises(UserError) as err:
        verify_port(PortSpec(_torch_model, Other, _inputs, mapping="loaded"), VerifyOptions(device="cpu"))
    assert err.value.message.startswith("mapping 'loaded': cannot infer a mapping from the two models")
    assert "no shipped rule set fits the two models" in err.value.message


SPEC = '''
import sys
sys.path.insert(0, {here!r})
import paddle
from test_verify_loaded import _torch_model as torch_model, _inputs as inputs, _loaded, _one_ulp_up

paddle_model = _loaded({path!r}, {change})
'''


@pytest.mark.parametrize("change, code", [("None", 0), ("_one_ulp_up", 1)])
def test_verify_port_mapping_loaded(tmp_path, converted, change, code):
    spec = tmp_path / "loaded_spec.py"
    spec.write_text(SPEC.format(here=os.path.dirname(os.path.abspath(__file__)), path=converted, change=change))
    r = run_verify("--spec", spec, "--device", "cpu", "--mapping", "loaded", "--json", tmp_path / "r.json")
    assert r.code == code, r
    body = json.loads((tmp_path / "r.json").read_text())
    assert body["verdict"] == ("pass" if code == 0 else "fail")
    assert body["loaded_weights"]["checked"] == 6
    assert [d["paddle"] for d in body["loaded_weights"]["differ"]] == ([] if code == 0 else ["down.weight"])
    if code:
        assert "FAIL: 1 of 6 loaded paddle weight(s) differ from torch's under mapping 'inferred'" in r.stdout
        assert "cause: loaded paddle weight 'down.weight'" in r.stdout
    else:
        assert "PASS" in r.stdout and "loaded weights: all 6 equal" in r.stdout
