"""A forward row is built once: the end-to-end row, then the layer's own error and notes as one
value an analysis returns (analyze.Local), joined into a new row; no row changes once built."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from converter.results import Verdict
from converter.verify.analyze import Local, joined, judged
from converter.verify.report import LayerResult, Report


def _end_to_end_row(note=""):
    return LayerResult("blocks.1", "blocks.1", "Block", "Block", (4, 8, 32), max_abs=0.5, mean_abs=0.1, max_rel=2.0,
                       cosine=0.99, nan=1, inf=2, formats={"torch": "fp32", "paddle": "fp32"}, note=note,
                       worst_index=(0, 3, 7))


def test_a_row_cannot_change_once_built():
    row = _end_to_end_row()
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.ratio = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.note = "changed"
    assert row.ratio is None and row.note == ""


def test_a_judged_row_keeps_the_end_to_end_figures_and_takes_the_local_ones():
    row = _end_to_end_row("outputs paired by value")
    local = Local(max_abs=0.3, mean_abs=0.01, budget=0.1, ratio=3.0, worst_input="blocks.1.attn",
                  notes=("", "worst at the input of blocks.1.attn"))
    got = judged(row, local)
    assert got is not row and got.verdict is Verdict.FAIL
    end_to_end = ("torch", "paddle", "type", "paddle_type", "shape", "max_abs", "mean_abs", "max_rel", "cosine",
                  "nan", "inf", "formats", "worst_index")
    assert all(getattr(got, name) == getattr(row, name) for name in end_to_end)
    assert (got.local_max_abs, got.local_mean_abs, got.budget, got.ratio, got.worst_input) == \
        (0.3, 0.01, 0.1, 3.0, "blocks.1.attn")
    assert got.note == "outputs paired by value; worst at the input of blocks.1.attn"
    assert row == _end_to_end_row("outputs paired by value")  # the row it was built from is as it was


def test_a_layer_that_could_not_be_judged_keeps_no_ratio():
    got = judged(_end_to_end_row(), Local(notes=("could not be judged: the torch module does not run",)))
    assert got.verdict is Verdict.NOT_JUDGED and got.within_budget is None
    assert got.note == "could not be judged: the torch module does not run"
    assert got.to_json()["local_max_abs"] is None and got.to_json()["max_abs"] == 0.5


@given(st.lists(st.sampled_from(["", "a", "b; c", "forcing"]), max_size=5), st.sampled_from(["", "e2e"]))
def test_notes_are_added_in_order_and_empty_ones_left_out(notes, first):
    local = Local()
    for note in notes:
        local = local.noted(note)
    assert local.notes == tuple(notes)
    said = [n for n in [first, *notes] if n]
    assert judged(_end_to_end_row(first), local).note == "; ".join(said) == joined(first, *notes)


def test_final_outputs_read_back_as_the_first_bad_row_with_its_names():
    precision = {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}}
    rows = [LayerResult("fc", "fc", "Linear", "Linear", (2, 4), ratio=0.5)]
    outputs = LayerResult("", "", "Net", "Net", (2, 4), max_abs=0.3, budget=1e-6, ratio=3e5, note="end to end")
    report = Report(rows, outputs, precision, [], "full", 2, outputs=outputs)
    body = json.loads(json.dumps(report.to_json()))
    back = Report.from_json(body)
    assert back.first_bad is back.outputs and back.first_bad.type == "Net" and back.outputs.ratio == 3e5
    assert back.to_json() == body


@pytest.mark.slow
def test_a_parent_row_judged_at_its_childs_input_keeps_its_own_figures():
    """A real port whose block hands its attention x where torch hands norm(x): the block's row
    holds its end-to-end figures, its own output's mean error, and the child input's ratio."""
    from converter.compare.session import Options
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from test_verify_parent_inputs import PaddleNet, _inputs, _torch_model
    report = verify(spec_from_functions(_torch_model, PaddleNet, _inputs), Options(device="cpu", strategy="full"))
    row = next(r for r in report.layers if r.torch == "blocks.1")
    assert row.worst_input == "blocks.1.attn" and row.verdict is Verdict.FAIL
    assert row.note.endswith("worst at the input of blocks.1.attn, as this layer's own code computed it")
    assert row.max_abs > 0 and row.cosine is not None and len(row.worst_index) == 3
    assert row.local_mean_abs is not None and row.local_max_abs > row.budget
    clean = [r for r in report.layers if r.torch.startswith("blocks.0")]
    assert clean and all(r.verdict is Verdict.PASS for r in clean)  # the block before is within budget
