"""The outline pass's calls written to disk (compare/spill.py) and read back by the binary
strategy's sweep and by the full capture of the unit its search names, in place of capture passes
of their own: the calls read back hold what a capture pass records, value for value and tensor for
tensor; the rows are those of the runs that capture again; nothing is left on disk; a disk too
full or held in memory gives no spill, and the passes run as they would without one."""

import os

import numpy as np
import paddle
import pytest
import torch
from helpers.blocks import LAYERS, blocks_spec

from converter.compare import spill as spill_module
from converter.compare.capture import capture_calls
from converter.compare.session import Options, PortSession
from converter.compare.spill import Spill, on_disk
from converter.frameworks import paddle_side, torch_side
from converter.tree import flatten
from converter.verify.strategies import BinarySearch


class TorchParts(torch.nn.Module):
    """A wrapper returning its child's output, a child changing its input in place after another
    recorded it, a bf16 cast, integer and boolean tensors, a 0-d one, a dict returned."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(6, 6)
        self.wrapper = torch.nn.Sequential(torch.nn.Linear(6, 6))
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x, ids):
        y = self.inner(x)
        z = self.wrapper(y)
        y.mul_(2.0)  # after inner's output was recorded
        w = self.norm(y + z)
        return {"w": w, "half": w.to(torch.bfloat16), "ids": ids * 2, "mask": ids > 1, "scale": w.sum()}


class PaddleParts(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.inner = paddle.nn.Linear(6, 6)
        self.wrapper = paddle.nn.Sequential(paddle.nn.Linear(6, 6))
        self.norm = paddle.nn.LayerNorm(6)

    def forward(self, x, ids):
        y = self.inner(x)
        z = self.wrapper(y)
        y.scale_(2.0)
        w = self.norm(y + z)
        return {"w": w, "half": w.astype("bfloat16"), "ids": ids * 2, "mask": ids > 1, "scale": w.sum()}


def _sides():
    torch.manual_seed(0)
    paddle.seed(0)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype("float32")
    ids = np.array([0, 1, 2, 3])
    t_model, p_model = TorchParts(), PaddleParts()
    return ((torch_side, t_model, lambda: t_model(torch.from_numpy(x), torch.from_numpy(ids))),
            (paddle_side, p_model, lambda: p_model(paddle.to_tensor(x), paddle.to_tensor(ids))))


def _same(a, b, side) -> bool:
    if side is torch_side:
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("which", [0, 1], ids=["torch", "paddle"])
def test_calls_read_back_hold_what_a_capture_records_tensor_for_tensor(which):
    side, model, run = _sides()[which]
    with torch.no_grad(), paddle.no_grad():
        kept = capture_calls(side, model, run, None, True).calls  # in memory (inner recorded as a copy)
        spill = Spill(side)
        outline = capture_calls(side, model, run, None, False, spill=spill).calls
        back = spill.revive(outline, list(outline))
    try:
        assert back.keys() == kept.keys() and spill.nbytes > 0
        for path, call in kept.items():
            got = back[path]
            assert (got.start, got.end, got.shapes, got.type) == (call.start, call.end, call.shapes, call.type)
            # (a call recorded as a copy, after an in-place change, keeps no returned structure)
            returned = (lambda c: flatten(c.returned, side.is_tensor)) if call.returned is not None \
                else (lambda c, _got=got: flatten(c.returned, side.is_float_tensor) if c is _got else c.outputs)
            for tensors in (lambda c: flatten((c.args, c.kwargs), side.is_tensor), lambda c: c.outputs, returned):
                assert len(tensors(got)) == len(tensors(call)) > 0, path
                assert all(_same(a, b, side) for a, b in zip(tensors(got), tensors(call))), path
        # calls that shared one tensor share one again: inner's output is wrapper's input (before the
        # in-place change, as both saw it), wrapper returns its child's output, its child takes its input
        assert back["inner"].outputs[0] is back["wrapper"].args[0]
        assert back["wrapper"].outputs[0] is back["wrapper.0"].outputs[0]
        assert back["wrapper.0"].args[0] is back["wrapper"].args[0]
        dtypes = {str(t.dtype) for t in flatten(back[""].returned, side.is_tensor)}
        assert any("bfloat16" in d for d in dtypes) and any("bool" in d for d in dtypes)
    finally:
        spill.close()


def test_a_spill_leaves_nothing_on_disk(tmp_path):
    side, model, run = _sides()[0]
    spill = Spill(side, str(tmp_path))
    with torch.no_grad():
        capture_calls(side, model, run, None, False, spill=spill)
    assert spill.complete and spill.nbytes > 0 and os.listdir(tmp_path) == []
    spill.close()
    assert not spill.complete and os.listdir(tmp_path) == []


def test_a_disk_that_would_keep_too_little_free_gives_an_incomplete_spill_that_cannot_be_read(monkeypatch):
    side, model, run = _sides()[1]
    free = spill_module.shutil.disk_usage(on_disk()).free
    monkeypatch.setattr(spill_module, "KEEP_FREE", free + 1)
    spill = Spill(side)
    with paddle.no_grad():
        outline = capture_calls(side, model, run, None, False, spill=spill).calls
    assert not spill.complete and spill.nbytes == 0 and spill._file is None
    with pytest.raises(ValueError, match="incomplete"):
        spill.revive(outline, list(outline))


def test_a_folder_held_in_memory_is_not_used():
    if spill_module._filesystem("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    assert on_disk("/dev/shm") is None and not Spill(torch_side, "/dev/shm").complete
    assert on_disk(os.path.dirname(__file__)) is not None or spill_module._filesystem(__file__) == "tmpfs"


def _binary(tanh_in, limit):
    with PortSession(blocks_spec(tanh_in), Options(device="cpu", strategy="binary")) as session:
        return BinarySearch(limit).run(session)


@pytest.mark.parametrize("limit", [None, 1 << 16], ids=["one chunk", "chunks"])
@pytest.mark.parametrize("tanh_in", [None, 2])
def test_the_sweep_reads_the_outline_back_and_gives_the_rows_of_its_own_captures(monkeypatch, tanh_in, limit):
    """With the outline's calls read back, the sweep (a clean pair) and the full capture of the unit
    the search names (the tanh GELU in one block) run no capture pass, and their rows are those of
    the runs that capture again."""
    spilled = _binary(tanh_in, limit)
    monkeypatch.setattr(spill_module, "KEEP_FREE", 1 << 62)  # no disk keeps that much free: no spill
    captured = _binary(tanh_in, limit)
    assert [repr(r) for r in spilled.results] == [repr(r) for r in captured.results]
    named = lambda found: None if found.first_bad is None else found.first_bad.torch
    assert named(spilled) == named(captured) == (None if tanh_in is None else f"blocks.{tanh_in}.1")
    if tanh_in is None:  # every chunk swept: one capture pass fewer each
        chunks = int(next(n for n in captured.notes if "capture(s)" in n).split(" capture(s)")[0].rsplit(" ", 1)[1])
        assert (limit is None) == (chunks == 1) and chunks <= LAYERS + 2
        assert captured.passes - spilled.passes == chunks
    else:  # the named unit captured in full without a pass
        assert captured.passes - spilled.passes == 1
