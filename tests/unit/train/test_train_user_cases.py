"""Ports users reported, built from plain torch and paddle classes: what verify-port --train says of
each (verdict, culprit, cause and hint), and the paddle rules it relies on, measured on the paddle
installed."""

import re

import numpy as np
import paddle
import pytest
import torch

from converter.compare.precision import U32
from converter.spec import PortSpec
from converter.train.report import render_text
from converter.compare.upstream import ADAMAX_EPSILON, BATCHNORM_VARIANCE, CROSS_ENTROPY_IGNORED, adamax_norm
from helpers.cli import spec_path
from helpers.train import train_check

STEPS = 4
V, D, C, B, T = 11, 8, 5, 4, 6  # the embedding tagger: vocabulary, width, classes, batch, length
IGNORED = -100


def _spec(name, **overrides):
    spec = PortSpec.from_file(spec_path(name))
    for key, value in overrides.items():
        setattr(spec.module, key, value)
    return spec


def _diagnosis(report):
    assert len(report.diagnosis) >= 1, report.first_bad
    return report.diagnosis[0]


# the paddle rules, measured ---------------------------------------------------------------------
def test_paddle_cross_entropy_divides_by_every_label_under_a_negative_ignore_index():
    """The data behind CROSS_ENTROPY_IGNORED: paddle's mean is the sum over the counted labels
    divided by all of them (8), not by those counted (5), as torch's is."""
    logits = np.random.default_rng(0).standard_normal((8, C)).astype(np.float32)
    labels = np.array([IGNORED] * 3 + [0, 1, 2, 3, 4], np.int64)
    got = float(paddle.nn.CrossEntropyLoss(ignore_index=IGNORED)(paddle.to_tensor(logits), paddle.to_tensor(labels)))
    each = torch.nn.functional.cross_entropy(torch.from_numpy(logits).double(), torch.from_numpy(labels),
                                             ignore_index=IGNORED, reduction="none")
    assert got == pytest.approx(float(each.sum()) / 8, rel=1e-5)
    assert got != pytest.approx(float(each.sum()) / 5, rel=1e-2)
    assert CROSS_ENTROPY_IGNORED.said().startswith(f"paddle {paddle.__version__}")


def test_paddle_adamax_puts_epsilon_on_the_norm():
    """The data behind ADAMAX_EPSILON: one paddle Adamax step from a fresh state on gradients that
    tell the two rules apart (0 and a gradient below epsilon)."""
    g = np.array([0.0, 1e-3, 0.5, -2.0], np.float32)
    p = paddle.create_parameter([4], "float32")
    p.set_value(np.zeros(4, np.float32))
    opt = paddle.optimizer.Adamax(1.0, beta1=0.9, beta2=0.5, epsilon=1e-2, parameters=[p])
    p.grad = paddle.to_tensor(g)
    opt.step()
    norm = opt._accumulators["inf_norm"][p.name].numpy()
    zero = np.zeros(4)
    np.testing.assert_allclose(norm, adamax_norm(zero, g.astype(np.float64), 0.5, 1e-2, "paddle"), rtol=1e-6)
    assert np.max(np.abs(norm - adamax_norm(zero, g.astype(np.float64), 0.5, 1e-2, "torch"))) > 5e-3
    t = torch.zeros(4, requires_grad=True)
    topt = torch.optim.Adamax([t], lr=1.0, betas=(0.9, 0.5), eps=1e-2)
    t.grad = torch.from_numpy(g)
    topt.step()
    np.testing.assert_allclose(topt.state[t]["exp_inf"].numpy(), adamax_norm(zero, g, 0.5, 1e-2, "torch"), rtol=1e-6)


# 1. BatchNorm momentum left as torch's -------------------------------------------------------------
@pytest.mark.slow
def test_batchnorm_momentum_left_as_torchs_follows_the_batch_too_fast():
    spec = _spec("train_cnn")
    spec.module.paddle_model = lambda: spec.module.PaddleCNN(momentum=0.1)
    report = train_check(spec, steps=STEPS, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.phase == "steps" and report.first_bad.torch.startswith("bn.running_")
    d = _diagnosis(report)
    assert d.layer == "bn" and d.kind == "momentum"
    # paddle's rule r = m r + (1 - m) batch with m = 0.1 keeps a tenth: it follows the batch fast
    assert "keep 0.1 of their value and take 0.9 of the batch's (torch's keep 0.9, take 0.1)" in d.cause
    assert "far too fast" in d.cause and "too slowly" not in d.cause
    near, far = map(float, re.search(r"momentum 0\.1 end (\S+) from .*?, with 0\.9 \(1 - torch's\) (\S+)$",
                                     d.cause).groups())
    assert near <= 0.1 * far, d.cause  # the replay with paddle's momentum is what paddle did
    assert d.hint == "give paddle's BatchNorm momentum=0.9 (1 - torch's)"


# 2. Embedding with padding_idx on torch's side only -----------------------------------------------
class TorchTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D, padding_idx=0)  # no gradient reaches row 0
        self.fc = torch.nn.Linear(D, C)

    def forward(self, ids):
        return self.fc(torch.tanh(self.emb(ids)))


class PaddleTagger(paddle.nn.Layer):
    def __init__(self, padding_idx=None):
        super().__init__()
        self.emb = paddle.nn.Embedding(V, D, padding_idx=padding_idx)
        self.fc = paddle.nn.Linear(D, C)

    def forward(self, ids):
        return self.fc(paddle.tanh(self.emb(ids)))


def _padded_ids(rng):
    ids = rng.integers(1, V, (B, T))
    ids[:, -2:] = 0  # padding at the end of every sequence
    return ids.astype(np.int64)


def _tagger(paddle_model):
    def batches():
        rng = np.random.default_rng(1)
        return [((_padded_ids(rng),), rng.integers(0, C, (B, T)).astype(np.int64)) for _ in range(3)]
    return _spec("train_mlp", torch_model=lambda: (torch.manual_seed(0), TorchTagger())[1], paddle_model=paddle_model,
                 inputs=lambda: (_padded_ids(np.random.default_rng(0)),), batches=batches,
                 torch_loss=lambda o, t: torch.nn.functional.cross_entropy(o.reshape(-1, C), t.reshape(-1)),
                 paddle_loss=lambda o, t: paddle.nn.functional.cross_entropy(o.reshape([-1, C]), t.reshape([-1])))


@pytest.mark.slow
def test_embedding_padding_idx_on_torchs_side_only_is_found_by_re_running_its_backward():
    report = train_check(_tagger(PaddleTagger), steps=STEPS, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    fb = report.first_bad
    assert (fb.phase, fb.torch, fb.paddle) == ("backward", "emb.weight", "emb.weight")
    d = _diagnosis(report)
    assert d.layer == "emb" and d.kind == "setting"
    assert "has padding_idx=None" in d.cause and "with padding_idx=0 gives torch's gradient" in d.cause
    assert d.cause.endswith("confirmed by re-running") and "PyLayer" not in d.cause + d.hint
    assert d.hint == "construct paddle's Embedding with padding_idx=0"
    # the hint followed, the port trains as torch's
    fixed = train_check(_tagger(lambda: PaddleTagger(padding_idx=0)), steps=STEPS, device="cpu")
    assert fixed.verdict == "pass" and fixed.exit_code == 0, fixed.first_bad


class TorchRound(torch.nn.Module):
    def forward(self, x):
        return torch.round(x * 4) / 4  # no gradient passes a rounding


class PaddleRoundPassing(paddle.nn.Layer):
    def forward(self, x):
        return x + (paddle.round(x * 4) / 4 - x).detach()  # the same values, the gradient passed straight on


def _quantized(torch_cls, paddle_cls):
    module = PortSpec.from_file(spec_path("train_mlp")).module

    class TorchQ(module.TorchMLP):
        def __init__(self):
            super().__init__()
            self.quant = torch_cls()

        def forward(self, x):
            return self.fc2(self.quant(torch.tanh(self.fc1(x))))

    class PaddleQ(module.PaddleMLP):
        def __init__(self):
            super().__init__()
            self.quant = paddle_cls()

        def forward(self, x):
            return self.fc2(self.quant(paddle.tanh(self.fc1(x))))
    return _spec("train_mlp", torch_model=lambda: (torch.manual_seed(0), TorchQ())[1], paddle_model=PaddleQ)


@pytest.mark.slow
def test_a_backward_no_setting_reproduces_is_named_by_place_only():
    """A layer whose gradient differs by its ops (a straight-through rounding against torch's round),
    with no setting to change: the cause says where and that no re-run reproduced it, and guesses
    nothing."""
    report = train_check(_quantized(TorchRound, PaddleRoundPassing), steps=STEPS, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.phase == "backward" and report.first_bad.torch.startswith("quant"), report.first_bad
    d = _diagnosis(report)
    assert d.layer == "quant" and d.kind == "backward"
    assert "no setting of the layer re-run with torch's value reproduces torch's gradient" in d.cause
    assert "confirmed" not in d.cause and "PyLayer" not in d.cause + d.hint


# 3. Cross-entropy with ignore_index and reduction "mean" ------------------------------------------
def _ignoring(paddle_loss):
    module = PortSpec.from_file(spec_path("train_mlp")).module

    def batches():
        rng = np.random.default_rng(1)
        out = []
        for _ in range(4):
            labels = rng.integers(0, module.C, module.B).astype(np.int64)
            labels[:3] = IGNORED
            out.append(((rng.standard_normal((module.B, module.D)).astype(np.float32),), labels))
        return out
    return _spec("train_mlp", batches=batches, paddle_loss=paddle_loss,
                 torch_loss=lambda o, t: torch.nn.CrossEntropyLoss(ignore_index=IGNORED)(o, t))


def _counted_mean(o, t):
    losses = paddle.nn.functional.cross_entropy(o, t, ignore_index=IGNORED, reduction="none")
    return losses.sum() / (t != IGNORED).astype(losses.dtype).sum()


@pytest.mark.slow
def test_cross_entropy_ignore_index_mean_over_every_label_is_confirmed_by_re_running():
    report = train_check(_ignoring(lambda o, t: paddle.nn.CrossEntropyLoss(ignore_index=IGNORED)(o, t)),
                         steps=STEPS, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.phase == "loss"
    d = _diagnosis(report)
    assert d.layer == "loss" and d.kind == "cross entropy"
    # train_mlp's batch of 8 with its first 3 labels ignored
    assert "divides the summed loss by all 8 labels, the 3 labels -100 included, torch's by the 5 counted" in d.cause
    assert "confirmed by re-running" in d.cause and f"{CROSS_ENTROPY_IGNORED.said()}'s cross_entropy" in d.cause
    assert d.hint.endswith("losses.sum() / (labels != -100).sum()")
    # the hint followed, the losses agree
    fixed = train_check(_ignoring(_counted_mean), steps=STEPS, device="cpu")
    assert fixed.verdict == "pass" and fixed.exit_code == 0, fixed.first_bad


# 4. Adamax ---------------------------------------------------------------------------------------
def _adamax(eps=1e-8):
    return _spec("train_mlp",
                 torch_optimizer=lambda m: torch.optim.Adamax(m.parameters(), lr=2e-3, betas=(0.9, 0.999), eps=1e-8),
                 paddle_optimizer=lambda m: paddle.optimizer.Adamax(2e-3, beta1=0.9, beta2=0.999, epsilon=eps,
                                                                    parameters=m.parameters()))


@pytest.mark.slow
def test_adamax_passes_and_says_paddles_update_rule_once():
    report = train_check(_adamax(), steps=STEPS, device="cpu")
    assert report.verdict == "pass" and report.exit_code == 0, report.first_bad
    assert any(r.phase == "optimizer" and r.paddle == "fc1.weight inf_norm" for r in report.rows)  # its state compared
    text = render_text(report)
    said = [line for line in text.splitlines() if ADAMAX_EPSILON.line() in line]
    assert len(said) == 1, text
    # the rules differ measurably here: epsilon is far above fp32's rounding of the norm on some element
    gap = float(re.search(r"by at most (\S+) relative", said[0]).group(1))
    assert gap > U32


@pytest.mark.slow
def test_adamax_epsilon_of_another_value_is_named():
    report = train_check(_adamax(eps=1e-6), steps=STEPS, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.phase == "optimizer"
    d = _diagnosis(report)
    assert "epsilon: torch 1e-08, paddle 1e-06" in d.cause and "reproduces paddle's step" in d.cause


# 6. BatchNorm's running variance -----------------------------------------------------------------
@pytest.mark.slow
def test_batchnorm_biased_running_variance_is_said_once():
    report = train_check(_spec("train_cnn"), steps=STEPS, device="cpu")
    assert report.verdict == "pass" and report.exit_code == 0, report.first_bad
    lines = render_text(report).splitlines()
    said = [line for line in lines if BATCHNORM_VARIANCE.paddle in line]
    assert len(said) == 1, lines
    assert said[0].startswith(f"  note: convention: paddle {paddle.__version__} updates BatchNorm's running variance")
    assert "'bn._variance', 'bn2._variance'" in said[0]


def test_batchnorm_running_variance_rule_holds_on_the_paddle_installed():
    """The data behind BATCHNORM_VARIANCE: one training step of paddle's BatchNorm from variance 1
    with momentum 0 leaves the biased batch variance."""
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    bn = paddle.nn.BatchNorm1D(3, momentum=0.0)
    bn.train()
    bn(paddle.to_tensor(x))
    np.testing.assert_allclose(bn._variance.numpy(), x.astype(np.float64).var(axis=0, ddof=0), rtol=1e-5)
    assert not np.allclose(bn._variance.numpy(), x.astype(np.float64).var(axis=0, ddof=1), rtol=1e-3)


# 5. Optimizer what-ifs over the settings the two optimizers keep --------------------------------
@pytest.mark.slow
def test_an_optimizer_setting_outside_the_named_ones_is_found_by_re_running():
    """amsgrad is no setting the optimizer diagnosis names; the what-ifs read it from torch's parameter
    group and paddle's optimizer, and torch's step re-run with it flipped lands on paddle's."""
    spec = _spec("train_mlp",
                 torch_optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.05, amsgrad=True),
                 paddle_optimizer=lambda m: paddle.optimizer.AdamW(3e-3, weight_decay=0.05, parameters=m.parameters()))
    report = train_check(spec, steps=6, device="cpu")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.phase == "optimizer"
    d = _diagnosis(report)
    assert d.kind == "optimizer" and d.layer == report.first_bad.torch
    assert "torch's AdamW has amsgrad=True; its teacher-forced step re-run with amsgrad=False (paddle's optimizer " \
           "keeps _amsgrad=False)" in d.cause and d.cause.endswith("confirmed by re-running")
    assert d.hint == "construct paddle's AdamW with amsgrad=True, as torch's amsgrad"
    fixed = _spec("train_mlp", torch_optimizer=spec.module.torch_optimizer, paddle_optimizer=lambda m: paddle.optimizer.AdamW(
        3e-3, weight_decay=0.05, amsgrad=True, parameters=m.parameters()))
    assert train_check(fixed, steps=6, device="cpu").verdict == "pass"
