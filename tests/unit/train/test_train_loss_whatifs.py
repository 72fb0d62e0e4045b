"""The cross-entropy what-ifs on a causal LM's logits ([B, T, V], labels [B, T]) with real torch
and real paddle losses: torch's own setting is found whatever it ignores, smooths or shifts, and
paddle's one differing setting is named: ignore_index, label smoothing, reduction, class weights,
and the labels shifted by one position (a causal LM's next-token loss) on one side only."""

import numpy as np
import paddle
import pytest
import torch

from helpers.cli import spec_path
from converter.spec import PortSpec
from converter.train.ce_whatif import Side, explain, torch_setting, what_if
from helpers.train import train_check

B, T, V, PAD = 3, 7, 6, 0
TF, PF = torch.nn.functional, paddle.nn.functional


def _data(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((B, T, V)).astype(np.float32)
    labels = rng.integers(1, V, (B, T))
    labels[0, -2:] = PAD  # padding at the end of two rows
    labels[1, -3:] = PAD
    return logits, labels


def _torch(logits, labels, shift=False, **kw):
    x = torch.from_numpy(logits).double().requires_grad_(True)
    y = torch.from_numpy(labels)
    if shift:
        loss = TF.cross_entropy(x[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1), **kw)
    else:
        loss = TF.cross_entropy(x.reshape(-1, V), y.reshape(-1), **kw)
    (g,) = torch.autograd.grad(loss, [x])
    return Side(float(loss.detach()), g.numpy())


def _paddle(logits, labels, shift=False, **kw):
    x = paddle.to_tensor(logits, stop_gradient=False)
    y = paddle.to_tensor(labels)
    if shift:
        loss = PF.cross_entropy(x[:, :-1].reshape([-1, V]), y[:, 1:].reshape([-1]), **kw)
    else:
        loss = PF.cross_entropy(x.reshape([-1, V]), y.reshape([-1]), **kw)
    (g,) = paddle.grad([loss], [x])
    return Side(float(loss), g.numpy().astype(np.float64))


WEIGHT = [1.0, 1.0, 2.0, 1.0, 1.0, 3.0]

CASES = {
    # name: (torch's loss settings, paddle's, words of the cause)
    "paddle ignores nothing, torch the padding": (
        dict(ignore_index=PAD), dict(),
        ["ignore_index: paddle's loss ignores only labels -100, if any (ignore_index=-100, the default), torch's "
         "label 0 (ignore_index=0)"]),
    "another label ignored": (
        dict(ignore_index=PAD), dict(ignore_index=3),
        ["paddle's loss ignores label 3 (ignore_index=3), torch's label 0 (ignore_index=0)"]),
    "paddle ignores the padding, torch nothing": (
        dict(), dict(ignore_index=PAD), ["paddle's loss ignores label 0 (ignore_index=0), torch's only labels -100"]),
    "smoothing on torch's side only": (
        dict(ignore_index=PAD, label_smoothing=0.1), dict(ignore_index=PAD),
        ["paddle's loss is the cross-entropy with no label smoothing; torch's has 0.1"]),
    "another smoothing": (
        dict(label_smoothing=0.1), dict(label_smoothing=0.25),
        ["paddle's loss is the cross-entropy with label smoothing 0.25; torch's has 0.1"]),
    "reduction with padding": (
        dict(ignore_index=PAD), dict(ignore_index=PAD, reduction="sum"), ["reduced by 'sum', torch's by 'mean'"]),
    "class weights with padding": (
        dict(ignore_index=PAD), dict(ignore_index=PAD, weight=WEIGHT), ["class weights", "[?, 1, 2, 1, 1, 3]"]),
    "shifted on torch's side only": (
        dict(shift=True), dict(), ["label shift: torch's loss scores the logits of each position against the next"]),
    "shifted on paddle's side only": (
        dict(ignore_index=PAD), dict(ignore_index=PAD, shift=True), ["label shift: paddle's loss scores"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_paddle_s_differing_setting_is_named(case):
    t_kw, p_kw, words = CASES[case]
    logits, labels = _data()
    if "weight" in p_kw:
        p_kw = dict(p_kw, weight=paddle.to_tensor(np.array(p_kw["weight"], np.float32)))
    found = what_if(logits.astype(np.float64), labels, _torch(logits, labels, **t_kw), _paddle(logits, labels, **p_kw))
    assert found is not None, case
    what, base, changed, gradient = found
    cause, hint = explain(what, base, changed, logits.shape, gradient)
    for w in words:
        assert w in cause, cause
    assert gradient


@pytest.mark.parametrize("t_kw, expected", [
    (dict(ignore_index=PAD), dict(ignore_index=PAD, shift=0, label_smoothing=0.0)),
    (dict(ignore_index=PAD, shift=True), dict(ignore_index=PAD, shift=1, label_smoothing=0.0)),
    (dict(shift=True, label_smoothing=0.2), dict(ignore_index=-100, shift=1, label_smoothing=0.2)),
])
def test_torch_s_own_setting_is_found(t_kw, expected):
    logits, labels = _data(1)
    s = torch_setting(logits.astype(np.float64), labels, _torch(logits, labels, **t_kw))
    assert s is not None and s.axis == 2
    got = dict(ignore_index=s.ignore_index, shift=s.shift, label_smoothing=round(s.label_smoothing, 6))
    assert got == expected


def test_the_same_setting_on_both_sides_finds_no_difference():
    logits, labels = _data(2)
    # label smoothing without an ignore_index: with one, paddle 3.3's smoothing ignores no position
    # (its loss differs from torch's; named in test_train_loss_whatifs_cache.py)
    kw = dict(label_smoothing=0.1)
    assert what_if(logits.astype(np.float64), labels, _torch(logits, labels, **kw), _paddle(logits, labels, **kw)) is None


def _first_labels():
    """The two most frequent labels of the LM spec's first batch (the what-ifs try the labels present)."""
    target = PortSpec.from_file(spec_path("train_tied_heads")).module.batches()[0][1]
    values, counts = np.unique(target, return_counts=True)
    return [int(v) for v in values[np.argsort(-counts, kind="stable")][:2]]


LM_PAD, LM_OTHER = _first_labels()


def _lm(torch_loss, paddle_loss):
    spec = PortSpec.from_file(spec_path("train_tied_heads"))
    spec.module.torch_loss, spec.module.paddle_loss = torch_loss, paddle_loss
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("torch_loss, paddle_loss, words", [
    (lambda o, t: TF.cross_entropy(o[:, :-1].reshape(-1, o.shape[-1]), t[:, 1:].reshape(-1), ignore_index=LM_PAD),
     lambda o, t: PF.cross_entropy(o.reshape([-1, o.shape[-1]]), t.reshape([-1]), ignore_index=LM_PAD),
     "label shift: torch's loss scores the logits of each position against the next position's label"),
    (lambda o, t: TF.cross_entropy(o.reshape(-1, o.shape[-1]), t.reshape(-1), ignore_index=LM_PAD),
     lambda o, t: PF.cross_entropy(o.reshape([-1, o.shape[-1]]), t.reshape([-1]), ignore_index=LM_OTHER),
     f"paddle's loss ignores label {LM_OTHER} (ignore_index={LM_OTHER}), torch's label {LM_PAD} "
     f"(ignore_index={LM_PAD})"),
], ids=["shift", "ignore-index"])
def test_a_causal_lm_loss_bug_is_named_in_the_loss_phase(torch_loss, paddle_loss, words):
    report = train_check(_lm(torch_loss, paddle_loss), steps=2, device="cpu")
    assert report.first_bad.phase == "loss", report.first_bad
    (d,) = report.diagnosis
    assert words in d.cause, d
