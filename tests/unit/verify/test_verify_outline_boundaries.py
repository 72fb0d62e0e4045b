"""The binary search's outline pass keeps the outputs of the modules that may be its units (the
model, what sits beside its blocks, the blocks), and the float64 model's free-running outputs
there from a pass beside it, so that the units' boundaries take no paired pass of their own: one
forward fewer on each side, the same rows; where they do not fit the capture limit, the outline
records shapes alone and the boundaries take their pass, as before."""

import pytest
from helpers.blocks import BATCH, D, LAYERS, blocks_spec

from converter.compare import spill
from converter.compare.session import Options, PortSession
from converter.frameworks import paddle_side, torch_side
from converter.verify import strategies
from converter.verify.strategies import BinarySearch, unit_candidates

def _session(tanh_in):
    return PortSession(blocks_spec(tanh_in), Options(device="cpu", strategy="binary"))


def _search(tanh_in, limit=None):
    """BinarySearch(limit).run, and the forwards of each model that reached its first block."""
    with _session(tanh_in) as session:
        calls = [0, 0]
        firsts = [session.torch_model.blocks[0], session.paddle_model.blocks[0]]
        handles = []
        for i, layer in enumerate(firsts):
            def count(called, *_, _i=i, _layer=layer):
                calls[_i] += called is _layer
            handles.append(layer.register_forward_pre_hook(count))
        try:
            return BinarySearch(limit).run(session), calls
        finally:
            for h in handles:
                h.remove()


def test_the_candidates_are_the_model_what_sits_beside_its_blocks_and_the_blocks():
    with _session(None) as session:
        blocks = list(session.torch_model.blocks)
        assert unit_candidates(torch_side, session.torch_model, blocks) == \
            {"", "embed", "blocks", "tail", *(f"blocks.{i}" for i in range(LAYERS))}
        assert unit_candidates(paddle_side, session.paddle_model, list(session.paddle_model.blocks)) == \
            {"", "embed", "blocks", "tail", *(f"blocks.{i}" for i in range(LAYERS))}
        assert unit_candidates(torch_side, session.torch_model, []) == set()


@pytest.mark.parametrize("tanh_in", [None, 2])
def test_the_outline_keeps_the_boundaries_one_forward_fewer_on_each_side_the_same_rows(monkeypatch, tanh_in):
    kept, fewer = _search(tanh_in)
    monkeypatch.setattr(strategies, "unit_candidates", lambda side, model, blocks: set())
    apart, more = _search(tanh_in)
    assert [repr(r) for r in kept.results] == [repr(r) for r in apart.results]
    named = lambda found: None if found.first_bad is None else found.first_bad.torch
    assert named(kept) == named(apart) == (None if tanh_in is None else f"blocks.{tanh_in}.1")
    assert [b - a for a, b in zip(fewer, more)] == [1, 1], (fewer, more)
    assert apart.passes - kept.passes == 1


@pytest.mark.parametrize("spilled", [True, False])
def test_boundaries_that_do_not_fit_the_limit_are_not_kept_by_the_outline(monkeypatch, spilled):
    """A limit below one unit's outputs: the outline keeps nothing (its allowance is exceeded, and
    it runs again as an outline alone), and every probe reads its unit back from the outline's
    spill (compare/spill.py), or, without one, records it alone."""
    if not spilled:
        monkeypatch.setattr(spill, "KEEP_FREE", 1 << 62)  # no disk keeps that much free: no spill
    found, calls = _search(None, limit=D * BATCH * 4)
    plain, _ = _search(None)
    assert found.first_bad is None and plain.first_bad is None
    assert {r.torch for r in found.results} == {r.torch for r in plain.results}
    if spilled:  # torch's float32 model runs in capture passes alone: the outline's, no probe's
        assert calls[0] <= 2
    else:
        assert calls[0] > LAYERS  # the probes ran passes of their own
