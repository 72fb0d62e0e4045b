"""State present on one side only is measured and named, not refused: a paddle tensor that no torch
tensor fills and that its layer reads (a sibling LSTM the forward calls instead of the one torch's
weights fill; a wrapper that copies its own parameter into the inner LSTM's), a paddle parameter the
paddle model never reads (filled from torch or not), a paddle-only persistable buffer. Each is a
finding in the report's notes, measured by perturbing the tensor; the check still runs, names the
layer whose output differs, and passes a port whose outputs agree. Clean pairs raise no finding."""
import json
import os

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.compare.unread import measure_reads
from converter.inmemory import convert_in_memory
from converter.spec import spec_from_functions
from helpers.cli import run_convert, run_verify

I, H, C = 6, 8, 3
HERE = os.path.dirname(os.path.abspath(__file__))


def x_of(*shape):
    return lambda: (np.random.default_rng(0).standard_normal(shape).astype("float32"),)


def findings(report) -> list[str]:
    return [n for n in report.forward.notes if n.startswith("finding:")]


# ------------------------------------------------------------------ torch: an encoder around an LSTM

class TorchEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(I, H, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class TorchTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head = TorchEncoder(), torch.nn.Linear(H, C)

    def forward(self, x):
        return self.head(self.encoder(x))


def torch_tagger():
    torch.manual_seed(0)
    return TorchTagger()


# ------------------------------------------------------------------ (a) a sibling LSTM the forward calls

class PaddleEncoder(paddle.nn.Layer):
    """The port keeps an LSTM named as torch's (which torch's weights fill) and, with `sibling`,
    calls another one it built beside it."""

    def __init__(self, sibling):
        super().__init__()
        self.rnn = paddle.nn.LSTM(I, H)
        self.sibling = sibling
        if sibling:
            self.lstm = paddle.nn.LSTM(I, H)

    def forward(self, x):
        return (self.lstm if self.sibling else self.rnn)(x)[0]


class PaddleTagger(paddle.nn.Layer):
    def __init__(self, sibling=False):
        super().__init__()
        self.encoder, self.head = PaddleEncoder(sibling), paddle.nn.Linear(H, C)

    def forward(self, x):
        return self.head(self.encoder(x))


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_an_lstm_the_forward_reads_but_no_torch_weight_fills_is_measured_and_named(strategy):
    spec = spec_from_functions(torch_tagger, lambda: PaddleTagger(sibling=True), x_of(2, 5, I))
    report = verify_port(spec, VerifyOptions(strategy=strategy))
    assert report.exit_code == 1
    bad = report.forward.first_bad
    assert (bad.torch, bad.paddle) == ("encoder.rnn", "encoder.lstm"), bad
    [reads, unread] = findings(report)
    assert reads.startswith("finding: paddle layer 'encoder.lstm' reads 4 tensor(s) that no torch tensor fills: "
                            "'weight_ih_l0' [32, 6], 'weight_hh_l0' [32, 8], 'bias_ih_l0' [32], 'bias_hh_l0' [32] "
                            "(perturbing each changed that layer's output"), reads
    assert "in 'encoder.rnn' ('weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0', a layer that never runs)" in reads
    assert "Make the port's forward read the tensors torch's weights fill" in reads
    assert unread.startswith("finding: paddle layer 'encoder.rnn' holds 4 tensor(s) that torch's weights fill and the "
                             "paddle model does not read on these inputs"), unread
    assert "that layer never runs" in unread and "torch reads them" in unread and "'encoder.rnn'" in unread
    # the unfilled LSTM's alias keys (paddle's '0.cell.weight_ih') are one tensor each with their key
    kept = "4 paddle parameter(s) that no torch tensor fills are left as the paddle model holds them"
    assert any(n.startswith(kept) for n in report.forward.notes), report.forward.notes


def test_verify_port_prints_the_findings_and_writes_them_to_the_json_report(tmp):
    spec = tmp / "sibling.py"
    spec.write_text(SPEC.format(here=HERE, torch="torch_tagger", paddle="PaddleTagger(sibling=True)"))
    r = run_verify("--spec", spec, "--device", "cpu", "--json", tmp / "report.json")
    assert r.code == 1, r
    assert "note: finding: paddle layer 'encoder.lstm' reads 4 tensor(s) that no torch tensor fills" in r.stdout, r.stdout
    notes = json.loads((tmp / "report.json").read_text())["notes"]
    assert sum(n.startswith("finding: paddle layer 'encoder.") for n in notes) == 2, notes


def test_under_mapping_loaded_the_unfilled_lstm_is_measured_as_loaded():
    def paddle_loaded():  # the port's weights as a user's converted checkpoint left them
        paddle_model = PaddleTagger(sibling=True)
        state, _, _, _ = convert_in_memory(torch_tagger(), paddle_model)
        paddle_model.set_state_dict(state | {k: v for k, v in paddle_model.state_dict().items() if k not in state})
        return paddle_model
    report = verify_port(spec_from_functions(torch_tagger, paddle_loaded, x_of(2, 5, I), mapping="loaded"),
                         VerifyOptions())
    assert report.exit_code == 1 and report.forward.first_bad.torch == "encoder.rnn", report.forward.first_bad
    assert not report.forward.weights.differ  # every weight the rules fill is torch's, bit for bit
    [reads, unread] = findings(report)
    assert reads.startswith("finding: paddle layer 'encoder.lstm' reads 4 tensor(s) that no torch tensor fills"), reads
    assert unread.startswith("finding: paddle layer 'encoder.rnn' holds 4 tensor(s) that torch's weights fill"), unread


def test_the_clean_lstm_pair_raises_no_finding():
    spec = spec_from_functions(torch_tagger, lambda: PaddleTagger(sibling=False), x_of(2, 5, I))
    report = verify_port(spec, VerifyOptions())
    assert report.exit_code == 0, report.forward.first_bad
    assert not findings(report) and not any("no torch tensor fills" in n for n in report.forward.notes), \
        report.forward.notes


def test_convert_weights_refuses_the_unfilled_lstm_and_says_how_to_measure_it(tmp):
    spec = tmp / "sibling.py"
    spec.write_text(SPEC.format(here=HERE, torch="torch_tagger", paddle="PaddleTagger(sibling=True)"))
    torch.save(torch_tagger().state_dict(), tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", spec)
    assert r.code == 2, r
    assert "fills 8 paddle key(s) from no torch tensor; do not map a torch tensor onto one only to fill it: " \
           "verify-port on the pair" in r.stderr, r.stderr
    assert "every key is mapped or dropped" not in r.stderr
    assert not (tmp / "out.pdparams").exists()


# ------------------------------------------------------------------ (a) a wrapper reading its own parameter

class WeightDrop(paddle.nn.Layer):
    """AWD-LSTM's weight drop as a port writes it: with `own`, the recurrent weight is the wrapper's
    own parameter, dropped in training and copied into the inner LSTM before each call."""

    def __init__(self, own):
        super().__init__()
        self.lstm, self.own = paddle.nn.LSTM(I, H), own
        if own:
            self.weight_hh_raw = self.create_parameter(self.lstm.weight_hh_l0.shape)

    def forward(self, x):
        if self.own:
            paddle.assign(paddle.nn.functional.dropout(self.weight_hh_raw, 0.5, training=self.training),
                          self.lstm.weight_hh_l0)
        return self.lstm(x)[0]


class PaddleWrapped(paddle.nn.Layer):
    def __init__(self, own=False):
        super().__init__()
        self.encoder = paddle.nn.Layer()
        self.encoder.rnn = WeightDrop(own)
        self.head = paddle.nn.Linear(H, C)

    def forward(self, x):
        return self.head(self.encoder.rnn(x))


# the rules a user writes for the wrapper: torch's LSTM into the inner one (no alias keys named)
INNER = {"name": "inner", "rules": [
    {"kind": "rename", "match": r"encoder\.rnn\.(?P<t>.*)", "to": r"encoder.rnn.lstm.\g<t>"},
    {"kind": "rename", "match": r"head\.(?P<t>weight|bias)", "to": r"head.\g<t>"},
    {"kind": "transpose", "key": "head.weight"}]}


@pytest.mark.parametrize("own", [True, False], ids=["own-weight", "clean"])
def test_a_wrapper_that_reads_its_own_parameter_instead_of_the_filled_one_is_named(own):
    spec = spec_from_functions(torch_tagger, lambda: PaddleWrapped(own), x_of(2, 5, I), mapping=INNER)
    report = verify_port(spec, VerifyOptions())
    notes = report.forward.notes
    if not own:  # the alias keys the rules leave out are the tensors they fill: nothing is kept or found
        assert report.exit_code == 0 and not findings(report), notes
        assert not any("no torch tensor fills" in n for n in notes), notes
        return
    assert report.exit_code == 1 and report.forward.first_bad.torch == "encoder.rnn", report.forward.first_bad
    [written, reads] = findings(report)
    assert written.startswith("finding: the paddle model's forward overwrites 1 tensor(s) that torch's weights fill, "
                              "so the values converted from torch are never read: 'encoder.rnn.lstm.weight_hh_l0' "
                              "(from torch's 'encoder.rnn.weight_hh_l0')"), written
    assert reads.startswith("finding: paddle layer 'encoder.rnn' reads 1 tensor(s) that no torch tensor fills: "
                            "'weight_hh_raw' [32, 8] (perturbing each changed that layer's output"), reads
    assert "in 'encoder.rnn.lstm' ('weight_hh_l0')" in reads


def test_convert_weights_writes_the_alias_keys_the_rules_leave_out_under_both_names(tmp):
    """paddle saves an LSTM's weights also as '0.cell.weight_ih' (one tensor, two keys): rules that
    map 'weight_ih_l0' fill both, in convert-weights --spec as in verify-port."""
    spec = tmp / "wrapped.py"
    spec.write_text(SPEC.format(here=HERE, torch="torch_tagger", paddle="PaddleWrapped(own=False)"))
    (tmp / "inner.json").write_text(json.dumps(INNER))
    torch.save(torch_tagger().state_dict(), tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", spec, "--mapping", tmp / "inner.json")
    assert r.code == 0, r
    assert "no missing or unexpected keys" in r.stderr, r.stderr
    from converter.io.pdparams import load_pdparams
    written = load_pdparams(str(tmp / "out.pdparams"))
    assert np.array_equal(written["encoder.rnn.lstm.0.cell.weight_ih"], written["encoder.rnn.lstm.weight_ih_l0"])
    assert np.array_equal(written["encoder.rnn.lstm.weight_ih_l0"], torch_tagger().encoder.rnn.weight_ih_l0.detach().numpy())


# ------------------------------------------------------------------ (b) a parameter the port never reads

class TorchNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.out = torch.nn.Linear(I, H), torch.nn.LayerNorm(H), torch.nn.Linear(H, C)

    def forward(self, x):
        return self.out(self.norm(self.fc(x)))


class BiaslessNorm(paddle.nn.LayerNorm):
    """A hand-written LayerNorm that holds a bias and forgets to add it."""

    def forward(self, x):
        return paddle.nn.functional.layer_norm(x, x.shape[-1:], self.weight, None, self._epsilon)


class PaddleNormed(paddle.nn.Layer):
    def __init__(self, norm=paddle.nn.LayerNorm, extra=False):
        super().__init__()
        self.fc, self.norm, self.out = paddle.nn.Linear(I, H), norm(H), paddle.nn.Linear(H, C)
        if extra:  # a parameter torch has nothing for, left over in the port
            self.scale = self.create_parameter([H])

    def forward(self, x):
        return self.out(self.norm(self.fc(x)))


@pytest.mark.parametrize("trained", [False, True], ids=["zero-bias", "trained-bias"])
def test_a_parameter_its_layer_never_reads_is_a_finding(trained):
    """torch's LayerNorm bias is zero as initialised: the outputs agree and the run passes, with the
    finding; once trained, the same port fails at the norm, with the same finding."""
    def torch_model():
        model = torch_normed()
        if trained:
            with torch.no_grad():
                model.norm.bias.copy_(torch.linspace(-1, 1, H))
        return model
    spec = spec_from_functions(torch_model, lambda: PaddleNormed(BiaslessNorm), x_of(2, 4, I))
    report = verify_port(spec, VerifyOptions())
    [found] = findings(report)
    assert found.startswith("finding: paddle layer 'norm' holds 1 tensor(s) that torch's weights fill and the paddle "
                            "model does not read on these inputs: 'bias' (from torch's 'norm.bias') (perturbing each "
                            "changed neither that layer's output nor the model's); torch reads them"), found
    assert "the port computes without these weights" in found
    if trained:
        assert report.exit_code == 1 and report.forward.first_bad.torch == "norm", report.forward.first_bad
    else:
        assert report.exit_code == 0, report.forward.first_bad


def torch_normed():
    torch.manual_seed(0)
    return TorchNormed()


def test_a_paddle_parameter_nothing_fills_or_reads_is_a_finding_that_does_not_fail():
    spec = spec_from_functions(torch_normed, lambda: PaddleNormed(extra=True), x_of(2, 4, I))
    report = verify_port(spec, VerifyOptions())
    assert report.exit_code == 0, report.forward.first_bad
    [found] = findings(report)
    assert found.startswith("finding: paddle layer the model itself holds 1 tensor(s) that no torch tensor fills and "
                            "the paddle model does not read on these inputs: 'scale' [8]"), found
    assert "remove them from the port if they are left over" in found


def test_a_clean_pair_with_a_branch_neither_side_takes_raises_no_finding():
    """A layer both sides hold and neither calls on these inputs (as an expert no token is routed
    to): a plain note, no finding."""
    class TorchBranch(TorchNormed):
        def __init__(self):
            super().__init__()
            self.long = torch.nn.Linear(H, H)

        def forward(self, x):
            h = self.norm(self.fc(x))
            return self.out(self.long(h) if x.shape[1] > 100 else h)

    class PaddleBranch(PaddleNormed):
        def __init__(self):
            super().__init__()
            self.long = paddle.nn.Linear(H, H)

        def forward(self, x):
            h = self.norm(self.fc(x))
            return self.out(self.long(h) if x.shape[1] > 100 else h)

    def torch_model():
        torch.manual_seed(0)
        return TorchBranch()
    report = verify_port(spec_from_functions(torch_model, PaddleBranch, x_of(2, 4, I)), VerifyOptions())
    assert report.exit_code == 0 and not findings(report), report.forward.notes
    assert any(n.startswith("2 paddle parameter(s) change no output on either side") and "'long.weight'" in n
               for n in report.forward.notes), report.forward.notes


# ------------------------------------------------------------------ the measurement itself

def test_measuring_puts_every_tensor_back_bit_for_bit():
    torch_model, paddle_model = torch_tagger(), PaddleTagger(sibling=True)
    state, _, _, _ = convert_in_memory(torch_model, paddle_model)
    paddle_model.set_state_dict(state | {k: v for k, v in paddle_model.state_dict().items() if k not in state})
    paddle_model.eval()
    before = {k: np.array(v.numpy()) for k, v in paddle_model.state_dict().items()}
    from converter.frameworks import paddle_side
    tensors = dict(paddle_model.state_dict())
    keys = ["encoder.rnn.weight_ih_l0", "encoder.lstm.weight_ih_l0", "head.bias"]
    readings = measure_reads(paddle_side, paddle_model, x_of(2, 5, I)(), "cpu", tensors, keys, set(keys))
    assert {k: (r.read, r.ran) for k, r in readings.items()} == {
        "encoder.rnn.weight_ih_l0": (False, False), "encoder.lstm.weight_ih_l0": (True, True), "head.bias": (True, True)}
    assert readings["head.bias"].at == "head" and readings["head.bias"].change > 0
    for key, value in paddle_model.state_dict().items():
        assert np.array_equal(value.numpy(), before[key]), key


def test_a_layer_whose_output_changes_from_run_to_run_is_not_measured_for_a_tensor_it_reads():
    class Noisy(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.weight = self.create_parameter([I, H])

        def forward(self, x):  # dropout active in eval: paddle's functional dropout defaults to training=True
            return paddle.nn.functional.dropout(x @ self.weight, 0.5)

    from converter.frameworks import paddle_side
    model = Noisy()
    model.eval()
    tensors = dict(model.state_dict())
    readings = measure_reads(paddle_side, model, x_of(2, I)(), "cpu", tensors, ["weight"], {"weight"})
    assert readings["weight"].read is None and "other outputs when run again" in readings["weight"].why, readings


def test_a_model_whose_forward_raises_is_said_not_measured():
    from converter.compare.onesided import state_findings
    torch_model, paddle_model = torch_normed(), PaddleNormed()
    _, plan, _, _ = convert_in_memory(torch_model, paddle_model)
    notes = state_findings(plan, torch_model, paddle_model, x_of(2, 4, I + 1)(), "cpu")  # one feature too many
    assert len(notes) == 1 and notes[0].startswith("whether the paddle model reads each of its parameters was not "
                                                   "measured: the model's forward raised"), notes


# ------------------------------------------------------------------ (c) a paddle-only persistable buffer

SPEC = '''
import sys
sys.path.insert(0, {here!r})
from test_one_sided_state import *

torch_model = {torch}

def paddle_model():
    return {paddle}

inputs = x_of(2, 5, I)
'''


class TorchPositions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = torch.nn.Embedding(8, I), torch.nn.Linear(I, C)

    def forward(self, x):
        return self.fc(x + self.emb(torch.arange(x.shape[1])))


class PaddlePositions(paddle.nn.Layer):
    """The port keeps its position ids as a persistable buffer, which torch's model has not."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc = paddle.nn.Embedding(8, I), paddle.nn.Linear(I, C)
        self.register_buffer("position_ids", paddle.arange(8, dtype="int64").unsqueeze(0), persistable=True)

    def forward(self, x):
        return self.fc(x + self.emb(self.position_ids[:, :x.shape[1]]))


def torch_positions():
    torch.manual_seed(0)
    return TorchPositions()


@pytest.mark.parametrize("rules", [False, True], ids=["inferred", "rule-file"])
def test_a_paddle_only_buffer_is_accepted_by_both_commands(tmp, rules):
    spec = tmp / "positions.py"
    spec.write_text(SPEC.format(here=HERE, torch="torch_positions", paddle="PaddlePositions()"))
    torch.save(torch_positions().state_dict(), tmp / "m.pt")
    mapping = []
    if rules:
        (tmp / "rules.json").write_text(json.dumps({"name": "positions", "rules": [
            {"kind": "rename", "match": r"(?P<k>.*)", "to": r"\g<k>"}, {"kind": "transpose", "key": "fc.weight"}]}))
        mapping = ["--mapping", tmp / "rules.json"]
    r = run_verify("--spec", spec, "--device", "cpu", *mapping)
    assert r.code == 0, r
    assert "1 with no torch counterpart (position_ids)" in r.stdout and "finding:" not in r.stdout, r.stdout
    r = run_convert(tmp / "m.pt", tmp / "out.pdparams", "--spec", spec, *mapping)
    assert r.code == 0, r
    assert "1 paddle state tensor(s) that no torch tensor fills are not written" in r.stderr, r.stderr
    from converter.io.pdparams import load_pdparams
    assert sorted(load_pdparams(str(tmp / "out.pdparams"))) == ["emb.weight", "fc.bias", "fc.weight"]
