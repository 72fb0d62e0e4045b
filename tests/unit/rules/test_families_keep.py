"""Rule files with "unmatched": "keep": keys no naming rule touches keep their names."""

import json
import os

import numpy as np
import torch

from helpers.cli import run_convert
from converter.io.pdparams import load_pdparams
from converter.rules.ruleset import load_ruleset


def _state():
    torch.manual_seed(0)
    return {"encoder.block.0.attn.qkv.weight": torch.randn(12, 4), "encoder.block.0.attn.proj.weight": torch.randn(4, 4),
            "encoder.block.0.norm.weight": torch.randn(4), "head.weight": torch.randn(3, 4), "head.bias": torch.randn(3)}


def _rules(tmp, body):
    path = tmp / "rules.json"
    path.write_text(json.dumps(body))
    return path


# A model that differs from its port in two names, and whose Linear weights are transposed.
FEW_LINES = {"name": "mine", "unmatched": "keep", "rules": [
    {"kind": "rename", "match": r"encoder\.block\.(\d+)\.norm\.weight", "to": r"encoder.layers.\1.norm1.weight"},
    {"kind": "rename", "key": "head.weight", "to": "classifier.weight"},
    {"kind": "transpose", "match": r"encoder\.block\.\d+\.attn\.(?:qkv|proj)\.weight|head\.weight"},
]}


def test_keys_no_rule_names_keep_their_names_and_their_layout_rules(tmp):
    state = _state()
    torch.save(state, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp, FEW_LINES), "--quiet")
    assert r.code == 0, r
    out = load_pdparams(str(tmp / "o.pdparams"))
    assert sorted(out) == ["classifier.weight", "encoder.block.0.attn.proj.weight", "encoder.block.0.attn.qkv.weight",
                           "encoder.layers.0.norm1.weight", "head.bias"]
    assert np.array_equal(out["encoder.block.0.attn.qkv.weight"], state["encoder.block.0.attn.qkv.weight"].numpy().T)
    assert np.array_equal(out["classifier.weight"], state["head.weight"].numpy().T)
    assert np.array_equal(out["head.bias"], state["head.bias"].numpy())


def test_the_default_stays_strict(tmp):
    torch.save(_state(), tmp / "m.bin")
    strict = dict(FEW_LINES)
    del strict["unmatched"]
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp, strict))
    assert r.code == 2
    assert "'head.bias' float32[3] is not mapped by any rule" in r.stderr
    assert not os.path.exists(tmp / "o.pdparams")


def test_a_kept_name_that_collides_with_a_renamed_one_is_an_error(tmp):
    torch.save(_state(), tmp / "m.bin")
    clash = dict(FEW_LINES, rules=FEW_LINES["rules"] + [{"kind": "rename", "key": "head.bias", "to": "encoder.block.0.attn.proj.weight"}])
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp, clash))
    assert r.code == 2 and "'encoder.block.0.attn.proj.weight' is produced twice" in r.stderr


def test_a_bad_unmatched_value_is_one_line(tmp):
    torch.save(_state(), tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp, dict(FEW_LINES, unmatched="copy")))
    assert r.code == 2
    assert "'unmatched' must be \"error\"" in r.stderr and '"copy"' in r.stderr and "Traceback" not in r.stderr


def test_emit_mapping_keeps_the_option(tmp):
    torch.save(_state(), tmp / "m.bin")
    emitted = tmp / "emitted.json"
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", _rules(tmp, FEW_LINES), "--emit-mapping", emitted)
    assert r.code == 0, r
    assert load_ruleset(str(emitted)).unmatched == "keep"
