"""A head that holds the embedding's own Parameter on both sides: each state dict lists the one
tensor under two names. The tie is one tensor in the plan (the embedding's target, the head's
name its alias), and the port is verified with and without --train; a port that lost the tie is
still named in the structure phase."""

import numpy as np
import pytest

from helpers.cli import run_verify, spec_path
from converter.inmemory import convert_in_memory
from converter.spec import PortSpec
from helpers.train import train_check

pytestmark = pytest.mark.slow


def _spec(tied=True):
    spec = PortSpec.from_file(spec_path("train_tied_heads"))
    build = spec.module.PaddleLM
    spec.module.paddle_model = lambda: build(tied)
    return spec


def test_a_tie_on_both_sides_is_one_tensor_in_the_plan():
    spec = _spec()
    torch_model, paddle_model = spec.torch_model(), spec.paddle_model()
    state, plan, _, _ = convert_in_memory(torch_model, paddle_model)
    (entry,) = [e for e in plan.entries if e.name == "emb.weight"]
    assert entry.aliases == ("head.weight",) and [p.source for p in entry.parts] == ["emb.weight"]
    assert not any(p.source == "head.weight" for e in plan.entries for p in e.parts)
    assert state["head.weight"] is state["emb.weight"]
    np.testing.assert_array_equal(state["emb.weight"], torch_model.emb.weight.detach().numpy())


def test_a_port_tied_on_both_sides_passes_without_and_with_train():
    plain = run_verify("--spec", spec_path("train_tied_heads"), "--device", "cpu")
    assert plain.code == 0 and "PASS" in plain.stdout, plain
    trained = run_verify("--spec", spec_path("train_tied_heads"), "--device", "cpu", "--train", "--steps", "4")
    assert trained.code == 0 and "training verdict: PASS" in trained.stdout, trained


def test_the_tied_port_trains_both_names_as_one_tensor_and_a_lost_tie_is_named():
    kept = train_check(_spec(), steps=4, device="cpu")
    assert kept.first_bad is None, kept.first_bad
    assert {r.phase for r in kept.rows} >= {"loss", "backward", "optimizer", "steps"}
    assert any(r.phase == "steps" and "emb.weight" in r.paddle for r in kept.rows)
    lost = train_check(_spec(tied=False), steps=4, device="cpu")
    fb = lost.first_bad
    assert fb.phase == "structure" and set(fb.torch.split(" = ")) == {"emb.weight", "head.weight"}, fb
    assert "tied in torch, separate tensors in paddle" in fb.note
