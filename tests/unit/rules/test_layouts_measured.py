"""Each 2-D weight's layout is measured from the two layers: paddle.compat layers (torch's layout,
what PaConvert writes for nn.Linear) are never transposed, square ones included; paddle.nn.Linear
still is; a paddle Linear whose own forward computes with torch's layout is a finding; an inferred
plan that cannot be completed is still written by --emit-mapping, with its open items."""
import json

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.rules.infer import infer_ruleset
from converter.spec import spec_from_functions
from helpers.cli import run_convert

WIDTHS = {"square": (8, 8, 8), "wide": (8, 16, 4)}


class TorchNet(torch.nn.Module):
    def __init__(self, d, h, o):
        super().__init__()
        self.query = torch.nn.Linear(d, d)
        self.up = torch.nn.Linear(d, h)
        self.norm = torch.nn.LayerNorm(h)
        self.out = torch.nn.Linear(h, o)

    def forward(self, x):
        return self.out(self.norm(torch.relu(self.up(self.query(x)))))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, d, h, o, linear):
        super().__init__()
        self.query, self.up, self.out = linear(d, d), linear(d, h), linear(h, o)
        self.norm = paddle.nn.LayerNorm(h)

    def forward(self, x):
        return self.out(self.norm(paddle.nn.functional.relu(self.up(self.query(x)))))


class TorchLayoutLinear(paddle.nn.Linear):
    """A hand-written paddle Linear that keeps torch's [out, in] weight and computes with it."""

    def __init__(self, fan_in, fan_out):
        super().__init__(fan_out, fan_in)  # weight [out, in]
        self.bias = self.create_parameter([fan_out], is_bias=True)

    def forward(self, x):
        return paddle.nn.functional.linear(x, self.weight.T, self.bias)


def spec(widths, linear):
    def torch_model():
        torch.manual_seed(0)
        return TorchNet(*widths)
    return spec_from_functions(torch_model, lambda: PaddleNet(*widths, linear),
                               lambda: (np.random.default_rng(0).standard_normal((2, 5, widths[0])).astype("float32"),))


def transposed_keys(ruleset):
    return sorted(r.spec["key"] for r in ruleset.rules if r.spec["kind"] == "transpose")


@pytest.mark.parametrize("shape", sorted(WIDTHS))
def test_compat_linear_is_never_transposed_and_the_port_passes(shape):
    s = spec(WIDTHS[shape], paddle.compat.nn.Linear)
    ruleset = infer_ruleset(s.torch_model(), s.paddle_model())
    assert transposed_keys(ruleset) == []
    assert any("running the layer" in note and "'query.weight'" in note for note in ruleset.notes), ruleset.notes
    if shape == "wide":
        assert any("its shape" in note and "'up.weight'" in note for note in ruleset.notes), ruleset.notes
    report = verify_port(s, VerifyOptions())
    assert report.exit_code == 0, report.forward.first_bad
    assert any("layout measured" in note for note in report.forward.notes)


@pytest.mark.parametrize("shape", sorted(WIDTHS))
def test_paddle_linear_is_still_transposed_without_a_note(shape):
    s = spec(WIDTHS[shape], paddle.nn.Linear)
    ruleset = infer_ruleset(s.torch_model(), s.paddle_model())
    assert transposed_keys(ruleset) == ["out.weight", "query.weight", "up.weight"]
    assert ruleset.notes == ()


def test_a_paddle_linear_computing_with_torchs_layout_is_a_finding():
    s = spec(WIDTHS["square"], TorchLayoutLinear)
    ruleset = infer_ruleset(s.torch_model(), s.paddle_model())
    assert transposed_keys(ruleset) == []
    findings = [n for n in ruleset.notes if n.startswith("finding:")]
    assert len(findings) == 3 and "'query.weight'" in findings[0], ruleset.notes
    assert verify_port(s, VerifyOptions()).exit_code == 0


def test_a_symmetric_square_weight_keeps_the_familys_layout():
    def torch_model():
        net = TorchNet(*WIDTHS["square"])
        with torch.no_grad():
            net.query.weight.copy_(net.query.weight + net.query.weight.T)
        return net
    ruleset = infer_ruleset(torch_model(), PaddleNet(*WIDTHS["square"], paddle.nn.Linear))
    assert "query.weight" in transposed_keys(ruleset)


def write_spec(tmp, paddle_head: str, extra: str = ""):
    path = tmp / "spec.py"
    path.write_text(f'''
import numpy as np, paddle, torch
import sys; sys.path.insert(0, {str(tmp)!r})
from port import TorchNet

class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.query, self.up = paddle.compat.nn.Linear(8, 8), paddle.compat.nn.Linear(8, 16)
        self.norm = paddle.nn.LayerNorm(16)
        self.{paddle_head} = paddle.compat.nn.Linear(16, 4)
        {extra}

    def forward(self, x):
        return self.{paddle_head}(self.norm(paddle.nn.functional.relu(self.up(self.query(x)))))

def torch_model():
    torch.manual_seed(0)
    return TorchNet(8, 16, 4)

def paddle_model():
    return PaddleNet()

def inputs():
    return (np.ones((1, 2, 8), "float32"),)
''')
    (tmp / "port.py").write_text("import torch\n" + _torch_source())
    torch.manual_seed(0)
    torch.save(TorchNet(8, 16, 4).state_dict(), tmp / "m.pt")
    return path


def _torch_source():
    import inspect
    return inspect.getsource(TorchNet)


def test_convert_weights_with_a_spec_converts_a_compat_port(tmp):
    s = write_spec(tmp, "out")
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", s, "--emit-mapping", tmp / "rules.json")
    assert r.code == 0, r
    assert "layout measured" in r.stderr
    assert not any(rule["kind"] == "transpose" for rule in json.loads((tmp / "rules.json").read_text())["rules"])
    assert "no missing or unexpected keys" in r.stderr


def test_an_incomplete_inferred_plan_is_written_with_its_open_items(tmp):
    s = write_spec(tmp, "head", extra="self.extra = paddle.nn.Linear(3, 3)  # two left over: none paired")
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", s, "--emit-mapping", tmp / "rules.json")
    assert r.code == 2, r
    assert not (tmp / "out.pdparams").exists()
    body = json.loads((tmp / "rules.json").read_text())
    assert len(body["open"]) == 1 and "'out'" in body["open"][0]
    assert {rule["key"] for rule in body["rules"]} >= {"query.weight", "up.weight"}
    again = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--mapping", tmp / "rules.json")
    assert again.code == 2 and "1 open item(s)" in again.stderr and len(again.stderr.strip().splitlines()) == 1, again


def test_paddle_only_state_is_left_to_the_paddle_model_by_convert_weights(tmp):
    """A persistable buffer paddle's port keeps (position ids) and torch's model has not: converted
    with a note, the file leaves it out, and the paddle model keeps its own."""
    path = tmp / "spec.py"
    path.write_text('''
import numpy as np, paddle, torch

class TorchEmbed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

class PaddleEmbed(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = paddle.nn.Embedding(10, 4)
        self.register_buffer("position_ids", paddle.arange(8, dtype="int64").unsqueeze(0))

def torch_model():
    torch.manual_seed(0)
    return TorchEmbed()

def paddle_model():
    return PaddleEmbed()

def inputs():
    return (np.arange(6, dtype="int64").reshape(2, 3),)
''')
    torch.manual_seed(0)
    torch.save({"emb.weight": torch.randn(10, 4)}, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", path)
    assert r.code == 0, r
    assert "1 paddle state tensor(s) that no torch tensor fills are not written" in r.stderr and "position_ids" in r.stderr
    from converter.io.pdparams import load_pdparams
    assert sorted(load_pdparams(str(tmp / "out.pdparams"))) == ["emb.weight"]


def test_a_compat_multihead_attention_takes_torchs_tensors_by_name():
    """paddle.compat.nn.MultiheadAttention keeps torch's names and layouts (in_proj_weight [3E, E]):
    it takes them as they are, and the pair passes."""
    class TorchAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    class PaddleAttention(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.attn = paddle.compat.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    def torch_model():
        torch.manual_seed(0)
        return TorchAttention()
    s = spec_from_functions(torch_model, PaddleAttention,
                            lambda: (np.random.default_rng(0).standard_normal((2, 5, 8)).astype("float32"),))
    ruleset = infer_ruleset(s.torch_model(), s.paddle_model())
    assert transposed_keys(ruleset) == []
    assert {r.spec["key"]: r.spec["to"] for r in ruleset.rules}["attn.in_proj_weight"] == "attn.in_proj_weight"
    assert verify_port(s, VerifyOptions()).exit_code == 0
