"""config.json as an attacker writes it: fields of the wrong type or range, integers longer than
Python reads, nesting deeper than the JSON parser recurses, files that are not files. Each is
exit 2 with one line naming the field, its value and what was expected; nothing is written and
the model directory is left as it was."""

import json
import os

import pytest
import torch

from helpers.cli import run_convert
from converter.errors import UserError
from converter.hf.config import FAMILIES, KINDS, check_kinds, reads, translate_config
from converter.hf.directory import read_config
from helpers.hostile_forge import no_leftovers
from helpers.hf_configs import CASES

GPT2, DEBERTA, BERT = CASES["gpt2"][0], CASES["deberta-v2"][0], CASES["bert"][0]


def _dir(tmp, config=None, raw=None, name="hf"):
    """A model directory of one tiny weights file and this config.json (a dict or raw text)."""
    path = tmp / name
    path.mkdir()
    (path / "config.json").write_text(raw if raw is not None else json.dumps(config))
    torch.save({"w": torch.zeros(2)}, path / "pytorch_model.bin")
    return path


def _snapshot(path):
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path)) if (path / name).is_file()}


def _refused(tmp, src, *words, force=False):
    """convert-weights src out: exit 2 with one line holding `words`; nothing written, src unchanged."""
    before = _snapshot(src)
    r = run_convert(src, tmp / "out", "--quiet", *(["--force"] if force else []))
    assert r.code == 2, r
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r
    for word in words:
        assert word in r.stderr, (word, r.stderr)
    assert not os.path.exists(tmp / "out") and no_leftovers(tmp) == []
    assert _snapshot(src) == before
    return r.stderr


@pytest.mark.parametrize("config,words", [
    (dict(BERT, model_type=["bert"]), ["model_type (a list) ['bert'] is not one this tool translates", "--mapping"]),
    (dict(BERT, model_type=7), ["model_type (an integer) 7 is not one"]),
    ({k: v for k, v in BERT.items() if k != "model_type"}, ["model_type (null) None is not one"]),
    (dict(BERT, architectures=3), ["field 'architectures' is 3 (an integer); expected a list of strings or null"]),
    (dict(BERT, architectures=[["BertModel"]]), ["field 'architectures' is [['BertModel']] (a list)"]),
    (dict(DEBERTA, conv_kernel_size="3"), ["field 'conv_kernel_size' is '3' (a string); expected an integer from 0"]),
    (dict(DEBERTA, conv_kernel_size=None), ["field 'conv_kernel_size' is None (null)"]),
    (dict(GPT2, n_embd=None), ["field 'n_embd' is None (null); expected a positive integer"]),
    (dict(GPT2, n_embd="64"), ["field 'n_embd' is '64' (a string); expected a positive integer"]),
    (dict(GPT2, n_inner="3072"), ["field 'n_inner' is '3072' (a string); expected a positive integer below 2**31 or null"]),
    (dict(BERT, hidden_size=0), ["field 'hidden_size' is 0 (an integer)"]),
    (dict(BERT, hidden_size=2**40), ["field 'hidden_size' is 1099511627776"]),
    (dict(BERT, hidden_size=True), ["field 'hidden_size' is True (a boolean)"]),
    (dict(BERT, hidden_dropout_prob=1.5), ["field 'hidden_dropout_prob' is 1.5 (a number); expected a number from 0 to 1"]),
    (dict(BERT, layer_norm_eps=float("nan")), ["field 'layer_norm_eps' is nan"]),
    (dict(BERT, layer_norm_eps=float("inf")), ["field 'layer_norm_eps' is inf"]),
    (dict(BERT, use_cache="false"), ["field 'use_cache' is 'false' (a string); expected true or false"]),
    (dict(BERT, hidden_act=["gelu"]), ["field 'hidden_act' is ['gelu'] (a list); expected a string"]),
    (dict(BERT, pad_token_id="0"), ["field 'pad_token_id' is '0'", "a token id"]),
    (dict(BERT, pad_token_id=[1, 2]), ["field 'pad_token_id' is [1, 2] (a list); expected a token id (an integer) or null"]),
    (dict(BERT, eos_token_id=[1, "2"]), ["field 'eos_token_id' is [1, '2'] (a list); expected a token id, a list of"]),
    (dict(BERT, id2label=["a", "b"]), ["field 'id2label' is ['a', 'b'] (a list); expected a JSON object"]),
])
def test_a_field_of_the_wrong_type_or_range_is_one_line_even_with_force(tmp, config, words):
    src = _dir(tmp, config)
    _refused(tmp, src, *words)
    if "model_type" in config and isinstance(config["model_type"], str):
        _refused(tmp, src, *words, force=True)  # --force copies what has no counterpart, never a wrong type


def test_several_wrong_fields_are_all_named(tmp):
    with pytest.raises(UserError) as info:
        translate_config(dict(GPT2, n_embd="64", n_head=None))
    assert "2 fields hold values HF's config would not" in info.value.message
    assert sorted(d.split("'")[1] for d in info.value.details) == ["n_embd", "n_head"]


def test_a_long_value_is_shortened_and_escaped(tmp):
    with pytest.raises(UserError) as info:
        translate_config(dict(BERT, hidden_act="x\n" * 10_000))
    lines = info.value.render().splitlines()
    assert len(lines) == 1 and "'hidden_act': 'x\\nx\\n" in lines[0] and len(lines[0]) < 400, lines


@pytest.mark.parametrize("embd,resid", [(0.0, None), (None, 0.2), (0.0, 0.3)])
def test_a_gpt2_dropout_without_its_partner_is_judged_against_hfs_default(embd, resid):
    hf = {k: v for k, v in GPT2.items() if k not in ("embd_pdrop", "resid_pdrop")}
    hf.update({k: v for k, v in (("embd_pdrop", embd), ("resid_pdrop", resid)) if v is not None})
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert any(d.startswith(f"'embd_pdrop' {embd if embd is not None else 0.1} differs from 'resid_pdrop' "
                            f"{resid if resid is not None else 0.1}") for d in info.value.details), info.value.details
    alone = {k: v for k, v in GPT2.items() if k != "resid_pdrop"}  # embd_pdrop 0.1 alone: HF's default for both
    assert translate_config(alone).config["hidden_size"] == 768


def test_gpt2_n_inner_null_is_four_times_n_embd():
    config = translate_config(dict(GPT2, n_embd=64, n_inner=None)).config
    assert config["hidden_size"] == 64 and config["intermediate_size"] == 256


def test_a_5000_digit_integer_is_named_by_field(tmp):
    src = _dir(tmp, raw='{"model_type": "bert", "hidden_size": ' + "9" * 5000 + "}")
    _refused(tmp, src, "field 'hidden_size' holds an integer of 5000 digits")
    src = _dir(tmp, raw='{"model_type": "bert", "some_field": {"a": [1, -' + "9" * 5000 + "]}}", name="hf2")
    _refused(tmp, src, "field 'some_field' holds an integer of 5000 digits", force=True)


def test_a_config_nested_100000_deep_is_one_line(tmp):
    src = _dir(tmp, raw='{"model_type": "bert", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(tmp, src, "nests objects or lists hundreds of levels deep")
    src = _dir(tmp, raw='{"model_type": "bert", "x": ' + "[" * 100 + "]" * 100 + "}", name="hf2")
    _refused(tmp, src, "field 'x' nests objects or lists more than 64 levels deep", force=True)


def test_a_config_nested_as_deep_as_allowed_is_copied_with_force(tmp):
    deep = json.loads("[" * 63 + "]" * 63)
    src = _dir(tmp, dict(CASES["bert"][0], x_field=deep))
    r = run_convert(src, tmp / "out", "--quiet", "--force", "--mapping", _keep_all(tmp))
    assert r.code == 0, r
    assert json.loads((tmp / "out" / "config.json").read_text())["x_field"] == deep


def _keep_all(tmp):
    path = tmp / "keep.json"
    path.write_text(json.dumps({"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}))
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "dangling", "sparse"])
def test_a_config_that_is_not_a_small_regular_file_is_refused(tmp, kind):
    src = _dir(tmp, BERT)
    config = src / "config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev_zero":
        config.symlink_to("/dev/zero")
    elif kind == "directory":
        config.mkdir()
    elif kind == "dangling":
        config.symlink_to(tmp / "nothing")
    else:
        with open(config, "wb") as f:
            f.truncate(6 << 30)
    words = {"fifo": "is a fifo", "dev_zero": "is a character device", "directory": "is a directory",
             "dangling": "does not exist", "sparse": "larger than any config file should be"}[kind]
    with pytest.raises(UserError, match=words):
        read_config(str(src))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, r
    assert "config.json" in r.stderr and not os.path.exists(tmp / "out")


def test_a_field_name_holding_a_newline_stays_on_its_line(tmp):
    src = _dir(tmp, dict(BERT, **{"bad\nerror: injected": 1}))
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 2, r
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [r.stderr.splitlines()[0]]
    assert "'bad\\nerror: injected' has no PaddleNLP counterpart" in r.stderr
    assert all(line.startswith("  ") for line in r.stderr.splitlines()[1:]), r


@pytest.mark.parametrize("directory", [False, True])
def test_a_rule_file_name_holding_a_newline_stays_on_its_line(tmp, directory):
    rules = tmp / "rules.json"
    rules.write_text(json.dumps({"name": "x\nerror: injected\x1b[2J",
                                 "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}))
    if directory:
        src, out = _dir(tmp, {"model_type": "bert"}), tmp / "out"
    else:
        src, out = tmp / "a.bin", tmp / "a.pdparams"
        torch.save({"w": torch.zeros(2)}, src)
    r = run_convert(src, out, "--quiet", "--mapping", rules)
    assert r.code == 0, r
    assert "mapping 'x\\nerror: injected\\x1b[2J'" in r.stderr
    assert not any(line.startswith("error") for line in r.stderr.splitlines()) and "\x1b" not in r.stderr, r


def test_every_field_a_family_reads_has_a_kind():
    read = {name for family in FAMILIES.values()
            for name in (*family.same, *family.renames, *family.values, *family.checked) if reads(family, name)}
    assert sorted(read - set(KINDS)) == []


@pytest.mark.parametrize("family", sorted(CASES))
def test_what_hf_writes_passes_the_kind_check(family):
    check_kinds(CASES[family][0], FAMILIES[family], "config.json")  # raises on a false refusal


def test_hfs_later_dtype_field_is_read_and_checked_as_torch_dtype():
    assert translate_config(dict(BERT, dtype="bfloat16")).config["dtype"] == "bfloat16"
    with pytest.raises(UserError, match="field 'dtype' is True"):
        translate_config(dict(BERT, dtype=True), force=True)


def test_eos_may_be_several_token_ids():
    assert translate_config(dict(BERT, eos_token_id=[1, 2])).config["eos_token_id"] == [1, 2]


@pytest.mark.parametrize("field", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float128", "int8", "float\n32", "", "torch.float32"])
def test_a_dtype_paddle_cannot_take_is_refused(field, value):
    """PaddleNLP reads `dtype` to build its parameters: a name paddle has no format for was copied
    as it stood, and failed only when the directory was loaded."""
    with pytest.raises(UserError, match=f"field '{field}' is .*expected 'float16', 'bfloat16'") as caught:
        translate_config(dict(BERT, **{field: value}), force=True)
    assert "\n" not in str(caught.value)
