"""Details real ports showed (HF Bloom, T5 and OPT against PaddleNLP), kept here without
transformers: dropouts of one path whose outputs differ in layout, outputs both sides mask in
their own convention, and an elementwise formula that cancels."""

import math

import numpy as np
import paddle
import torch

from converter.verify.capture import Call


def test_same_path_layers_without_weights_pair_only_when_their_outputs_can_agree():
    from converter.verify.align import align

    def call(path, shape, end):
        return Call(path, "Dropout", 0, end, shapes=[shape])
    torch_calls = {"drop": call("drop", (2, 4, 3, 3), 0), "": Call("", "Model", 0, 2, shapes=[(2, 3)])}
    paddle_calls = {"drop": call("drop", (8, 3, 3), 0), "": Call("", "Model", 0, 2, shapes=[(2, 3)])}
    assert [p.torch for p in align(torch_calls, paddle_calls)] == [""]
    paddle_calls["drop"] = call("drop", (2, 4, 3, 3), 0)
    assert [p.torch for p in align(torch_calls, paddle_calls)] == ["drop", ""]


def test_positions_both_sides_mask_are_no_error():
    from converter.verify.matching import masked_alike
    bias = np.array([[0.5, -3.4e38], [0.2, 0.1]], np.float32)
    other = np.array([[0.5, -1e9], [0.2, 0.1]], np.float32)
    assert masked_alike(bias, other).tolist() == [[False, True], [False, False]]
    assert masked_alike(bias, np.array([[0.5, 0.0], [0.2, 0.1]], np.float32)) is None  # masked on one side: an error
    assert masked_alike(np.ones((2, 2), np.float32), other) is None


class _TorchGeluTanh(torch.nn.Module):  # HF's formula, no parameters: no family covers it
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = _TorchGeluTanh()

    def forward(self, x):
        return self.act(x)


class _PaddleGeluTanh(paddle.nn.Layer):  # PaddleNLP Bloom's: the same formula, paddle's tanh
    def forward(self, x):
        return x * 0.5 * (1.0 + paddle.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class _PaddleModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.act = _PaddleGeluTanh()

    def forward(self, x):
        return self.act(x)


def test_an_elementwise_formula_that_cancels_is_not_a_false_alarm():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.verify.session import Options

    x = np.linspace(-6.0, -2.0, 4096, dtype=np.float32).reshape(64, 64)  # where 0.5 x (1 + tanh) cancels
    report = verify(spec_from_functions(_TorchModel, _PaddleModel, lambda: (x,), label="gelu"), Options(device="cpu"))
    rows = {r.torch: r for r in report.layers}
    assert report.verdict == "pass", [(r.torch, r.ratio, r.local_max_abs, r.budget) for r in report.layers]
    assert rows["act"].ratio is not None and rows["act"].local_max_abs > 0
