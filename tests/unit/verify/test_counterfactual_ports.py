"""Calls as real ports write them, searched by `verify-port --bisect` (verify/counterfactual_calls.py):
a Tensor method (`a.softmax(dim=...)`, PaConvert's style), an activation chosen at construction and
held as an attribute (`self.activation = getattr(F, "gelu")`, PaddleNLP's style), a functional pool
in a forward beside an unused pool layer, and a root whose child makes a call of the same function.
Each cause is confirmed by re-running and its hint names the call to change; each clean twin passes."""

import math
import threading

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
import torch
import torch.nn.functional as TF

from converter import VerifyOptions, verify_port
from converter.spec import spec_from_functions
from converter.verify.counterfactual_wrapping import wrapped

TOKENS = np.random.RandomState(0).randn(2, 6, 16).astype("float32")
IMAGES = np.random.RandomState(0).randn(2, 3, 12, 12).astype("float32")


def verified(torch_model, paddle_model, x):
    def seeded():
        torch.manual_seed(0)
        return torch_model().eval()
    report = verify_port(spec_from_functions(seeded, paddle_model, lambda: (x,)), VerifyOptions(bisect=True))
    return report, report.forward


def confirmed(forward) -> list:
    return [d for d in forward.diagnosis or [] if "confirmed by re-running" in d.cause
            and "not confirmed" not in d.cause]


# ------------------------------------------------------------------ a softmax written as a Tensor method

class TorchAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out((q @ k.transpose(1, 2) / 4.0).softmax(dim=-1) @ v)


class PaddleAttention(paddle.nn.Layer):
    """PaConvert's way: the softmax a Tensor method, over the wrong axis (written in the forward, not
    kept as a setting the settings' search could change)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = paddle.nn.Linear(16, 48), paddle.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, axis=-1)
        return self.out((q @ k.transpose([0, 2, 1]) / 4.0).softmax(dim=-2) @ v)


class PaddleAttentionClean(PaddleAttention):
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, axis=-1)
        return self.out((q @ k.transpose([0, 2, 1]) / 4.0).softmax(dim=-1) @ v)


def test_a_tensor_method_s_axis_is_confirmed_by_re_running():
    report, forward = verified(TorchAttention, PaddleAttention, TOKENS)
    assert report.exit_code == 1 and forward.first_bad.torch == "", forward.first_bad
    found = confirmed(forward)
    # torch normalises the scores over their last axis; the port over the one before it
    assert found and found[0].kind == "call argument" and (
        "paddle's <model> calls paddle.Tensor.softmax(..., dim=-2); re-run on torch's recorded inputs with dim=-1"
        in found[0].cause), forward.diagnosis
    assert found[0].hint == "pass dim=-1 to softmax in the model's forward"
    # the hint is the fix: the port with dim=-1 passes, with no cause
    clean, forward = verified(TorchAttention, PaddleAttentionClean, TOKENS)
    assert clean.exit_code == 0 and not forward.diagnosis


class TorchNormalised(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return TF.softmax(self.fc(x), dim=-1)


class PaddleNormalised(paddle.nn.Layer):
    """A softmax written out, its sum over axis 1 (torch's is over the last)."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)

    def forward(self, x):
        e = paddle.exp(self.fc(x))
        return e / e.sum(axis=1, keepdim=True)


def test_a_written_out_softmax_s_sum_is_found_on_paddle_s_side():
    x = np.random.RandomState(0).randn(4, 8, 8).astype("float32")
    report, forward = verified(lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), TorchNormalised()),
                               lambda: paddle.nn.Sequential(paddle.nn.Linear(8, 8), PaddleNormalised()), x)
    assert report.exit_code == 1 and forward.first_bad.torch == "1", forward.first_bad
    found = confirmed(forward)
    # summed over the last axis (2 of the 3, counted as the call counts them), the quotient is torch's softmax
    assert found and ("paddle's 1 calls paddle.Tensor.sum(..., axis=1); re-run on torch's recorded inputs with "
                      "axis=2") in found[0].cause, forward.diagnosis
    assert found[0].hint == "pass axis=2 to sum in 1's forward"


def test_a_tensor_method_a_library_layer_calls_is_not_the_port_s():
    attention = paddle.nn.MultiHeadAttention(8, 2)
    x = paddle.to_tensor(TOKENS[:, :, :8])
    with wrapped(attention, "attn") as seen:
        attention(x, x, x)
        x.softmax(dim=-1)  # outside the forward: the diagnosing code's own, not the layer's
    # its reshapes and transposes are paddle's code; the functional calls inside it are recorded as before
    assert not [c for c in seen.calls if c.function.startswith("paddle.Tensor.")]
    assert ("paddle.nn.functional.softmax", "attn") in [(c.function, c.layer) for c in seen.calls]


class Scores(paddle.nn.Layer):
    def forward(self, x):
        return x.softmax(dim=-1).mean(axis=1)


def test_only_the_calling_thread_s_calls_are_recorded_and_the_others_run_the_originals():
    layer, x = Scores(), paddle.to_tensor(TOKENS)
    other: list = []
    with wrapped(layer, "s") as seen:
        thread = threading.Thread(target=lambda: other.append(layer(x).numpy()))
        thread.start()
        thread.join()
        mine = layer(x).numpy()
    assert [(c.function, c.arguments.get("dim", c.arguments.get("axis"))) for c in seen.calls] == [
        ("paddle.Tensor.softmax", -1), ("paddle.Tensor.mean", 1)]  # axis given by name, `mean` read as the alias
    np.testing.assert_array_equal(other[0], mine)
    assert paddle.Tensor.softmax is paddle.softmax and paddle.Tensor.mean is paddle.mean  # put back on leaving


# ------------------------------------------------------------------ an activation held as an attribute

class NewGELU(torch.nn.Module):  # HF's gelu_new: the tanh form
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class TorchFeedForward(torch.nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(16, 32), activation, torch.nn.Linear(32, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(x + self.fc2(self.act(self.fc1(x))))


class PaddleEncoderLayer(paddle.nn.Layer):
    """PaddleNLP's way: the activation chosen by its word at construction and held."""

    def __init__(self, activation):
        super().__init__()
        self.fc1, self.fc2, self.norm = paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 16), paddle.nn.LayerNorm(16)
        self.activation = getattr(F, activation)

    def forward(self, x):
        return self.norm(x + self.fc2(self.activation(self.fc1(x))))


class TorchEncoder(torch.nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.embed, self.layer = torch.nn.Linear(16, 16), TorchFeedForward(activation)

    def forward(self, x):
        return self.layer(self.embed(x))


class PaddleEncoder(paddle.nn.Layer):
    def __init__(self, activation):
        super().__init__()
        self.embed, self.layers = paddle.nn.Linear(16, 16), paddle.nn.LayerList([PaddleEncoderLayer(activation)])

    def forward(self, x):
        return self.layers[0](self.embed(x))


HELD = {
    # torch's activation, paddle's word: the cause and the hint
    "argument": (NewGELU, "gelu", "paddle's layers.0 calls paddle.nn.functional.gelu(..., approximate=False) through "
                 "its attribute activation; re-run on torch's recorded inputs with approximate=True",
                 "pass approximate=True where layers.0's forward calls self.activation (gelu)"),
    "function": (torch.nn.GELU, "relu", "paddle's layers.0 holds paddle.nn.functional.relu as its activation; re-run "
                 "on torch's recorded inputs with paddle.nn.functional.gelu in its place",
                 "make layers.0's activation paddle.nn.functional.gelu (it holds relu)"),
}


@pytest.mark.parametrize("case", list(HELD))
def test_a_held_activation_is_searched_where_the_forward_calls_it(case):
    activation, word, cause, hint = HELD[case]
    x = TOKENS * 2  # where the two GELU forms differ by more than float32's rounding
    report, forward = verified(lambda: TorchEncoder(activation()), lambda: PaddleEncoder(word), x)
    assert report.exit_code == 1 and forward.first_bad.torch == "layer", forward.first_bad
    found = confirmed(forward)
    assert found and cause in found[0].cause, forward.diagnosis
    assert found[0].hint == hint


def test_a_held_activation_torch_computes_too_gets_no_cause():
    report, forward = verified(lambda: TorchEncoder(torch.nn.GELU()), lambda: PaddleEncoder("gelu"), TOKENS * 2)
    assert report.exit_code == 0 and not forward.diagnosis


# ------------------------------------------------------------------ a functional pool beside an unused pool layer

class TorchPooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 4)
        self.pool = torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)  # built, never called

    def forward(self, x):
        x = TF.avg_pool2d(self.conv(x), 3, stride=2, padding=1, count_include_pad=False)
        return self.fc(x.mean((2, 3)))


class PaddlePooled(paddle.nn.Layer):
    """The flag written in the forward's call (and the unused layer built with it)."""

    EXCLUSIVE = False

    def __init__(self):
        super().__init__()
        self.conv, self.fc = paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.Linear(8, 4)
        self.pool = paddle.nn.AvgPool2D(3, stride=2, padding=1, exclusive=self.EXCLUSIVE)

    def forward(self, x):
        x = F.avg_pool2d(self.conv(x), 3, stride=2, padding=1, exclusive=self.EXCLUSIVE)
        return self.fc(x.mean((2, 3)))


class PaddlePooledClean(PaddlePooled):
    EXCLUSIVE = True


def test_a_functional_pool_s_argument_is_named_at_the_call_not_at_a_pool_layer():
    report, forward = verified(TorchPooled, PaddlePooled, IMAGES)
    assert report.exit_code == 1 and forward.first_bad.torch == "", forward.first_bad
    found = confirmed(forward)
    assert found and ("paddle's <model> calls paddle.nn.functional.avg_pool2d(..., exclusive=False); re-run on torch's "
                      "recorded inputs with exclusive=True") in found[0].cause, forward.diagnosis
    assert found[0].hint == "pass exclusive=True to avg_pool2d in the model's forward"
    # the unused pool layer's setting, read from the two layers, is not said to be confirmed by a changed call
    assert not [d for d in found if "construct the paddle pool" in d.hint], forward.diagnosis
    clean, forward = verified(TorchPooled, PaddlePooledClean, IMAGES)
    assert clean.exit_code == 0 and not forward.diagnosis


# ------------------------------------------------------------------ a root's call counted apart from its child's

class TorchDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.up = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Upsample(scale_factor=2, mode="bilinear")

    def forward(self, x):
        y = self.up(self.conv(x))
        return TF.interpolate(y, size=(15, 15), mode="bilinear", align_corners=True)


class PaddleDecoder(paddle.nn.Layer):
    ALIGN_CORNERS = False

    def __init__(self):
        super().__init__()
        self.conv, self.up = paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.Upsample(scale_factor=2, mode="bilinear")

    def forward(self, x):
        y = self.up(self.conv(x))
        return F.interpolate(y, size=(15, 15), mode="bilinear", align_corners=self.ALIGN_CORNERS)


class PaddleDecoderClean(PaddleDecoder):
    ALIGN_CORNERS = True


def test_a_call_is_counted_among_its_own_layer_s_calls():
    layer = PaddleDecoder()
    with wrapped(layer, "") as seen:
        layer(paddle.to_tensor(IMAGES))
    # Upsample's interpolate is its own; the root's forward makes its first
    assert [(c.layer, c.index) for c in seen.calls if c.function.endswith(".interpolate")] == [("up", 0), ("", 0)]


def test_the_root_s_one_call_is_not_said_to_be_its_second():
    report, forward = verified(TorchDecoder, PaddleDecoder, IMAGES)
    assert report.exit_code == 1 and forward.first_bad.torch == "", forward.first_bad
    found = confirmed(forward)
    assert found and ("paddle's <model> calls paddle.nn.functional.interpolate(..., align_corners=False); re-run on "
                      "torch's recorded inputs with align_corners=True") in found[0].cause, forward.diagnosis
    assert "its call" not in found[0].cause
    assert found[0].hint == "pass align_corners=True to interpolate in the model's forward"
    clean, forward = verified(TorchDecoder, PaddleDecoderClean, IMAGES)
    assert clean.exit_code == 0 and not forward.diagnosis
