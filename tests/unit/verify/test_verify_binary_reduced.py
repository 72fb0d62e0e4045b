"""Under a reduced format (--emulate paddle=bf16) the end-to-end budget at a unit's boundary is
that format's noise, larger than a small bug's effect: with no unit's boundary over it, the binary
search judges every layer against its own budget and names the bug where full names it, with a
note; a clean pair passes."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

D, LAYERS = 64, 4

pytestmark = pytest.mark.slow


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self, approximate=False):
        super().__init__()
        self.up, self.down = paddle.nn.Linear(D, 2 * D), paddle.nn.Linear(2 * D, D)
        self.act = paddle.nn.GELU(approximate=approximate)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchBlock() for _ in range(LAYERS)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class PaddleNet(paddle.nn.Layer):
    def __init__(self, tanh_in=None):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleBlock(i == tanh_in) for i in range(LAYERS)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _torch_model():
    torch.manual_seed(0)
    return TorchNet().eval()


def _inputs():
    return (np.random.default_rng(0).standard_normal((8, D)).astype("float32"),)


def _verify(paddle_model, strategy):
    spec = spec_from_functions(_torch_model, lambda: paddle_model, _inputs)
    return verify(spec, Options(device="cpu", strategy=strategy, emulate={"paddle": "bf16"}), bisect=True)


def test_a_bug_below_bf16_noise_is_named_by_binary_as_by_full():
    full = _verify(PaddleNet(tanh_in=1), "full")
    assert full.verdict == "fail"
    assert full.first_bad.torch == "blocks.1.act", full.first_bad
    binary = _verify(PaddleNet(tanh_in=1), "binary")
    assert binary.verdict == "fail"
    assert binary.first_bad.torch == "blocks.1.act", binary.first_bad
    assert binary.first_bad.formats == {"torch": "fp32", "paddle": "bf16"}  # judged in the run's own formats
    assert any(n.startswith("binary search: no unit's boundary is over") for n in binary.notes), binary.notes
    assert any("GELU variant" in d.cause for d in binary.diagnosis), binary.diagnosis
    assert binary.precision["paddle"]["emulated"] == "bf16"  # the run's formats as asked, after the search


def test_the_bug_is_within_bf16_noise_end_to_end():
    """What makes the layers' own budgets needed: under bf16 the final outputs hold this bug within budget."""
    binary = _verify(PaddleNet(tanh_in=1), "binary")
    assert binary.outputs is not None and binary.outputs.within_budget, binary.outputs


def test_a_clean_pair_passes_binary_under_bf16():
    report = _verify(PaddleNet(), "binary")
    assert report.verdict == "pass", report.notes
    assert any(n.startswith("binary search: no unit's boundary is over") for n in report.notes), report.notes
    assert len(report.layers) > 3 * 4 and all(r.within_budget is not False for r in report.layers)


def test_layers_are_judged_one_unit_at_a_time_when_the_memory_limit_holds_one():
    """With a limit that holds no two units, the units are captured one at a time, in order, and
    the search stops at the first capture holding a layer over budget."""
    from converter.compare.session import PortSession
    from converter.verify.strategies import BinarySearch
    spec = spec_from_functions(_torch_model, lambda: PaddleNet(tanh_in=2), _inputs)
    with PortSession(spec, Options(device="cpu", strategy="binary", emulate={"paddle": "bf16"})) as session:
        found = BinarySearch(limit_bytes=1).run(session)
    assert found.first_bad is not None and found.first_bad.torch == "blocks.2.act", found.first_bad
    assert any("4 units in 3 capture(s)" in n for n in found.notes), found.notes
    assert {r.torch for r in found.results} >= {"blocks.0.up", "blocks.1.down", "blocks.2.act"}
    assert not any(r.torch.startswith("blocks.3") for r in found.results)
