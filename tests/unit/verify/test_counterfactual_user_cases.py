"""Ports a user writes with one mistake each, checked end to end with `verify-port --bisect`: where
re-running the culprit with one change reproduces torch, the change is printed as the cause (and the
port with the change made passes); where none does, the report names the place only; where the
paddle model has no place for a torch tensor, the refusal says which layer lacks it and how to build
it. A clean pair gets no cause."""

import numpy as np
import paddle
import pytest
import torch
import torch.nn.functional as TF

from converter import VerifyOptions, verify_port
from converter.errors import UserError
from converter.spec import spec_from_functions
from converter.verify.counterfactual_calls import RecordedCall, candidates
from converter.verify.counterfactual_rebuild import Rebuilder
from converter.verify.counterfactual_wrapping import wrapped

IMAGES = np.random.RandomState(0).randn(2, 4, 10, 10).astype("float32")
TOKENS = np.random.RandomState(0).randn(2, 5, 16).astype("float32")


def verified(torch_model, paddle_model, x, strategy="full"):
    def seeded():
        torch.manual_seed(0)
        return torch_model().eval()
    report = verify_port(spec_from_functions(seeded, paddle_model, lambda: (x,)),
                         VerifyOptions(strategy=strategy, bisect=True))
    return report, report.forward


def causes(forward, kind):
    return [d for d in forward.diagnosis or [] if d.kind == kind]


# ------------------------------------------------------------------ a convolution's stride or padding

def torch_convs(stride=1):
    return torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(4, 2, 3, stride=stride, padding=1), torch.nn.AdaptiveAvgPool2d(2))


def paddle_convs(stride=1, padding=1):
    return lambda: paddle.nn.Sequential(paddle.nn.Conv2D(4, 4, 3, padding=1), paddle.nn.ReLU(),
                                        paddle.nn.Conv2D(4, 2, 3, stride=stride, padding=padding),
                                        paddle.nn.AdaptiveAvgPool2D(2))


CONVS = {
    # (torch's stride, paddle's stride, paddle's padding, what the cause says, the hint: torch's value)
    "padding": (1, 1, 0, "paddle's 2 (Conv2D) has _padding=0; re-run on torch's recorded inputs with _padding=1",
                "construct paddle's Conv2D with padding=1"),
    "stride": (2, 1, 1, "paddle's 2 (Conv2D) has _stride=[1, 1]; re-run on torch's recorded inputs with _stride=[2, 2]",
               "construct paddle's Conv2D with stride=[2, 2]"),
}


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("name", list(CONVS))
def test_a_weighted_layer_s_stride_or_padding_is_confirmed_by_re_running(name, strategy):
    t_stride, p_stride, p_padding, cause, hint = CONVS[name]
    report, forward = verified(lambda: torch_convs(t_stride), paddle_convs(p_stride, p_padding), IMAGES, strategy)
    assert report.exit_code == 1 and forward.first_bad.torch == "2", forward.first_bad
    found = causes(forward, "setting")
    assert found and cause in found[0].cause and "confirmed by re-running" in found[0].cause, forward.diagnosis
    assert found[0].hint == hint
    # the hint is the fix: paddle's conv built with torch's value passes
    assert verified(lambda: torch_convs(t_stride), paddle_convs(t_stride, 1), IMAGES)[0].exit_code == 0


def test_structure_is_never_a_candidate_and_a_stride_is():
    """A weighted layer's whole numbers are tried only where building it afresh with the changed
    value gives weights of the same shapes: counts of layers and features change them."""
    keys = frozenset(vars(paddle.nn.Layer()))
    lstm = Rebuilder(paddle.nn.LSTM(6, 5), keys)
    assert lstm.measured("num_layers", "num_layers", 5) is None  # the value that once crashed paddle's kernel
    assert lstm.measured("hidden_size", "hidden_size", 4) is None
    conv = Rebuilder(paddle.nn.Conv2D(4, 2, 3), keys)
    assert conv.measured("_groups", "groups", 2) is None and conv.measured("_out_channels", "out_channels", 4) is None
    padding = conv.measured("_padding", "padding", 1)
    # paddle's Conv2D runs with a padding derived from the argument: the re-run sets both
    assert padding is not None and dict((k, v) for k, _, v in padding) == {"_padding": 1, "_updated_padding": [1, 1]}
    torch_keys = frozenset(vars(torch.nn.Module()))
    stride = Rebuilder(torch.nn.Conv2d(4, 2, 3, bias=False).double(), torch_keys).measured("stride", "stride", (2, 2))
    assert stride is not None and stride == (("stride", (1, 1), (2, 2)),)
    assert Rebuilder(torch.nn.LSTM(6, 5), torch_keys).measured("num_layers", "num_layers", 2) is None


# ------------------------------------------------------------------ calls in the root model's forward

class TorchSpectrum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.fft.fft2(self.c(x), dim=(-2, -1)).abs()


class PaddleSpectrum(paddle.nn.Layer):
    def __init__(self, axes=(1, 2)):
        super().__init__()
        self.c = paddle.nn.Conv2D(4, 4, 1)
        self._axes = axes

    def forward(self, x):
        return paddle.fft.fft2(self.c(x), axes=self._axes).abs()


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_axes_of_a_call_in_the_root_model_s_forward(strategy):
    report, forward = verified(TorchSpectrum, PaddleSpectrum, IMAGES, strategy)
    assert report.exit_code == 1 and forward.first_bad.torch == "", forward.first_bad
    found = causes(forward, "call argument")
    # torch transforms the last two axes, (2, 3) of the 4-axis input; fftn, which fft2 calls, is not named
    assert len(found) == 1, forward.diagnosis
    assert ("paddle's <model> calls paddle.fft.fft2(..., axes=(1, 2)); re-run on torch's recorded inputs with "
            "axes=(2, 3)") in found[0].cause and "confirmed by re-running" in found[0].cause
    assert found[0].hint == "pass axes=(2, 3) to fft2 in the model's forward"
    assert verified(TorchSpectrum, lambda: PaddleSpectrum((2, 3)), IMAGES)[0].exit_code == 0


def test_tuples_of_axes_are_other_axes_of_the_input_as_many():
    call = RecordedCall("paddle.fft.fft2", 0, "", {"axes": (1, 2)}, 4)
    assert candidates(call, "axes") == [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
    assert candidates(RecordedCall("paddle.fft.fft2", 0, "", {"axes": [-2, -1]}, 3), "axes") == [[-3, -2], [-3, -1]]
    assert candidates(RecordedCall("paddle.nn.functional.max_pool2d", 0, "", {"kernel_size": (2, 2)}, 4),
                      "kernel_size") == []  # the same number twice: sizes, not axes


def test_calls_a_function_makes_inside_are_not_the_layer_s():
    layer = paddle.nn.Linear(3, 3)
    with wrapped(layer, "x") as seen:
        paddle.fft.fft2(paddle.ones([2, 3, 3]), axes=(1, 2))
    assert [c.function for c in seen.calls] == ["paddle.fft.fft2"]


# ------------------------------------------------------------------ attention: scale, bias, head layout

class TorchAttention(torch.nn.Module):
    def __init__(self, d=16, h=4):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.h, self.scale = h, (d // h) ** -0.5

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (lin(x).reshape(b, n, self.h, d // self.h).transpose(1, 2) for lin in (self.q, self.k, self.v))
        a = (q @ k.transpose(-2, -1) * self.scale).softmax(-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, n, d))


class PaddleAttention(paddle.nn.Layer):
    def __init__(self, d=16, h=4, k_bias=True, scale=None):
        super().__init__()
        self.q, self.v, self.o = (paddle.nn.Linear(d, d) for _ in range(3))
        self.k = paddle.nn.Linear(d, d, bias_attr=None if k_bias else False)
        self.h, self.scale = h, scale if scale is not None else (d // h) ** -0.5

    def heads(self, y, b, n, d):
        return y.reshape([b, n, self.h, d // self.h]).transpose([0, 2, 1, 3])

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (self.heads(lin(x), b, n, d) for lin in (self.q, self.k, self.v))
        a = paddle.nn.functional.softmax(q @ k.transpose([0, 1, 3, 2]) * self.scale, -1)
        return self.o((a @ v).transpose([0, 2, 1, 3]).reshape([b, n, d]))


class PaddleHeadsUntransposed(PaddleAttention):
    """[B, N, D] read as heads without the transpose: the square weights are right, the layout is not."""

    def heads(self, y, b, n, d):
        return y.reshape([b, self.h, n, d // self.h])


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.head = TorchAttention(), torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.attn(x))


class PaddleNet(paddle.nn.Layer):
    def __init__(self, attention=PaddleAttention, **settings):
        super().__init__()
        self.attn, self.head = attention(**settings), paddle.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.attn(x))


def test_attention_scale_is_confirmed_by_re_running():
    report, forward = verified(TorchNet, lambda: PaddleNet(scale=16 ** -0.5), TOKENS)
    assert report.exit_code == 1 and forward.first_bad.torch == "attn", forward.first_bad
    found = causes(forward, "setting")
    # torch scales by 1/sqrt(head size 4) = 0.5 (the value it keeps); paddle by 1/sqrt(16)
    assert found and "paddle's attn (PaddleAttention) has scale=0.25; re-run on torch's recorded inputs with " \
        "scale=0.5" in found[0].cause and "confirmed by re-running" in found[0].cause, forward.diagnosis


def test_a_bias_paddle_was_built_without_is_one_line_saying_which_and_how():
    with pytest.raises(UserError) as refused:
        verified(TorchNet, lambda: PaddleNet(k_bias=False), TOKENS)
    said = refused.value.render()
    assert said == ("paddle's attn.k (Linear) holds no 'bias', which torch's 'attn.k.bias' [16] fills: build "
                    "it with bias_attr=None")
    # built as the line says, the port passes
    assert verified(TorchNet, lambda: PaddleNet(k_bias=True), TOKENS)[0].exit_code == 0


def test_a_head_layout_bug_is_placed_and_no_right_weight_is_said_to_need_a_transpose():
    report, forward = verified(TorchNet, lambda: PaddleNet(PaddleHeadsUntransposed), TOKENS)
    assert report.exit_code == 1 and forward.first_bad.torch == "attn", forward.first_bad
    assert [d.kind for d in forward.diagnosis] == ["own forward"], forward.diagnosis
    assert "every paired sublayer inside it is within budget" in forward.diagnosis[0].cause
    assert not [d for d in forward.diagnosis if "transpose" in d.cause or d.kind == "transpose"]


def test_clean_attention_gets_no_cause():
    report, forward = verified(TorchNet, PaddleNet, TOKENS)
    assert report.exit_code == 0 and not forward.diagnosis


# ------------------------------------------------------------------ torch's functional call, searched

class TorchSoftmaxBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return TF.softmax(self.fc(x), dim=-1)


class PaddleSoftmaxBlock(paddle.nn.Layer):
    """A softmax written out, over axis 1: no paddle setting or functional call to change."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)

    def forward(self, x):
        e = paddle.exp(self.fc(x))
        return e / (paddle.ones([8, 8]) @ e)  # the sums over axis 1, as a product: no call's axis to change


def test_torch_s_functional_call_is_searched_where_nothing_on_paddle_s_side_reproduces_torch():
    def torch_model():
        return torch.nn.Sequential(torch.nn.Linear(8, 8), TorchSoftmaxBlock())
    report, forward = verified(torch_model, lambda: paddle.nn.Sequential(paddle.nn.Linear(8, 8), PaddleSoftmaxBlock()),
                               np.random.RandomState(0).randn(4, 8, 8).astype("float32"))
    assert report.exit_code == 1 and forward.first_bad.torch == "1", forward.first_bad
    found = causes(forward, "call argument")
    # paddle normalises over axis 1 of the 3-axis input: torch's softmax over dim=-2
    assert found and ("paddle's 1 computes what torch's 1 computes with dim=-2 in its call "
                      "torch.nn.functional.softmax(..., dim=-1)") in found[0].cause, forward.diagnosis
    assert found[0].hint == "make paddle's 1 compute what torch's softmax computes with dim=-1"


def test_a_reference_that_is_not_finite_is_one_line():
    class TorchLog(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.log(self.c(x))

    class PaddleLog(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.c = paddle.nn.Linear(4, 4)

        def forward(self, x):
            return paddle.log(self.c(x))
    with pytest.raises(UserError) as refused:
        verified(TorchLog, PaddleLog, np.random.RandomState(0).randn(3, 4).astype("float32"))
    said = refused.value.render()
    assert "\n" not in said and "own float32 run gives nan" in said and "fix the torch model" in said
