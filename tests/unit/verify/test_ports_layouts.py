"""A block that runs sequence-first on one side and batch-first on the other: torch's
nn.TransformerEncoderLayer (batch_first=False, [T, B, C]) against paddle's batch-first
TransformerEncoderLayer ([B, T, C]), the model transposing at its boundary on torch's side only.
Each layer inside is handed torch's inputs with their axes in paddle's order, so it is judged on
its own error: the clean stack passes (judged on its own inputs, a norm deep in the stack carried
the error of every layer before it), and a planted bug is named at its module."""

import numpy as np
import paddle
import pytest
import torch

from converter.api import VerifyOptions, verify_port
from converter.compare.matching import NONE, POSITION, VALUE, match_inputs
from converter.spec import spec_from_functions

B, T, C, LAYERS = 2, 7, 64, 4


class TorchSequenceFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(C, C)
        self.layers = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(C, 4, 2 * C, dropout=0.0)
                                           for _ in range(LAYERS)])
        self.out = torch.nn.Linear(C, 3)

    def forward(self, x):
        h = self.inp(x).transpose(0, 1)  # [T, B, C]
        for layer in self.layers:
            h = layer(h)
        return self.out(h.transpose(0, 1))


class PaddleBatchFirst(paddle.nn.Layer):
    def __init__(self, bug=None):
        super().__init__()
        self.inp = paddle.nn.Linear(C, C)
        self.layers = paddle.nn.LayerList([
            paddle.nn.TransformerEncoderLayer(C, 4, 2 * C, dropout=0.0, activation="gelu" if bug == "gelu" and i == 1
                                              else "relu") for i in range(LAYERS)])
        if bug == "epsilon":
            self.layers[2].norm2._epsilon = 1e-3  # torch's is 1e-5
        self.out = paddle.nn.Linear(C, 3)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def _torch():
    torch.manual_seed(0)
    return TorchSequenceFirst().eval()


def _verify(bug, strategy):
    x = lambda: (np.random.default_rng(0).standard_normal((B, T, C)).astype("float32") * 3,)
    return verify_port(spec_from_functions(_torch, lambda: PaddleBatchFirst(bug), x), VerifyOptions(strategy=strategy))


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_sequence_first_stack_against_a_batch_first_one_passes(strategy):
    report = _verify(None, strategy)
    assert report.exit_code == 0, report.forward.first_bad
    rows = {row.torch: row for row in report.forward.layers}
    norm = rows["layers.3.norm1"]
    assert "input 0 [2x7x64] is torch's input 0 with its axes in the order [1, 0, 2]" in norm.note, norm.note
    assert norm.ratio < 1, norm


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("bug,culprit", [("epsilon", "layers.2.norm2"), ("gelu", "layers.1")])
def test_a_bug_inside_the_block_is_named_at_its_module(bug, culprit, strategy):
    """A norm's epsilon is the norm's; an activation the block applies as a function is the block's
    own code, its linear2 (handed torch's input) within budget."""
    report = _verify(bug, strategy)
    assert report.exit_code == 1 and report.forward.first_bad.torch == culprit, report.forward.first_bad
    if bug == "gelu":
        linear2 = next(row for row in report.forward.layers if row.torch == "layers.1.linear2")
        assert linear2.ratio < 1 and report.forward.first_bad.worst_input == "layers.1.linear2", linear2


def test_inputs_match_with_their_axes_in_another_order():
    rng = np.random.default_rng(0)
    t = rng.standard_normal((T, B, C)).astype(np.float32)
    batch_first = np.ascontiguousarray(t.transpose(1, 0, 2))
    [m] = match_inputs([batch_first + np.float32(1e-6)], [t])
    assert (m.source, m.how, m.axes) == (0, VALUE, (1, 0, 2))
    # computed otherwise by the enclosing code: left over on both sides, in the one order that fits
    [m] = match_inputs([batch_first * np.float32(3)], [t])
    assert (m.source, m.how, m.axes) == (0, POSITION, (1, 0, 2))
    # no order of its axes gives paddle's shape: no counterpart
    [m] = match_inputs([batch_first], [rng.standard_normal((T, B, C + 1)).astype(np.float32)])
    assert (m.source, m.how) == (None, NONE)
