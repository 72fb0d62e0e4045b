"""The full strategy where every layer's activations at once do not fit in the memory available:
it judges every layer a few units at a time (strategies.ChunkedCapture) and says so, with the
rows and the layer named of one capture of them all; a run that fits neither way stops with one
line."""

import pytest
from helpers.blocks import BATCH, D, LAYERS, blocks_spec

from converter.compare import memory
from converter.compare.session import Options, PortSession
from converter.errors import UserError
from converter.verify.run import run_on

ONE_UNIT = 3 * D * BATCH * 4 * 2 * 2  # a block's three calls on both sides, float32, inputs alike


def _session(tanh_in):
    return PortSession(blocks_spec(tanh_in), Options(device="cpu"))


def _full(session, available=None):
    """The full strategy's report, with `available` bytes of memory (the machine's when None)."""
    options = Options(device="cpu", strategy="full")
    if available is None:
        return run_on(session, options)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory, "available_memory", lambda cap=None: (available, "the cgroup's limit (test)"))
        return run_on(session, options, capture_limit=ONE_UNIT)


def _between(session) -> int:
    """Memory that holds the run a unit at a time but not every layer's activations at once."""
    session.reference64.tensors.keep = 1  # what so little memory leaves it (memory.one_block)
    whole = memory.estimate(session, None).more
    chunked = memory.estimate(session, ONE_UNIT).more
    assert chunked < whole
    return (whole + chunked) // 2


@pytest.mark.parametrize("tanh_in", [None, 2])
def test_full_judges_every_layer_a_few_units_at_a_time_where_they_do_not_fit_at_once(tanh_in):
    with _session(tanh_in) as session:
        at_once = _full(session)
    with _session(tanh_in) as session:
        chunked = _full(session, _between(session))
    assert chunked.strategy == at_once.strategy == "full"
    said = " ".join(chunked.notes)
    assert "every layer's activations at once need about" in said and "the cgroup's limit (test)" in said
    assert f"{LAYERS + 2} units in" in said  # the input Linear, the blocks, the tail and "full capture in chunks" in said
    assert not any("chunks" in n for n in at_once.notes)
    named = lambda report: None if report.first_bad is None else report.first_bad.torch
    assert named(chunked) == named(at_once) == (None if tanh_in is None else f"blocks.{tanh_in}.1")
    assert chunked.verdict == at_once.verdict == ("pass" if tanh_in is None else "fail")
    rows = lambda report, upto: {r.torch: r.ratio for r in report.layers if upto is None or r.torch < f"blocks.{upto + 1}"}
    once, by_chunk = rows(at_once, tanh_in), rows(chunked, tanh_in)
    # each block's rows up to the first chunk over budget (where it stops), on the same numbers
    assert {p for p in once if p.startswith("blocks.")} == {p for p in by_chunk if p.startswith("blocks.")}
    assert all(by_chunk[p] == pytest.approx(once[p], rel=1e-3) for p in by_chunk if p.startswith("blocks."))
    assert at_once.outputs is not None and chunked.outputs is not None
    assert chunked.outputs.ratio == pytest.approx(at_once.outputs.ratio, rel=1e-3)


def test_a_run_that_fits_neither_at_once_nor_a_unit_at_a_time_stops_with_one_line():
    with _session(None) as session:
        session.reference64.tensors.keep = 1
        too_little = memory.estimate(session, ONE_UNIT).more - 1
        with pytest.raises(UserError) as caught:
            _full(session, too_little)
    said = str(caught.value)
    assert "\n" not in said and "the cgroup's limit (test)" in said and "give smaller inputs, or free memory" in said
