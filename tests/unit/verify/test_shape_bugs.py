"""Port bugs that change a shape. A paddle LSTM built time-major where torch's is batch-first, with a
head on its last hidden state, gives final outputs of another size ([7, 3] against [2, 3]): the
two models return the same structure, so it is a port bug, judged (FAIL, the LSTM named with its
cause), not a spec error. Outputs of another structure (another count of tensors, a dict against a
tensor) or of the same elements in another layout stay refused. A paddle layer lacking tensors that
torch's fills is told the constructor argument that builds them, found by rebuilding it."""

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.errors import UserError
from converter.spec import spec_from_functions

VOCAB, EMB, HID, NCLS, B, T = 50, 16, 24, 3, 2, 7


class TorchClf(torch.nn.Module):
    """Embedding, a bidirectional batch-first LSTM, a Linear on the last hidden states (`head`
    "h"), or on the last time step ("last"); returned as a dict where `head` is "dict"."""

    def __init__(self, head="h"):
        super().__init__()
        self.head = head
        self.embedding = torch.nn.Embedding(VOCAB, EMB)
        self.lstm = torch.nn.LSTM(EMB, HID, batch_first=True, bidirectional=True)
        self.fc = torch.nn.Linear(2 * HID, NCLS)

    def forward(self, ids):
        out, (h, _) = self.lstm(self.embedding(ids))
        y = self.fc(out[:, -1] if self.head == "last" else torch.cat([h[-2], h[-1]], dim=1))
        return {"logits": y} if self.head == "dict" else y


class PaddleClf(paddle.nn.Layer):
    """TorchClf's port (`direction`, `fc_bias`: paddle's constructor arguments); `head` "time"
    takes the last row of the batch-first output (torch's last step is out[:, -1]); `out`: "T"
    returns the logits transposed, "twice" returns them twice."""

    def __init__(self, time_major=False, head="h", out="y", direction="bidirect", fc_bias=None):
        super().__init__()
        self.head, self.out = head, out
        self.embedding = paddle.nn.Embedding(VOCAB, EMB)
        self.lstm = paddle.nn.LSTM(EMB, HID, direction=direction, time_major=time_major)
        self.fc = paddle.nn.Linear(2 * HID, NCLS, bias_attr=fc_bias)

    def forward(self, ids):
        out, (h, _) = self.lstm(self.embedding(ids))
        y = self.fc(out[-1] if self.head == "time" else paddle.concat([h[-2], h[-1]], axis=1))
        return y.T if self.out == "T" else (y, y) if self.out == "twice" else y


def _inputs():
    return (np.random.default_rng(0).integers(1, VOCAB, (B, T)).astype("int64"),)


def _verify(strategy="full", torch_head="h", **paddle_args):
    def torch_model():
        torch.manual_seed(0)
        return TorchClf(torch_head).eval()

    def paddle_model():
        paddle.seed(0)
        return PaddleClf(**paddle_args).eval()
    return verify_port(spec_from_functions(torch_model, paddle_model, _inputs),
                       VerifyOptions(strategy=strategy, bisect=True))


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_clean_twin_passes(strategy):
    report = _verify(strategy)
    assert report.exit_code == 0, report.forward.first_bad
    assert report.forward.outputs is None or report.forward.outputs.within_budget


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_time_major_lstm_with_a_head_of_another_size_fails_at_the_lstm(strategy):
    report = _verify(strategy, time_major=True)
    forward = report.forward
    assert report.exit_code == 1, forward.first_bad
    assert forward.first_bad.torch == "lstm", forward.first_bad
    assert any("time_major=True" in d.cause and "time_major=False" in d.cause and "confirmed" in d.cause
               for d in forward.diagnosis), forward.diagnosis
    assert any("time_major=False" in d.hint for d in forward.diagnosis), forward.diagnosis
    if strategy == "full":  # the final outputs' row: failed, with the shapes said
        outputs = forward.outputs
        assert outputs.within_budget is False and outputs.max_abs is None
        assert "torch [[2, 3]], paddle [[7, 3]]" in outputs.note, outputs.note


def test_head_on_another_axis_names_the_first_layer_whose_outputs_cannot_be_compared():
    # the LSTMs agree; the model's own code hands fc the last batch row ([7, 48]) for the last step ([2, 48])
    report = _verify(torch_head="last", head="time")
    bad = report.forward.first_bad
    assert report.exit_code == 1 and bad.torch == "fc" and bad.max_abs is None, bad
    assert "torch [2, 48], paddle [7, 48]" in bad.note, bad.note  # its inputs differ already
    rows = {r.torch: r for r in report.forward.layers}
    assert rows["lstm"].within_budget, rows["lstm"]


class TorchConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.conv = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(self.stem(x)))


class PaddleConvs(paddle.nn.Layer):
    def __init__(self, stride):
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.conv = paddle.nn.Conv2D(8, 8, 3, padding=1, stride=stride)

    def forward(self, x):
        return self.conv(paddle.nn.functional.relu(self.stem(x)))


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("stride", [1, 2], ids=["clean", "strided"])
def test_last_conv_of_another_stride_is_the_layer_whose_outputs_cannot_be_compared(strategy, stride):
    def torch_model():
        torch.manual_seed(0)
        return TorchConvs().eval()
    image = lambda: (np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32"),)
    report = verify_port(spec_from_functions(torch_model, lambda: PaddleConvs(stride).eval(), image),
                         VerifyOptions(strategy=strategy, bisect=True))
    if stride == 1:
        assert report.exit_code == 0, report.forward.first_bad
        return
    bad = report.forward.first_bad  # the model's output is the conv's: [2, 8, 4, 4] against [2, 8, 8, 8]
    assert report.exit_code == 1 and bad.torch == "conv" and bad.max_abs is None, bad
    assert "torch [[2, 8, 8, 8]], paddle [[2, 8, 4, 4]]" in bad.note, bad.note
    assert any("stride" in d.cause and "confirmed" in d.cause and "stride=[1, 1]" in d.hint
               for d in report.forward.diagnosis), report.forward.diagnosis


@pytest.mark.parametrize("torch_head,paddle_args,said", [
    ("h", {"out": "twice"}, "2 floating tensor(s) [2, 3], [2, 3]"),  # another count of tensors
    ("dict", {"time_major": True}, "[7, 3]"),  # a dict against a tensor
    ("h", {"out": "T"}, "[3, 2]"),  # the same elements in another layout
])
def test_outputs_of_another_structure_or_layout_stay_refused(torch_head, paddle_args, said):
    with pytest.raises(UserError) as caught:
        _verify(torch_head=torch_head, **paddle_args)
    assert "return different outputs" in str(caught.value) and said in str(caught.value), caught.value


# ---- a paddle layer lacking tensors that torch's fills: the constructor argument that builds them

def test_forward_lstm_is_told_the_direction_that_builds_torchs_reverse_weights():
    with pytest.raises(UserError) as caught:
        _verify(direction="forward")
    said = str(caught.value)
    assert "holds no 'weight_ih_l0_reverse'" in said and "[96, 16]" in said, said
    assert said.endswith("build it with direction='bidirect'"), said
    # the argument said builds the port that passes
    assert _verify(direction="bidirect").exit_code == 0


def test_linear_built_without_its_bias_is_told_the_bias_argument():
    with pytest.raises(UserError) as caught:
        _verify(fc_bias=False)
    said = str(caught.value)
    assert "paddle's fc (Linear) holds no 'bias'" in said and "'fc.bias' [3]" in said, said
    assert said.endswith("build it with bias_attr=None"), said


def test_layer_no_argument_completes_is_told_the_tensor_it_lacks():
    def paddle_model():
        paddle.seed(0)
        model = PaddleClf().eval()
        model.fc.bias = None  # dropped after it was built as torch's: built again, it holds one
        return model

    def torch_model():
        torch.manual_seed(0)
        return TorchClf().eval()
    with pytest.raises(UserError) as caught:
        verify_port(spec_from_functions(torch_model, paddle_model, _inputs), VerifyOptions(bisect=True))
    said = str(caught.value)
    assert said.endswith("build paddle's fc with a 'bias' of that shape"), said
    assert "build it with" not in said, said


def test_constructor_change_is_measured_on_rebuilt_layers():
    from converter.frameworks.rebuild import built_shapes, arguments, constructor_change
    lstm = paddle.nn.LSTM(EMB, HID, direction="forward")
    reverse = {"weight_ih_l0_reverse": (4 * HID, EMB), "weight_hh_l0_reverse": (4 * HID, HID)}
    assert constructor_change(lstm, reverse) == {"direction": "bidirect"}
    assert constructor_change(lstm, {"weight_ih_l0_reverse": (4 * HID + 1, EMB)}) is None  # no build has that shape
    assert constructor_change(paddle.nn.GRU(EMB, HID), {"weight_ih_l0_reverse": (3 * HID, EMB)}) == \
        {"direction": "bidirect"}
    # two arguments, each building one of the tensors lacked
    bare = paddle.nn.LayerNorm(8, weight_attr=False, bias_attr=False)
    assert constructor_change(bare, {"weight": (8,), "bias": (8,)}) == {"weight_attr": None, "bias_attr": None}
    # a layer that holds what is wanted already has no change to make
    assert constructor_change(paddle.nn.Linear(3, 4), {"bias": (4,)}) is None
    # a rebuild leaves paddle's dynamic mode on (the LSTM's is described in a static program) and
    # the models' names as they were (a Linear's rebuilds name their weights under their own generator)
    shapes = built_shapes(lstm, {**arguments(lstm)[1], "direction": "bidirect"})
    assert shapes["weight_hh_l0_reverse"] == (4 * HID, HID) and paddle.in_dynamic_mode()
    live = paddle.nn.Linear(3, 4, bias_attr=False)
    before = paddle.nn.Linear(2, 2).weight.name
    assert constructor_change(live, {"bias": (4,)}) == {"bias_attr": None}
    after = paddle.nn.Linear(2, 2).weight.name
    number = lambda name: int(name.split(".")[0].rpartition("_")[2])  # linear_<n>.w_0
    assert number(after) == number(before) + 1, (before, after)
