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
