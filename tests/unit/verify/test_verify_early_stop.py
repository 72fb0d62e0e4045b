"""Passes that record only some modules end once every call of them has completed (the outline
pass's counts): the model's code after the last of them does not run, on either side, in the
capture, the forced paddle pass and the float64 pass alike; a module called again later is
waited for; the rows are those of the same passes run to the end."""

import numpy as np
import paddle
import torch

from converter.compare import capture, spill
from converter.compare.session import Options, PortSession
from converter.paths import is_under
from converter.spec import spec_from_functions
from converter.verify import endtoend, full
from converter.verify.full import FullCapture, _capture
from converter.verify.strategies import BinarySearch

D, LAYERS = 16, 4


class TorchTail(torch.nn.Linear):
    """The model's last layer, counting the forwards that reach it."""

    def __init__(self):
        super().__init__(D, D)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


class PaddleTail(paddle.nn.Linear):
    def __init__(self):
        super().__init__(D, D)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


class TorchNet(torch.nn.Module):
    def __init__(self, again=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.GELU())
                                           for _ in range(LAYERS)])
        self.tail = TorchTail()
        self.again = again  # blocks.1 called once more after the tail

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = self.tail(x)
        return self.blocks[1](x) if self.again else x


class PaddleNet(paddle.nn.Layer):
    def __init__(self, again=False, tanh_in=None):
        super().__init__()
        self.blocks = paddle.nn.LayerList([paddle.nn.Sequential(paddle.nn.Linear(D, D),
                                                                paddle.nn.GELU(approximate=i == tanh_in))
                                           for i in range(LAYERS)])
        self.tail = PaddleTail()
        self.again = again

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = self.tail(x)
        return self.blocks[1](x) if self.again else x


def _inputs():
    return (np.random.default_rng(0).standard_normal((8, D)).astype("float32"),)


def _session(again=False, tanh_in=None, emulate=None):
    def torch_model():
        torch.manual_seed(0)
        return TorchNet(again).eval()
    spec = spec_from_functions(torch_model, lambda: PaddleNet(again, tanh_in), _inputs)
    return PortSession(spec, Options(device="cpu", strategy="binary", emulate=emulate or {}))


def _tails(session) -> list:
    """The tail layers of the torch model, its float64 reference and the paddle model."""
    return [session.torch_model.tail, session.torch64_module("tail"), session.paddle_model.tail]


def _counted(session, run) -> tuple:
    for tail in _tails(session):
        tail.calls = 0
    found = run()
    return found, [tail.calls for tail in _tails(session)]


def _unit(session, unit: str):
    t_calls, p_calls = _capture(session, keep=False)
    paths = ({p for p in t_calls if is_under(p, unit)}, {p for p in p_calls if is_under(p, unit)})
    return paths, (capture.call_counts(t_calls), capture.call_counts(p_calls))


def _rows(found) -> list:
    return [repr(r) for r in found.results]


def test_a_units_full_capture_ends_after_the_unit_and_gives_the_same_rows():
    with _session(tanh_in=1) as session:
        paths, counts = _unit(session, "blocks.1")
        stopped, calls = _counted(session, lambda: FullCapture().capture(session, paths, counts))
        assert calls == [0, 0, 0]  # neither capture, nor the forced paddle pass, nor the float64 pass reached the tail
        whole, calls = _counted(session, lambda: FullCapture().capture(session, paths))
        assert calls[0] >= 1 and calls[1] >= 1 and calls[2] >= 2  # run to the end: paddle's capture and forced pass
    assert _rows(stopped) == _rows(whole) and len(_rows(whole)) == 3
    assert full.first_bad(stopped.results).torch == "blocks.1.1"  # the planted tanh GELU


def test_a_module_called_again_after_the_tail_is_waited_for():
    with _session(again=True) as session:
        paths, counts = _unit(session, "blocks.1")
        assert counts[0]["blocks.1"] == counts[1]["blocks.1"] == 2
        stopped, calls = _counted(session, lambda: FullCapture().capture(session, paths, counts))
        assert calls == [1, 1, 2]  # its second call comes after the tail: every pass ran to it
        whole, _ = _counted(session, lambda: FullCapture().capture(session, paths))
        recorded = stopped.calls[0]["blocks.1"]
    assert recorded.count == 2
    assert _rows(stopped) == _rows(whole)


def test_the_binary_search_runs_fewer_layers_after_its_units_and_finds_the_same_rows(monkeypatch):
    """Under bf16 no boundary is over budget, so every unit is judged in the sweep, one per capture
    (a limit that holds no two units), after probes that record their unit alone (no spill: the
    captures run their passes)."""
    monkeypatch.setattr(spill, "KEEP_FREE", 1 << 62)  # no disk keeps that much free
    def search(session):
        return BinarySearch(limit_bytes=1).run(session)
    with _session(tanh_in=2, emulate={"paddle": "bf16"}) as session:
        stopped, early = _counted(session, lambda: search(session))
        for module in (full, endtoend):  # every pass to the end
            monkeypatch.setattr(module, "wanted_calls", lambda paths, counts: None)
        whole, late = _counted(session, lambda: search(session))
    assert _rows(stopped) == _rows(whole) and stopped.first_bad.torch == whole.first_bad.torch == "blocks.2.1"
    assert stopped.passes == whole.passes
    assert all(a < b for a, b in zip(early, late)), (early, late)
