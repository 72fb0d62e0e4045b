"""Detection of the shipped rule set from a checkpoint's keys and shapes (no --mapping)."""

import json
import os

import pytest
import torch

from helpers.cli import run_convert
from converter.errors import UserError
from converter.io.base import TensorInfo
from converter.io.pdparams import load_pdparams
from converter.rules.detect import detect
from helpers.hf_models import RECORDED, case_id, hf_state


def _infos(keys_shapes):
    return {k: TensorInfo(k, "float32", tuple(s)) for k, s in keys_shapes.items()}


@pytest.mark.parametrize("case", RECORDED, ids=[case_id(c) for c in RECORDED])
@pytest.mark.slow
def test_each_family_with_and_without_heads_is_detected(case):
    found = detect(_infos(case["hf"]), target="paddlenlp")
    assert found.chosen.name in [case["family"]] + case["same_file"]
    assert not found.also_fit  # no other set fits and writes something else


def _bert_keys(head=False):
    case = next(c for c in RECORDED if c["hf_class"] == ("BertForSequenceClassification" if head else "BertModel"))
    return case


def test_bare_bert_keys_name_roberta_as_the_same_file(tmp):
    """BERT and RoBERTa checkpoints of the bare model have the same keys and the same map: one
    set is used, and the line says the other gives the same file (not that it is ambiguous)."""
    case = _bert_keys()
    torch.save(hf_state(case), tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--quiet")
    assert r.code == 0, r
    line = r.stderr.splitlines()[0]
    assert line.startswith("mapping: detected 'bert' for PaddleNLP 2.8.1 (maps all ") and "'roberta' gives the same file" in line
    assert "also fit" not in line


@pytest.mark.slow


def test_mapping_auto_is_the_default_said_explicitly(tmp):
    case = _bert_keys(head=True)
    torch.save(hf_state(case), tmp / "m.bin")
    a = run_convert(tmp / "m.bin", tmp / "a.pdparams", "--quiet")
    b = run_convert(tmp / "m.bin", tmp / "b.pdparams", "--quiet", "--mapping", "auto")
    assert a.code == b.code == 0
    assert a.stderr.splitlines()[0] == b.stderr.splitlines()[0]
    assert "detected 'bert'" in a.stderr
    assert (tmp / "a.pdparams").read_bytes() == (tmp / "b.pdparams").read_bytes()


@pytest.mark.parametrize("wrap", ["module", "state_dict", "both"])
def test_wrapped_checkpoints_are_detected(tmp, wrap):
    case = next(c for c in RECORDED if c["hf_class"] == "DebertaV2ForSequenceClassification")
    state = hf_state(case)
    obj = {f"module.{k}": v for k, v in state.items()} if wrap in ("module", "both") else state
    if wrap in ("state_dict", "both"):
        obj = {"state_dict": obj, "epoch": 3}
    torch.save(obj, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--quiet")
    assert r.code == 0, r
    assert "mapping: detected 'deberta-v2'" in r.stderr
    out = load_pdparams(str(tmp / "o.pdparams"))
    q = state["deberta.encoder.layer.1.attention.self.query_proj.weight"].numpy()
    assert (out["deberta.encoder.layer.1.attention.self.query_proj.weight"] == q.T).all()


def test_no_set_fits_names_the_closest_and_what_to_pass(tmp):
    case = next(c for c in RECORDED if c["hf_class"] == "LlamaForCausalLM")
    state = hf_state(case)
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    state["model.layers.1.self_attn.q_norm.weight"] = torch.ones(16)
    state["model.extra.scale"] = torch.ones(1)
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--target", "paddlenlp")
    assert r.code == 2, r
    assert "Traceback" not in r.stderr and not os.path.exists(tmp / "o.pdparams")
    line = r.stderr.strip().splitlines()[0]
    assert line.startswith("error: no shipped mapping fits this checkpoint: the closest, 'llama', leaves 3 of ")
    assert "(model.extra.scale, model.layers.0.self_attn.q_norm.weight, model.layers.1.self_attn.q_norm.weight)" in line
    assert "--mapping FILE" in line and "--spec FILE" in line


def test_none_fits_shows_only_the_first_few_keys(tmp):
    state = {f"block{i}.w": torch.ones(2) for i in range(9)}
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams")
    assert r.code == 2
    assert "leaves 9 of 9 keys unmapped (block0.w, block1.w, block2.w, block3.w, block4.w, ...)" in r.stderr


def _rule_file(tmp, name, rules):
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "rules": rules}))
    return str(path)


def test_two_fit_the_more_specific_is_used_and_the_other_named(tmp):
    """A set written for the model (a rule per layer kind, the head's too) beats a catch-all."""
    case = _bert_keys(head=True)
    infos = _infos(case["hf"])
    generic = _rule_file(tmp, "keep-names", [{"kind": "rename", "match": "(.*)", "to": r"\1"}])
    found = detect(infos, names=[generic, "bert"])
    assert found.chosen.name == "bert"
    assert found.also_fit == ["keep-names"] and not found.same_file
    line = found.describe(len(infos))
    assert "'keep-names' also fits but writes other names: pass --mapping NAME to choose" in line


def test_two_sets_that_differ_only_in_rules_the_checkpoint_does_not_use_give_the_same_file(tmp):
    case = _bert_keys()
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "mappings", "bert.json")) as f:
        body = json.load(f)
    bare = [r for r in body["rules"] if "classifier" not in json.dumps(r) and "cls" not in json.dumps(r)]
    found = detect(_infos(case["hf"]), names=["bert", _rule_file(tmp, "bert-bare", bare)])
    assert found.chosen.name == "bert" and found.same_file == ["bert-bare"] and not found.also_fit


def test_an_empty_checkpoint_is_bad_input():
    with pytest.raises(UserError, match="holds no tensors"):
        detect({})
