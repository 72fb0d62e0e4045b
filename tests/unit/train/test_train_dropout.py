"""Every dropout the models apply is set to 0 for the training checks, whether a module, a float
attribute handed to a functional call (HF's sdpa attention, DeBERTa's StableDropout) or a model
config's field read in the forward; the rates are put back after, and a rate that differs between
paired layers (or config fields of one name) is a finding of the structure phase, with both rates."""

import pytest

from helpers.cli import spec_path
from converter.compare.session import Options, PortSession
from converter.spec import PortSpec
from helpers.train import train_check
from converter.train.backward import pair_layers
from converter.train.session import TrainSession
from converter.train.spec import TrainSpec
from converter.train.structure import dropout_rows

pytestmark = pytest.mark.slow


def _spec(torch_rates=None, paddle_rates=None):
    spec = PortSpec.from_file(spec_path("train_attention_dropout"))
    build = spec.module.build
    spec.module.torch_model = lambda: build("torch", **(torch_rates or {}))
    spec.module.paddle_model = lambda: build("paddle", **(paddle_rates or {}))
    return spec


def _rates(model) -> dict:
    c = model.config
    drop = model.drop.drop_prob if hasattr(model.drop, "drop_prob") else model.drop.p
    attention = getattr(model.attn, "dropout_prob", getattr(model.attn, "attention_dropout", None))
    return {"attention": attention, "hidden": drop, "config": (c.attention_probs_dropout_prob, c.hidden_dropout_prob,
                                                                c.classifier_dropout), "flag": c.use_dropout}


def test_every_dropout_is_zeroed_named_and_put_back():
    spec = _spec()
    with PortSession(spec, Options(device="cpu")) as port, port.training():
        before = _rates(port.torch_model), _rates(port.paddle_model)
        session = TrainSession(port, TrainSpec(spec))
        zeroed_t = {z.name: z.rate for z in session.dropout.torch}
        zeroed_p = {z.name: z.rate for z in session.dropout.paddle}
        during = _rates(port.torch_model), _rates(port.paddle_model)
        rows = dropout_rows(session, pair_layers(session))
        session.restore()
        after = _rates(port.torch_model), _rates(port.paddle_model)
    assert zeroed_t == {"attn.dropout_prob": 0.1, "drop.drop_prob": 0.2, "config.attention_probs_dropout_prob": 0.1,
                        "config.hidden_dropout_prob": 0.2, "config.classifier_dropout": 0.3}
    assert zeroed_p == {"attn.attention_dropout": 0.1, "drop.p": 0.2, "config.attention_probs_dropout_prob": 0.1,
                        "config.hidden_dropout_prob": 0.2, "config.classifier_dropout": 0.3}
    assert session.dropout.count == (2, 2)  # modules and layers; the config fields are not counted there
    for side in during:
        assert side == {"attention": 0.0, "hidden": 0.0, "config": (0.0, 0.0, 0.0), "flag": True}
    assert after == before and before[0]["attention"] == 0.1 and before[1]["config"][2] == 0.3
    assert rows == []


def test_a_port_whose_dropouts_are_not_modules_passes():
    """Before, torch's forward stayed random (exit 2, "functional dropout?") with every module at 0."""
    report = train_check(_spec(), steps=3, device="cpu")
    assert report.first_bad is None and report.exit_code == 0, report.first_bad


@pytest.mark.parametrize("which, torch_name, paddle_name, said", [
    ("attention", "attn", "attn", "torch 0.1 (attn.dropout_prob), paddle 0.15 (attn.attention_dropout)"),
    ("hidden", "drop", "drop", "torch 0.2 (drop.drop_prob), paddle 0.15 (drop.p)"),
])
def test_a_rate_that_differs_in_a_layer_is_named_in_structure_with_both_rates(which, torch_name, paddle_name, said):
    report = train_check(_spec(paddle_rates={which: 0.15}), steps=2, device="cpu")
    fb = report.first_bad
    assert fb.phase == "structure" and (fb.torch, fb.paddle) == (torch_name, paddle_name), fb
    assert fb.note == f"dropout rates differ: {said}"
    config = {r.torch: r.note for r in report.rows if r.phase == "structure" and r.torch.startswith("config.")}
    field = {"attention": "attention_probs_dropout_prob", "hidden": "hidden_dropout_prob"}[which]
    assert config == {f"config.{field}": f"dropout rates differ: torch {dict(attention=0.1, hidden=0.2)[which]:g}, "
                                         "paddle 0.15"}
    (d,) = report.diagnosis
    assert said in d.cause and "dropout rate" in d.hint and report.exit_code == 1


def test_a_config_rate_read_in_the_forward_is_compared_by_its_field():
    report = train_check(_spec(torch_rates={"classifier": 0.5}), steps=2, device="cpu")
    bad = [r for r in report.rows if r.phase == "structure"]
    assert [(r.torch, r.note) for r in bad] == [("config.classifier_dropout",
                                                 "dropout rates differ: torch 0.5, paddle 0.3")]
    assert report.first_bad is bad[0]
