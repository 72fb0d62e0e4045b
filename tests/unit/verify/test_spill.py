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
from helpers.resnet import resnet_like

from converter.compare import spill as spill_module
from converter.compare.capture import capture_calls
from converter.compare.identity import view_of
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


def _tensors(call, side) -> list:
    """A call's tensors: inputs, outputs, and those in what it returned (where it is kept)."""
    returned = [] if call.returned is None else flatten(call.returned, side.is_tensor)
    return flatten((call.args, call.kwargs), side.is_tensor) + list(call.outputs) + returned


def _pairs(tensors, same) -> set:
    return {(i, j) for i in range(len(tensors)) for j in range(i) if same(tensors[i], tensors[j])}


@pytest.mark.parametrize("which", [0, 1], ids=["torch", "paddle"])
def test_calls_read_back_hold_what_a_capture_records_tensor_for_tensor(which):
    """Every call's tensors, value for value; torch's, tensor for tensor too: the same tensors
    shared between calls and the same views of one storage (the analysis reads both); a call whose
    tensor was changed in place after it (inner's output, wrapper's input) on copies of its own,
    without its returned structure, as the capture pass records it again. (Paddle's tensors are
    read by value alone: its in-place change here is seen by neither a hook nor the pass's end.)"""
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
            if side is torch_side:
                assert (got.returned is None) == (call.returned is None), path
            mine, theirs = _tensors(got, side), _tensors(call, side)
            if side is paddle_side and call.returned is None:
                mine = mine[:len(theirs)]
            assert len(mine) == len(theirs) > 0 and all(_same(a, b, side) for a, b in zip(mine, theirs)), path
        if side is torch_side:
            mine = [t for path in kept for t in _tensors(back[path], side)]
            theirs = [t for call in kept.values() for t in _tensors(call, side)]
            assert _pairs(mine, lambda a, b: a is b) == _pairs(theirs, lambda a, b: a is b)
            views = lambda a, b: view_of(a) == view_of(b)
            assert _pairs(mine, views) == _pairs(theirs, views) != set()
            assert back["inner"].returned is None and back["inner"].outputs[0] is not back["wrapper"].args[0]
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
    asked = []  # the disk's free bytes, as the spill reads them: a byte less than it keeps free
    monkeypatch.setattr(spill_module, "free_bytes", lambda folder: asked.append(folder) or spill_module.KEEP_FREE - 1)
    spill = Spill(side)
    with paddle.no_grad():
        outline = capture_calls(side, model, run, None, False, spill=spill).calls
    assert asked == [spill.folder]
    assert not spill.complete and spill.nbytes == 0 and spill._file is None
    with pytest.raises(ValueError, match="incomplete"):
        spill.revive(outline, list(outline))


def test_the_mount_table_is_read_as_the_system_writes_it():
    """A mount point with a space (written as \\040), a tmpfs mounted over a disk folder (the
    later mount hides the earlier), a folder beside a mount point sharing its prefix."""
    table = ("/dev/vda / ext4 rw 0 0\n"
             "tmpfs /data/my\\040dir tmpfs rw 0 0\n"
             "/dev/vda /data/over ext4 rw 0 0\n"
             "tmpfs /data/over tmpfs rw 0 0\n")
    assert spill_module.mount_type("/data/my dir/run", table) == "tmpfs"
    assert spill_module.mount_type("/data/over", table) == "tmpfs"
    assert spill_module.mount_type("/data/overt", table) == "ext4"
    assert spill_module.mount_type("/data/my", table) == "ext4"


def test_a_folder_that_cannot_hold_a_file_gives_no_spill(tmp_path):
    gone = tmp_path / "gone"
    assert not Spill(torch_side, str(gone)).complete


def test_a_tensor_not_written_as_bytes_gives_no_spill():
    """A sparse tensor (and a conjugate view, a quantized tensor) is refused by the adapter: the
    spill stops, the pass goes on."""
    spill = Spill(torch_side)
    assert spill.put(torch.ones(3)) is not None
    assert spill.put(torch.eye(3).to_sparse()) is None and not spill.complete


def test_values_changed_in_place_are_written_again_whatever_an_alias_counter_says():
    """A tensor changed in place after it was written is written again where it is met next, as it
    is then: itself (its counter moved), or `.data`, an alias whose counter of its own still reads
    the old version (a `.data` write does not move the tensor's: its values are written again too)."""
    spill = Spill(torch_side)
    y = torch.ones(4)
    with spill.watching():
        first = spill.put(y)
        y.mul_(2.0)
        alias = spill.put(y.data)
        again = spill.put(y)
        y.data.add_(1.0)
        written = spill.put(y)
    spill.finish()
    assert first.values.changed_later and len({id(r.values) for r in (first, alias, again)}) == 3
    assert written.values not in (first.values, again.values) and spill.nbytes == 4 * 4 * 4
    spill.close()


def test_a_tensor_without_a_version_counter_gives_no_spill():
    """Made under torch.inference_mode: a change in place after its call would not show."""
    spill = Spill(torch_side)
    with torch.inference_mode():
        made = torch.ones(3) * 2
    assert spill.put(made) is None and not spill.complete


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
    said = [n for n in spilled.notes if "kept on disk" in n]
    assert len(said) == 1 and not any("kept on disk" in n for n in captured.notes), spilled.notes
    if tanh_in is None:  # every chunk swept: one capture pass fewer each
        chunks = int(next(n for n in captured.notes if "capture(s)" in n).split(" capture(s)")[0].rsplit(" ", 1)[1])
        assert (limit is None) == (chunks == 1) and chunks <= LAYERS + 2
        assert captured.passes - spilled.passes == chunks
    else:  # the named unit captured in full without a pass
        assert captured.passes - spilled.passes == 1


class TorchHead(torch.nn.Module):
    """A wrapper whose output is a view of its Linear's, of the same shape (GPT-2's model ends with
    `hidden_states.view(output_shape)`): its row takes the Linear's budget, found by its storage."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(x).view(x.shape)


class TorchViewed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.head = TorchHead()

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.nn.functional.gelu(block(x))
        return self.head(x)


class PaddleHead(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(x).reshape(x.shape)


class PaddleViewed(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.blocks = paddle.nn.LayerList([paddle.nn.Linear(16, 16) for _ in range(3)])
        self.head = PaddleHead()

    def forward(self, x):
        for block in self.blocks:
            x = x + paddle.nn.functional.gelu(block(x))
        return self.head(x)


def _viewed_spec():
    from converter.spec import spec_from_functions

    def torch_model():
        torch.manual_seed(0)
        return TorchViewed()
    x = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    return spec_from_functions(torch_model, PaddleViewed, lambda: (x,))


def _resnet_spec(bug):
    from converter.spec import spec_from_functions
    x = np.random.default_rng(0).standard_normal((2, 8, 6, 6)).astype(np.float32)
    return spec_from_functions(lambda: resnet_like(True), lambda: resnet_like(False, bug), lambda: (x,))


@pytest.mark.parametrize("limit", [None, 1 << 13], ids=["one chunk", "chunks"])
@pytest.mark.parametrize("case", ["view", "in place", "in place, bug"])
def test_views_and_changes_in_place_give_the_rows_of_the_capture(monkeypatch, case, limit):
    """A model's output a view of its norm's, and torchvision's blocks (ReLU(inplace=True), `out +=
    x`, changing what earlier layers returned): the rows with the spill are those without, and a
    BatchNorm epsilon bug is named at its BatchNorm either way."""
    spec = {"view": _viewed_spec, "in place": lambda: _resnet_spec(None),
            "in place, bug": lambda: _resnet_spec("3.bn1")}[case]

    def run():
        with PortSession(spec(), Options(device="cpu", strategy="binary")) as session:
            return BinarySearch(limit).run(session)
    spilled = run()
    monkeypatch.setattr(spill_module, "KEEP_FREE", 1 << 62)
    captured = run()
    assert [repr(r) for r in spilled.results] == [repr(r) for r in captured.results]
    named = lambda found: None if found.first_bad is None else found.first_bad.torch
    assert named(spilled) == named(captured) == ("3.bn1" if case == "in place, bug" else None)
    assert spilled.passes < captured.passes
