"""A --mapping value is a path only when it looks like one (a separator, or a .json suffix);
otherwise it names a shipped set, whatever the current directory holds."""

import json
import os

import pytest
import torch

from helpers.cli import run_convert
from converter.errors import UserError
from converter.io.pdparams import load_pdparams
from converter.rules.ruleset import looks_like_path, resolve_mapping, shipped_mappings
from helpers.hf_models import RECORDED, hf_state


@pytest.fixture
def in_tmp(tmp, monkeypatch):
    monkeypatch.chdir(tmp)
    return tmp


def test_folders_named_like_shipped_sets_do_not_hide_them(in_tmp):
    for name in ("llama", "bert", "t5"):
        (in_tmp / name).mkdir()
    (in_tmp / "gpt2").write_text("not a rule file")
    case = next(c for c in RECORDED if c["hf_class"] == "LlamaForCausalLM")
    torch.save(hf_state(case), in_tmp / "m.bin")
    r = run_convert("m.bin", "auto.pdparams", "--quiet", "--target", "paddlenlp")
    assert r.code == 0, r
    assert "mapping: detected 'llama'" in r.stderr
    named = run_convert("m.bin", "named.pdparams", "--quiet", "--mapping", "llama")
    assert named.code == 0, named
    assert (in_tmp / "auto.pdparams").read_bytes() == (in_tmp / "named.pdparams").read_bytes()
    for name in ("bert", "t5", "gpt2", "llama"):
        assert resolve_mapping(name).name == name


def test_values_that_look_like_paths_are_read_as_files(in_tmp):
    rules = {"name": "mine", "rules": [{"kind": "rename", "match": "(.*)", "to": "x.\\1"}]}
    (in_tmp / "llama.json").write_text(json.dumps(rules))
    (in_tmp / "sub").mkdir()
    (in_tmp / "sub" / "llama").write_text(json.dumps(rules))
    assert resolve_mapping("llama.json").name == "mine"
    assert resolve_mapping(os.path.join("sub", "llama")).name == "mine"
    assert resolve_mapping("llama").name == "llama"
    torch.save({"w": torch.arange(3.0)}, in_tmp / "m.bin")
    r = run_convert("m.bin", "o.pdparams", "--quiet", "--mapping", "llama.json")
    assert r.code == 0, r
    assert list(load_pdparams(str(in_tmp / "o.pdparams"))) == ["x.w"]
    missing = run_convert("m.bin", "p.pdparams", "--mapping", "missing.json")
    assert missing.code == 2 and "missing.json" in missing.stderr and not (in_tmp / "p.pdparams").exists()


def test_a_file_with_a_bare_name_is_not_taken_for_a_set(in_tmp):
    (in_tmp / "mine").write_text(json.dumps({"rules": []}))
    with pytest.raises(UserError) as info:
        resolve_mapping("mine")
    message = info.value.message
    assert message.startswith("unknown mapping 'mine'; shipped mappings are: ")
    assert f"give it as '{os.path.join(os.curdir, 'mine')}'" in message
    assert all(name in message for name in shipped_mappings())


@pytest.mark.parametrize("value, path", [("llama", False), ("deberta-v2", False), ("a/b", True), ("x.json", True),
                                         ("./llama", True), ("/abs/rules", True), ("llama.JSON", False)])
def test_looks_like_path(value, path):
    assert looks_like_path(value) is path
