"""The binary search's sweep, where every unit's boundary was recorded: the units before a chunk
return their recorded outputs in the chunk's passes instead of running (compare/known.py), in
the torch model, the paddle model and the float64 reference; the rows are those of passes that run
every unit from the model's inputs; the last chunk, which forces every unit, is handed their own
chunks' forced outputs. The chunks' capture passes are run here (no spill: with the outline pass's
calls read back from disk they run none, test_spill.py)."""

import contextlib

import numpy as np
import paddle
import pytest
import torch

from converter.compare import spill
from converter.compare.precision import ROUNDING_DRAWS
from converter.compare.port import FORCED_PASS
from converter.compare.session import Options, PortSession
from converter.spec import spec_from_functions
from converter.verify import sweep
from converter.verify.strategies import BinarySearch

D, LAYERS, BATCH = 16, 4, 8


@pytest.fixture(autouse=True)
def capture_passes(monkeypatch):
    monkeypatch.setattr(spill, "KEEP_FREE", 1 << 62)  # no disk keeps that much free: no spill
UNIT_BYTES = 6 * D * BATCH * 4 * 2  # a block's three calls on both sides, float32, inputs alike


def boundary_bytes(formats: int) -> int:
    """Every unit's and the model's outputs: float32 twice, float64 once and once per rounding draw
    of each format other than fp32; with none, the forced passes' too (paddle's float32, float64)."""
    return (LAYERS + 2) * D * BATCH * (16 + 8 * ROUNDING_DRAWS * formats + (12 if formats == 0 else 0))


class Seen:
    """An object with state of its own that a block returns beside its output (as a cache is)."""

    def __init__(self):
        self.calls = 0


class TorchBlock(torch.nn.Sequential):
    def __init__(self, stateful):
        super().__init__(torch.nn.Linear(D, D), torch.nn.GELU())
        self.seen = Seen() if stateful else None

    def forward(self, x):
        return super().forward(x) if self.seen is None else (super().forward(x), self.seen)


class PaddleBlock(paddle.nn.Sequential):
    def __init__(self, tanh, stateful):
        super().__init__(paddle.nn.Linear(D, D), paddle.nn.GELU(approximate=tanh))
        self.seen = Seen() if stateful else None

    def forward(self, x):
        return super().forward(x) if self.seen is None else (super().forward(x), self.seen)


def _output(y):
    return y if isinstance(y, (torch.Tensor, paddle.Tensor)) else y[0]


class TorchNet(torch.nn.Module):
    def __init__(self, stateful=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchBlock(stateful) for _ in range(LAYERS)])
        self.tail = torch.nn.Linear(D, D)

    def forward(self, x):
        for block in self.blocks:
            x = _output(block(x)) * 0.5  # the model's own code between the units
        return {"out": self.tail(x)}


class PaddleNet(paddle.nn.Layer):
    def __init__(self, tanh_in=None, stateful=False):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleBlock(i == tanh_in, stateful) for i in range(LAYERS)])
        self.tail = paddle.nn.Linear(D, D)

    def forward(self, x):
        for block in self.blocks:
            x = _output(block(x)) * 0.5
        return {"out": self.tail(x)}


def _session(tanh_in=None, emulate=None, stateful=False):
    def torch_model():
        torch.manual_seed(0)
        return TorchNet(stateful).eval()
    inputs = lambda: (np.random.default_rng(0).standard_normal((BATCH, D)).astype("float32"),)
    spec = spec_from_functions(torch_model, lambda: PaddleNet(tanh_in, stateful), inputs)
    return PortSession(spec, Options(device="cpu", strategy="binary", emulate=emulate or {}))


def _first_linears(session) -> list:
    """blocks.0's Linear in the torch model, the float64 reference and the paddle model."""
    return [session.torch_model.blocks[0][0], session.torch64_module("blocks.0.0"), session.paddle_model.blocks[0][0]]


def _search(session, limit):
    """BinarySearch(limit).run; the forwards that reached blocks.0's Linear, per model; blocks.3's
    outputs in paddle's forced passes and in the float64 reference's passes, in order: what the
    model's code between the units hands the tail there, and what judges that code."""
    calls, handed = [0, 0, 0], {"paddle": [], "float64": []}
    handles = []
    for i, layer in enumerate(_first_linears(session)):
        def count(called, *_, _i=i, _layer=layer):
            calls[_i] += called is _layer  # not a copy of it (paddle's own errors run one, hooks and all)
        handles.append(layer.register_forward_pre_hook(count))

    def forced_paddle(layer, args, out):
        if FORCED_PASS.get():
            handed["paddle"].append(_output(out).numpy())
    handles.append(session.paddle_model.blocks[3].register_forward_post_hook(forced_paddle))
    handles.append(session.torch64_module("blocks.3").register_forward_hook(
        lambda module, args, out: handed["float64"].append(_output(out).numpy().copy())))
    try:
        return BinarySearch(limit_bytes=limit).run(session), calls, handed
    finally:
        for h in handles:
            h.remove()


def _rows(found) -> list:
    return [repr(r) for r in found.results]


@pytest.mark.parametrize("tanh_in,emulate,float64_returned", [(None, None, True), (2, {"paddle": "bf16"}, False)])
def test_chunks_after_the_first_do_not_run_the_units_before_them_and_give_the_same_rows(
        monkeypatch, tanh_in, emulate, float64_returned):
    """A limit that holds the boundaries and one unit's calls: one chunk per unit. fp32: a clean pair,
    every layer swept; bf16 on paddle's side: a tanh GELU in blocks.2 within the end-to-end budget,
    named by the sweep (the float64 reference's dithered draws compute every unit there)."""
    limit = boundary_bytes(len(emulate or {})) + UNIT_BYTES
    with _session(tanh_in, emulate) as session:
        known, fewer, handed = _search(session, limit)
    monkeypatch.setattr(sweep, "returning_recorded", lambda *args, **kwargs: contextlib.nullcontext())
    with _session(tanh_in, emulate) as session:  # a session of its own: copies made once (paddle's float64 one) alike
        whole, more, handed_whole = _search(session, limit)
    captures = LAYERS + 1 if tanh_in is None else tanh_in + 1  # the sweep stops at the chunk it names
    assert f"5 units in {captures} capture(s)" in " ".join(known.notes), known.notes
    assert _rows(known) == _rows(whole)
    if tanh_in is None and float64_returned:
        # the last chunk (the tail's) forces every unit and hands the tail what blocks.3 returned in
        # its own chunk's forced passes (forced inside too): the float64 reference's free pass (the
        # boundaries), then blocks.3's chunk, then the tail's
        assert [len(v) for v in handed.values()] == [len(v) for v in handed_whole.values()] == [2, 3]
        assert all(np.array_equal(v[-1], v[-2]) for v in handed.values())
    # each swept block's Sequential, Linear and GELU; with a clean pair, the tail and the model too
    assert len(known.results) == (3 * LAYERS + 2 if tanh_in is None else 3 * captures)
    named = lambda found: None if found.first_bad is None else found.first_bad.torch
    assert named(known) == named(whole) == (None if tanh_in is None else f"blocks.{tanh_in}.1")
    # the chunks after the first (blocks.1 to blocks.3 and the tail, up to the bug where there is one)
    # ran blocks.0 in torch's capture, paddle's capture and forced pass, and the float64 reference's
    # forced pass; the last (the tail's), which forces every unit, returns its forced outputs where
    # the float64 reference is returned (fp32)
    later = LAYERS if tanh_in is None else tanh_in
    assert [b - a for a, b in zip(fewer, more)] == [later, later * float64_returned, 2 * later], (fewer, more)


def test_without_room_for_the_boundaries_every_chunk_runs_from_the_inputs():
    with _session() as session:
        found, calls, _ = _search(session, UNIT_BYTES)
    assert "5 units in 5 capture(s)" in " ".join(found.notes) and found.first_bad is None
    assert calls[0] >= LAYERS + 1  # every chunk's torch capture ran blocks.0


def test_a_unit_returning_an_object_with_state_of_its_own_runs():
    """A block that returns an object beside its output (a cache the next layers would extend) is
    not returned from the recorded pass: that object belongs to the pass that made it."""
    with _session(stateful=True) as session:
        found, calls, _ = _search(session, boundary_bytes(0) + UNIT_BYTES)
    with _session() as session:
        plain, fewer, _ = _search(session, boundary_bytes(0) + UNIT_BYTES)
    assert "5 units in 5 capture(s)" in " ".join(found.notes) and found.first_bad is None
    assert [b - a for a, b in zip(fewer, calls)] == [LAYERS, LAYERS, 2 * LAYERS]  # run in every later chunk
