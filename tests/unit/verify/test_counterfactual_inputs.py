"""Causes in the form of a layer's inputs (verify/counterfactual_inputs.py): an attention that adds
a 1/0 keep mask as it comes, reads a boolean mask the other way round, or adds a square bias
transposed is named with the form that reproduces torch, confirmed by re-running; the clean
twins pass with no cause."""

import numpy as np
import paddle
import pytest
import torch

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions
from converter.verify.counterfactual_inputs import forms

D, T = 16, 6


class TorchAttention(torch.nn.Module):
    """Scores masked as torch ports write it; `form` (a class attribute, no setting of the layer)
    says which mask the caller hands it."""

    form = "keep"

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / D ** 0.5
        if self.form == "keep":  # 1 = attend
            scores = scores + (1.0 - mask[:, None, :]) * -1e4
        elif self.form == "bool":  # True = attend
            scores = scores.masked_fill(~mask[:, None, :], -1e4)
        else:  # a [B, T, T] bias, row i for query i
            scores = scores + mask
        return scores.softmax(-1) @ self.v(x)


class PaddleAttention(paddle.nn.Layer):
    form, bug = "keep", False  # class attributes: the search changes a layer's own settings alone

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (paddle.nn.Linear(D, D) for _ in range(3))

    def forward(self, x, mask):
        scores = paddle.matmul(self.q(x), self.k(x), transpose_y=True) / D ** 0.5
        if self.form == "keep":
            scores = scores + (mask[:, None, :] if self.bug else (1.0 - mask[:, None, :]) * -1e4)
        elif self.form == "bool":
            masked = mask[:, None, :] if self.bug else paddle.logical_not(mask[:, None, :])
            scores = paddle.where(masked.expand(scores.shape), paddle.full_like(scores, -1e4), scores)
        else:
            scores = scores + (mask.transpose([0, 2, 1]) if self.bug else mask)
        return paddle.matmul(paddle.nn.functional.softmax(scores, -1), self.v(x))


def _spec(form, bug):
    torch_attention = type("TorchAttention", (TorchAttention,), {"form": form})
    paddle_attention = type("PaddleAttention", (PaddleAttention,), {"form": form, "bug": bug})

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.head = torch_attention(), torch.nn.Linear(D, 2)

        def forward(self, x, mask):
            return self.head(self.attn(x, mask))

    class PaddleNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.attn, self.head = paddle_attention(), paddle.nn.Linear(D, 2)

        def forward(self, x, mask):
            return self.head(self.attn(x, mask))

    def torch_model():
        torch.manual_seed(0)
        return TorchNet().eval()

    def inputs():
        rng = np.random.RandomState(0)
        x = rng.randn(2, T, D).astype("float32")
        if form == "square":
            return x, (rng.randn(2, T, T) * 2).astype("float32")
        keep = np.ones((2, T), "float32")
        keep[1, 4:] = 0
        return x, keep.astype(bool) if form == "bool" else keep
    return spec_from_functions(torch_model, PaddleNet, inputs)


CASES = {
    "keep": ("in additive form (0 where it is 1, -10000 where it is 0)", "(1 - mask) * -10000"),
    "bool": ("negated (True where it is False)", "negate it"),
    "square": ("with its last two axes swapped", "swap its last two axes"),
}


@pytest.mark.parametrize("form", list(CASES))
def test_an_input_read_in_another_form_is_named_with_the_form(form):
    said, hint = CASES[form]
    report = verify_port(_spec(form, bug=True), VerifyOptions(bisect=True))
    assert report.exit_code == 1 and report.forward.first_bad.torch == "attn", report.forward.first_bad
    [found] = [d for d in report.forward.diagnosis if d.kind == "input form"]
    assert f"paddle's attn (PaddleAttention) reads its input 'mask' otherwise than torch's; re-run on torch's " \
           f"recorded inputs with that input {said} it gives torch's output" in found.cause, found.cause
    assert found.cause.endswith("confirmed by re-running") and hint in found.hint, found


@pytest.mark.parametrize("form", list(CASES))
def test_the_clean_twin_passes_with_no_cause(form):
    report = verify_port(_spec(form, bug=False), VerifyOptions(bisect=True))
    assert report.exit_code == 0 and not report.forward.diagnosis


def test_the_forms_come_from_the_values():
    keep = np.array([[1.0, 1.0, 0.0]], "float32")
    assert [f.what.split(" (")[0] for f in forms(keep, 0)] == ["in additive form", "complemented"]
    additive = np.array([[0.0, -1e9, 0.0]], "float32")
    assert np.array_equal(forms(additive, 0)[0].value, [[1.0, 0.0, 1.0]])
    assert forms(np.array([[0.5, 0.0]], "float32"), 0) == []  # neither a mask nor square
    ids = forms(np.array([[1, 1, 0]], "int64"), "attention_mask")  # HF's masks are int64
    assert [f.what.split(" (")[0] for f in ids] == ["in additive form", "complemented"]
    assert ids[0].value.dtype == np.float32 and np.array_equal(ids[1].value, [[0, 0, 1]])
    assert [f.what for f in forms(np.zeros((2, 3, 3), "float32") + 0.5, "bias")] == ["with its last two axes swapped"]


@pytest.mark.parametrize("inverted", [True, False])
def test_a_padding_mask_passed_on_with_the_other_meaning_is_named(inverted):
    """torch's TransformerEncoder takes src_key_padding_mask (True = pad); paddle's takes src_mask
    (True = attend), which it makes additive inside. A port that passes the padding mask on as it
    is reaches paddle's attention as an additive mask of the kept positions: named with the form
    that reproduces torch, not as a mask built from pad_token_id."""
    H, FF = 2, 32

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

        def forward(self, x, pad):
            return self.enc(x, src_key_padding_mask=pad)

    class PaddleNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.enc = paddle.nn.TransformerEncoder(paddle.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0), 1)

        def forward(self, x, pad):
            return self.enc(x, src_mask=(pad if inverted else paddle.logical_not(pad)).unsqueeze([1, 2]))

    def torch_model():
        torch.manual_seed(0)
        return TorchNet().eval()

    def inputs():
        pad = np.zeros((2, T), bool)
        pad[0, 4:], pad[1, 5] = True, True
        return {"x": np.random.default_rng(0).standard_normal((2, T, D)).astype("float32"), "pad": pad}
    report = verify_port(spec_from_functions(torch_model, PaddleNet, inputs), VerifyOptions(bisect=True))
    if not inverted:
        assert report.exit_code == 0 and not report.forward.diagnosis
        return
    assert report.exit_code == 1 and report.forward.first_bad.torch == "enc.layers.0.self_attn", report.forward.first_bad
    [found] = report.forward.diagnosis
    assert found.kind == "input form" and "with its masked and kept positions swapped it gives torch's output" in \
        found.cause and found.cause.endswith("confirmed by re-running"), found
