"""Masks read by what they mean. torch's nn.MultiheadAttention takes a key_padding_mask whose True
masks a position; paddle's MultiHeadAttention an attn_mask that is additive (-10000 or -inf where
masked) or boolean with True keeping a position; HF hands its attention a keep-mask of 1s and 0s.
Masks of other forms that mask the same positions are one mask: the clean pair passes with the
attention given torch's mask in paddle's form, and a mask that masks another position is named."""

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.compare.masks import in_form_of, same_mask
from converter.compare.matching import MASK, match_inputs
from converter.spec import spec_from_functions

B, T, C = 2, 6, 16


class TorchPadded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.attn = torch.nn.Linear(C, C), torch.nn.MultiheadAttention(C, 4, batch_first=True)
        self.out = torch.nn.Linear(C, 3)

    def forward(self, x, keep):
        h = self.inp(x)
        a, _ = self.attn(h, h, h, key_padding_mask=keep == 0, need_weights=False)  # True masks
        return self.out(a)


class PaddlePadded(paddle.nn.Layer):
    def __init__(self, form, extra=False):
        super().__init__()
        self.inp, self.attn, self.out = paddle.nn.Linear(C, C), paddle.nn.MultiHeadAttention(C, 4), paddle.nn.Linear(C, 3)
        self.form, self.extra = form, extra

    def forward(self, x, keep):
        h = self.inp(x)
        kept = keep.astype("float32").unsqueeze([1, 2])  # [B, 1, 1, T]
        if self.extra:  # the bug: the first token masked too
            kept = kept * (paddle.arange(T) > 0).astype("float32")
        mask = {"additive": lambda: (1.0 - kept) * -10000.0,
                "inf": lambda: paddle.where(kept > 0, paddle.zeros_like(kept), paddle.full_like(kept, float("-inf"))),
                "bool": lambda: kept > 0}[self.form]()
        return self.out(self.attn(h, h, h, attn_mask=mask))


def _torch():
    torch.manual_seed(0)
    return TorchPadded().eval()


def _inputs():
    keep = np.ones((B, T), "int64")
    keep[1, 4:] = 0  # the second sequence is padded
    return np.random.default_rng(0).standard_normal((B, T, C)).astype("float32"), keep


@pytest.mark.parametrize("form,strategy", [("additive", "full"), ("inf", "full"), ("bool", "full"),
                                           ("additive", "binary")])
def test_a_mask_in_another_form_is_the_same_mask(form, strategy):
    report = verify_port(spec_from_functions(_torch, lambda: PaddlePadded(form), _inputs),
                         VerifyOptions(strategy=strategy))
    assert report.exit_code == 0, report.forward.first_bad
    attn = next(row for row in report.forward.layers if row.torch == "attn")
    assert "is a mask in another form (same positions)" in attn.note, attn.note


def test_a_mask_that_masks_another_position_is_named_at_the_attention():
    report = verify_port(spec_from_functions(_torch, lambda: PaddlePadded("additive", extra=True), _inputs),
                         VerifyOptions(bisect=True))
    assert report.exit_code == 1 and report.forward.first_bad.torch == "attn", report.forward.first_bad
    assert any(d.kind == "mask" for d in report.forward.diagnosis), report.forward.diagnosis


KEEP = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])  # HF's attention_mask: 0 masks a position


def test_every_form_of_one_mask_is_the_same_mask():
    masked = KEEP == 0
    forms = {"keep": KEEP, "keep float": KEEP.astype(np.float32), "true masks": masked,
             "true keeps": ~masked.reshape(2, 1, 1, 4),
             "additive": np.where(masked, -1e4, 0).astype(np.float32).reshape(2, 1, 1, 4),
             "inf": np.where(masked, -np.inf, 0).astype(np.float32).reshape(2, 1, 1, 4),
             "lowest": np.broadcast_to(np.where(masked, np.finfo(np.float32).min, 0).astype(np.float32)[:, None, None],
                                       (2, 1, 4, 4))}
    for a, x in forms.items():
        for b, y in forms.items():
            assert same_mask(x, y), (a, b)
    other = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert not same_mask(forms["additive"], other) and not same_mask(forms["true masks"], other)
    assert not same_mask(KEEP * 2, forms["keep"])  # ids, not a mask


def test_a_mask_handed_over_is_written_in_the_receiving_form():
    masked = KEEP == 0
    additive = np.where(masked, -1e4, 0).astype(np.float32).reshape(2, 1, 1, 4)
    assert np.array_equal(in_form_of(KEEP, additive), additive)  # torch's keep-mask, as paddle's additive one
    assert in_form_of(KEEP, additive).dtype == np.float32
    assert np.array_equal(in_form_of(additive, KEEP), KEEP) and in_form_of(additive, KEEP).dtype == KEEP.dtype
    assert np.array_equal(in_form_of(masked, ~masked.reshape(2, 1, 1, 4)), ~masked.reshape(2, 1, 1, 4))
    inf = np.where(masked, -np.inf, 0).astype(np.float32).reshape(2, 1, 1, 4)
    assert np.array_equal(in_form_of(additive, inf), inf)
    assert in_form_of(np.array([[1, 1, 1, 0], [1, 1, 0, 0]]), additive) is None  # other positions: not the same mask
    [m] = match_inputs([additive], [KEEP])
    assert m.how == MASK and m.source == 0
