"""Layer-streamed verification (compare/stream.py): a torch model built on the meta device and a
paddle model built under LazyGuard verified with the checkpoint's weights, each block's weights
made when one of its modules runs and dropped after. Streamed and in-memory runs give the same
rows bit for bit, the tensors held stay within the part outside the blocks and two blocks per
side, and a planted bug is named at its module."""

import contextlib
import math

import numpy as np
import paddle
import pytest
import torch
from safetensors.torch import save_file

from converter.compare.session import Options, PortSession
from converter.errors import UserError
from converter.spec import spec_from_functions
from converter.compare import memory, recycle
from converter.compare.widen import BlockTensors
from converter.verify.run import run_on, verify

H, HEADS, FFN, VOCAB, LAYERS, SEQ = 32, 4, 48, 64, 4, 8


class TorchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(H))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = TorchNorm(), TorchNorm()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(H, H, bias=False) for _ in range(4))
        self.up_proj, self.down_proj = torch.nn.Linear(H, FFN), torch.nn.Linear(FFN, H)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        b, t, _ = x.shape
        y = self.norm1(x)
        split = lambda z: z.view(b, t, HEADS, H // HEADS).transpose(1, 2)
        q, k, v = split(self.q_proj(y)), split(self.k_proj(y)), split(self.v_proj(y))
        scores = q @ k.transpose(-1, -2) / math.sqrt(H // HEADS)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -1e9)
        x = x + self.o_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, H))
        return x + self.down_proj(self.act(self.up_proj(self.norm2(x))))


class TorchTiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, H)
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(LAYERS)])
        self.norm = TorchNorm()
        self.head = torch.nn.Linear(H, VOCAB, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class PaddleNorm(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.weight = self.create_parameter([H], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x):
        return self.weight * (x * paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self, act):
        super().__init__()
        self.norm1, self.norm2 = PaddleNorm(), PaddleNorm()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (paddle.nn.Linear(H, H, bias_attr=False) for _ in range(4))
        self.up_proj, self.down_proj = paddle.nn.Linear(H, FFN), paddle.nn.Linear(FFN, H)
        self.act = act

    def forward(self, x):
        b, t, _ = x.shape
        y = self.norm1(x)
        split = lambda z: z.reshape([b, t, HEADS, H // HEADS]).transpose([0, 2, 1, 3])
        q, k, v = split(self.q_proj(y)), split(self.k_proj(y)), split(self.v_proj(y))
        scores = q @ k.transpose([0, 1, 3, 2]) / math.sqrt(H // HEADS)
        future = paddle.triu(paddle.ones([t, t]), 1).astype("bool")
        scores = paddle.where(future, paddle.full_like(scores, -1e9), scores)
        ctx = paddle.nn.functional.softmax(scores, -1) @ v
        x = x + self.o_proj(ctx.transpose([0, 2, 1, 3]).reshape([b, t, H]))
        return x + self.down_proj(self.act(self.up_proj(self.norm2(x))))


class PaddleTiny(paddle.nn.Layer):
    def __init__(self, bug_at=None):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, H)
        self.layers = paddle.nn.LayerList([PaddleBlock(paddle.nn.GELU() if i == bug_at else paddle.nn.Silu())
                                           for i in range(LAYERS)])
        self.norm = PaddleNorm()
        self.head = paddle.nn.Linear(H, VOCAB, bias_attr=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def inputs():
    return {"input_ids": np.random.default_rng(1).integers(0, VOCAB, (2, SEQ)).astype("int64")}


def meta_torch():
    with torch.device("meta"):
        return TorchTiny().eval()


def lazy_paddle(bug_at=None):
    with paddle.LazyGuard():
        return PaddleTiny(bug_at)


@pytest.fixture(scope="module", params=["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    model = TorchTiny()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.empty_like(p).uniform_(0.8, 1.2) if "norm" in name else torch.randn_like(p) * 0.2)
    path = tmp_path_factory.mktemp("stream") / f"tiny-{request.param}.safetensors"
    save_file({k: v.to(getattr(torch, request.param)).contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def rows(report):
    return [repr(r) for r in report.layers]


SLOW = pytest.mark.slow  # the fast subset keeps one case of each test: fp32, clean, full


@pytest.mark.parametrize("strategy", ["full", pytest.param("binary", marks=SLOW)])
@pytest.mark.parametrize("bug_at", [None, pytest.param(2, marks=SLOW)])
def test_streamed_and_in_memory_runs_give_the_same_rows_bit_for_bit(checkpoint, strategy, bug_at):
    options = Options(device="cpu", strategy=strategy)
    in_memory = verify(spec_from_functions(TorchTiny, lambda: lazy_paddle(bug_at), inputs), options,
                       weights=checkpoint, bisect=True)
    streamed = verify(spec_from_functions(meta_torch, lambda: lazy_paddle(bug_at), inputs), options,
                      weights=checkpoint, bisect=True)
    assert rows(streamed) == rows(in_memory) and len(rows(streamed)) > 0
    assert repr(streamed.outputs) == repr(in_memory.outputs)
    assert streamed.verdict == in_memory.verdict
    assert any("streamed from" in n for n in streamed.notes) and not any("streamed from" in n for n in in_memory.notes)
    if bug_at is None:
        assert streamed.first_bad is None
    else:  # the planted bug (GELU for SiLU in the third block) named at its module
        assert streamed.first_bad.torch == f"layers.{bug_at}.act"
        assert streamed.first_bad.paddle == f"layers.{bug_at}.act"


def _torch_bytes_held(model) -> int:
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
               if not t.is_meta)


def _paddle_bytes_held(model) -> int:
    return sum(int(np.prod(p.shape)) * p.element_size() for p in model.parameters() if p._is_initialized())


def _block_bytes(torch_block) -> int:
    return sum(p.numel() * p.element_size() for p in torch_block.parameters())


@pytest.mark.parametrize("strategy", ["full", pytest.param("binary", marks=SLOW)])
def test_the_tensors_held_stay_within_the_part_outside_the_blocks_and_one_block_per_side(checkpoint, strategy,
                                                                                        monkeypatch):
    spec = spec_from_functions(meta_torch, lazy_paddle, inputs)
    options = Options(device="cpu", strategy=strategy)
    limit = 1 << 20
    with PortSession(spec, options, weights=checkpoint) as session:
        need = memory.estimate(session, None if strategy == "full" else limit).more  # no room beyond it: one block per side
        monkeypatch.setattr(memory, "available_memory", lambda cap=None: (int(need / 0.85), "available memory"))
        blocks = session.torch_model.layers
        outside = sum(p.numel() * p.element_size() for name, p in session.torch_model.named_parameters()
                      if not name.startswith("layers."))
        bound = outside + _block_bytes(blocks[0])
        wide = session.reference64.tensors
        seen = {"torch": [], "paddle": [], "float64": []}
        torch_hooks = [m.register_forward_hook(lambda *_: seen["torch"].append(_torch_bytes_held(session.torch_model)))
                       for m in session.torch_model.modules()]
        torch_hooks += [m.register_forward_hook(lambda *_: seen["float64"].append(wide.held_bytes()))
                        for m in session.torch64.modules()]
        paddle_hooks = [layer.register_forward_post_hook(
            lambda *_: seen["paddle"].append(_paddle_bytes_held(session.paddle_model)))
            for layer in session.paddle_model.sublayers(include_self=True)]
        try:
            report = run_on(session, options, capture_limit=limit)
        finally:
            for h in torch_hooks + paddle_hooks:
                h.remove()
        assert report.first_bad is None
        for side in ("torch", "paddle"):
            assert len(seen[side]) > LAYERS and max(seen[side]) <= bound, side
            assert max(seen[side]) > outside + _block_bytes(blocks[0]) // 2  # weights were there when they ran
        assert wide.keep == 1 and 0 < max(seen["float64"]) <= 2 * bound  # widened to float64: twice the bytes
        # both sides' estimate counts the part outside the blocks and one block, not the whole model
        whole = sum(p.numel() * p.element_size() for p in session.torch_model.parameters())
        assert memory.estimate(session, None if strategy == "full" else 1 << 20).models == 2 * bound < 2 * whole
    assert _torch_bytes_held(session.torch_model) == 0  # every tensor back on the meta device after the run
    assert _paddle_bytes_held(session.paddle_model) == 0


def test_with_room_to_spare_every_block_is_kept_made_and_the_rows_are_the_same(checkpoint):
    spec = spec_from_functions(meta_torch, lazy_paddle, inputs)
    options = Options(device="cpu", strategy="full")
    made = []
    with PortSession(spec, options, weights=checkpoint) as session:
        tensors = session.streams["torch"].tensors
        first = next(iter(tensors._blocks[0])).make
        tensors._blocks[0][0].make = lambda: made.append(1) or first()
        report = run_on(session, options)
        kept = {side: s.tensors.keep for side, s in session.streams.items()}
    assert kept == {"torch": LAYERS, "paddle": LAYERS}
    assert len(made) == 2  # the first block read for the memory estimate's forward, then once for every pass
    assert sum("streamed weights are kept" in n for n in report.notes) == 2
    in_memory = verify(spec_from_functions(TorchTiny, lazy_paddle, inputs), options, weights=checkpoint)
    assert rows(report) == rows(in_memory) and report.verdict == in_memory.verdict == "pass"


def test_a_meta_model_without_weights_is_one_line():
    with pytest.raises(UserError) as caught:
        verify(spec_from_functions(meta_torch, lazy_paddle, inputs), Options(device="cpu"))
    said = str(caught.value)
    assert "\n" not in said and "meta device" in said and "--weights" in said


def test_a_checkpoint_that_does_not_fit_the_meta_model_is_one_line(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"embed.weight": torch.zeros(VOCAB, H)}, str(path))
    with pytest.raises(UserError) as caught:
        verify(spec_from_functions(meta_torch, lazy_paddle, inputs), Options(device="cpu"), weights=str(path))
    said = str(caught.value)
    assert "\n" not in said and "does not fit torch_model()" in said and "layers.0.norm1.weight" in said


def test_paddles_float64_copy_of_a_streamed_model_is_another_model_and_leaves_it_alone(checkpoint):
    from converter.frameworks import paddle_side
    spec = spec_from_functions(meta_torch, lazy_paddle, inputs)
    with PortSession(spec, Options(device="cpu"), weights=checkpoint) as session:
        before = paddle_side.to_numpy(session.run_paddle())
        wide = session.paddle64_outputs([""])[""][0]
        after = paddle_side.to_numpy(session.run_paddle())
        assert session._paddle64 is not session.paddle_model
    assert wide.dtype == np.float64 and np.array_equal(before, after)
    assert 0 < np.abs(wide - before).max() < 1e-4  # float64 against float32: apart by rounding alone


def _count_makes(session) -> dict:
    """How many times each block's tensors are made, per side (torch, paddle, the float64 reference)."""
    made = {}
    for side, tensors in (("torch", session.streams["torch"].tensors), ("paddle", session.streams["paddle"].tensors),
                          ("float64", session.reference64.tensors)):
        for i, records in enumerate(tensors._blocks):
            record = records[0]
            record.make = lambda make=record.make, key=(side, i): made.__setitem__(key, made.get(key, 0) + 1) or make()
    return made


def test_the_sweep_makes_no_block_for_the_units_it_returns_recorded(checkpoint, monkeypatch):
    """The binary search's sweep with room for the boundaries, one unit a chunk: a block before a
    chunk returns its recorded outputs there (compare/known.py) without its weights being made, on
    every side; the rows are those of a sweep whose chunks run every block. (The chunks' capture
    passes run: no spill.)"""
    from converter.compare import spill
    from converter.verify import sweep as sweeping
    from converter.verify.strategies import BinarySearch
    monkeypatch.setattr(spill, "KEEP_FREE", 1 << 62)  # no disk keeps that much free
    spec = spec_from_functions(meta_torch, lazy_paddle, inputs)

    def sweep():
        with PortSession(spec, Options(device="cpu", strategy="binary"), weights=checkpoint) as session:
            made = _count_makes(session)
            found = BinarySearch(limit_bytes=1 << 17).run(session)
        return found, made
    returned, fewer = sweep()
    monkeypatch.setattr(sweeping, "returning_recorded", lambda *args, **kwargs: contextlib.nullcontext())
    run, more = sweep()
    assert f"{LAYERS + 3} units in {LAYERS + 3} capture(s)" in " ".join(returned.notes), returned.notes
    assert [repr(r) for r in returned.results] == [repr(r) for r in run.results] and returned.first_bad is None
    assert fewer.keys() == more.keys() and len(fewer) == 3 * LAYERS
    # blocks.0 runs in its own chunk and returns recorded in the later ones: made that many times fewer
    for side in ("torch", "paddle", "float64"):
        assert more[side, 0] - fewer[side, 0] >= LAYERS, (side, fewer, more)
        assert all(fewer[side, i] <= more[side, i] for i in range(LAYERS)), (side, fewer, more)


@pytest.mark.parametrize("bug_at", [None, 2])
def test_full_on_streamed_weights_whose_activations_do_not_fit_judges_a_few_blocks_at_a_time(checkpoint, bug_at,
                                                                                            monkeypatch):
    """Streamed weights and memory that holds the run a block at a time but not every layer's
    activations at once: full captures a few units at a time, naming what one capture of them all
    names, on the same numbers."""
    options = Options(device="cpu", strategy="full")
    at_once = verify(spec_from_functions(TorchTiny, lambda: lazy_paddle(bug_at), inputs), options,
                     weights=checkpoint, bisect=True)
    with PortSession(spec_from_functions(meta_torch, lambda: lazy_paddle(bug_at), inputs), options,
                     weights=checkpoint) as session:
        limit = memory.block_activations(session)
        whole, chunked = memory.estimate(session, None).more, memory.estimate(session, limit).more
        assert chunked < whole
        monkeypatch.setattr(memory, "available_memory", lambda cap=None: ((whole + chunked) // 2, "the figure set here"))
        in_chunks = run_on(session, options, bisect=True, capture_limit=limit)
    said = " ".join(in_chunks.notes)
    assert "every layer's activations at once need about" in said and "full capture in chunks" in said
    assert not any("chunks" in n for n in at_once.notes)
    named = lambda report: None if report.first_bad is None else report.first_bad.torch
    assert named(in_chunks) == named(at_once) == (None if bug_at is None else f"layers.{bug_at}.act")
    once = {r.torch: r.ratio for r in at_once.layers}
    assert in_chunks.layers and all(r.ratio == pytest.approx(once[r.torch], rel=1e-3) for r in in_chunks.layers
                                    if r.ratio is not None)


def test_a_streamed_run_makes_most_blocks_on_storage_lent_again(checkpoint, monkeypatch):
    asked = []
    empty = recycle.Storages.empty

    def counted(self, shape, dtype):
        before = {s.data_ptr() for s in self._lent}
        made = empty(self, shape, dtype)
        asked.append(made.data_ptr() in before)
        return made
    monkeypatch.setattr(recycle.Storages, "empty", counted)
    monkeypatch.setattr(BlockTensors, "hold_within", lambda self, allowance: self.keep)  # one block per side
    options = Options(device="cpu", strategy="binary")
    with PortSession(spec_from_functions(meta_torch, lazy_paddle, inputs), options, weights=checkpoint) as session:
        report = run_on(session, options, bisect=True)
    assert report.verdict == "pass" and report.first_bad is None
    assert len(asked) > 2 * LAYERS and sum(asked) > len(asked) / 2
