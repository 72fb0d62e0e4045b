"""The cross-entropy what-ifs on a causal LM that returns its logits and a cache (HF's causal LMs
with use_cache=True): the logits are the output the losses read, and paddle's one differing
setting is named as it is for a model returning its logits alone."""

import numpy as np
import paddle
import pytest
import torch

from helpers.cli import spec_path
from converter.spec import PortSpec
from converter.train.ce_whatif import read_output
from helpers.train import train_check

TF, PF = torch.nn.functional, paddle.nn.functional


def test_the_output_read_is_the_only_one_with_a_gradient():
    logits, cache = np.ones((2, 3, 5)), np.zeros((2, 2, 3, 4))
    assert read_output([cache, logits], [cache, cache]) == 1
    assert read_output([logits, cache], [logits, cache]) == 0
    assert read_output([logits, logits], [cache, cache]) is None  # both read: no single logits
    assert read_output([cache, cache], [cache, cache]) is None  # none read


def _with_cache(model):
    """The model returning (logits, cache): the cache the embedding's output, which no loss reads."""
    seen = {}
    if isinstance(model, torch.nn.Module):
        model.emb.register_forward_hook(lambda m, i, o: seen.update(cache=o))
        model.register_forward_hook(lambda m, i, o: (o, seen["cache"]))
    else:
        model.emb.register_forward_post_hook(lambda m, i, o: seen.update(cache=o))
        model.register_forward_post_hook(lambda m, i, o: (o, seen["cache"]))
    return model


def _lm_with_cache(paddle_ignores):
    spec = PortSpec.from_file(spec_path("train_tied_heads"))
    m = spec.module
    torch_model, paddle_model = m.torch_model, m.paddle_model
    m.torch_model = lambda: _with_cache(torch_model())
    m.paddle_model = lambda: _with_cache(paddle_model())
    m.torch_loss = lambda o, t: TF.cross_entropy(o[0].reshape(-1, o[0].shape[-1]), t.reshape(-1), ignore_index=0)
    m.paddle_loss = lambda o, t: PF.cross_entropy(o[0].reshape([-1, o[0].shape[-1]]), t.reshape([-1]),
                                                  ignore_index=paddle_ignores)
    return spec


@pytest.mark.slow
def test_an_ignore_index_bug_is_named_beside_a_cache():
    report = train_check(_lm_with_cache(-100), steps=2, device="cpu")
    assert report.first_bad.phase == "loss", report.first_bad
    (d,) = report.diagnosis
    assert d.kind == "cross entropy", d
    assert "paddle's loss ignores only labels -100" in d.cause and "torch's label 0 (ignore_index=0)" in d.cause, d.cause


@pytest.mark.slow
def test_the_same_loss_beside_a_cache_passes():
    report = train_check(_lm_with_cache(0), steps=2, device="cpu")
    assert report.first_bad is None and report.exit_code == 0, report.first_bad


def test_paddle_s_label_smoothing_beside_an_ignore_index_is_named():
    """paddle 3.3's cross_entropy with label_smoothing and ignore_index=0 ignores no position and
    averages over every class of every position: named as that, with the workaround."""
    from converter.train.ce_whatif import Side, explain, what_if
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((2, 7, 16)), rng.integers(1, 16, (2, 7))
    labels[:, -2:] = 0
    x = torch.tensor(logits, requires_grad=True)
    loss = TF.cross_entropy(x.reshape(-1, 16), torch.from_numpy(labels).reshape(-1), ignore_index=0,
                            label_smoothing=0.1)
    (g,) = torch.autograd.grad(loss, [x])
    xp = paddle.to_tensor(logits.astype(np.float32), stop_gradient=False)
    lp = PF.cross_entropy(xp.reshape([-1, 16]), paddle.to_tensor(labels).reshape([-1]), ignore_index=0,
                          label_smoothing=0.1)
    (gp,) = paddle.grad([lp], [xp])
    found = what_if(logits, labels, Side(float(loss.detach()), g.numpy()), Side(float(lp), gp.numpy().astype(np.float64)))
    assert found is not None and found[0] == "smoothed labels ignored" and found[3], found
    cause, hint = explain(found[0], found[1], found[2], logits.shape, found[3])
    assert "label_smoothing=0.1 and ignore_index=0 ignores no position" in cause, cause
    assert "divided by the 224 logits" in cause and "keep = labels != ignore_index" in hint
    keep = paddle.to_tensor(labels.reshape(-1) != 0)  # the workaround the hint gives lands on torch's loss
    fixed = PF.cross_entropy(xp.reshape([-1, 16])[keep], paddle.to_tensor(labels).reshape([-1])[keep],
                             label_smoothing=0.1)
    assert abs(float(fixed) - float(loss.detach())) <= 1e-5 * float(loss.detach())
