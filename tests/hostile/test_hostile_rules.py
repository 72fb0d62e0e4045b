"""Rule files: linear-time patterns, and every field checked for type and range when read."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers.cli import run_convert
from helpers.hostile_forge import assert_one_line_error, run_bounded


def _setup(tmp, rules, state=None):
    state = state if state is not None else {"fc.weight": np.arange(24, dtype=np.float32).reshape(2, 12)}
    save_file(state, str(tmp / "m.safetensors"))
    (tmp / "rules.json").write_text(json.dumps({"name": "t", "rules": rules}))
    return tmp / "m.safetensors", tmp / "rules.json"


@pytest.mark.slow


def test_a_catastrophic_pattern_does_not_hang(tmp):
    key = "a" * 35  # (a+)+b against 35 a's backtracks 2**35 times in Python's re
    src, rules = _setup(tmp, [{"kind": "rename", "match": "(a+)+b", "to": "x"}], {key: np.zeros(1, np.float32)})
    r = run_bounded(src, tmp / "o.pdparams", "--mapping", rules, timeout=30)
    assert_one_line_error(r, "not mapped by any rule")
    assert r.seconds < 30


@pytest.mark.parametrize("pattern", [r"(a)\1", r"fc(?=\.weight)\..*", r"(?<=fc)\.weight", r"(?P<x>a)(?P=x)"])
def test_patterns_re2_cannot_take_are_refused_in_one_line(tmp, pattern):
    src, rules = _setup(tmp, [{"kind": "rename", "match": pattern, "to": "x"}])
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules)
    assert_one_line_error(r, "rule 1", "RE2")
    assert "re2.cc" not in r.stderr  # RE2's own log line stays quiet


BAD_RULES = {
    "split sizes as a string": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": 0, "sizes": "xy"},
    "split sizes negative": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": 1, "sizes": [13, -1]},
    "split sizes as floats": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": 1, "sizes": [6.0, 6.0]},
    "split axis null": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": None},
    "split axis a string": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": "0"},
    "split axis a boolean": {"kind": "split", "key": "fc.weight", "to": ["a", "b"], "axis": True},
    "split to names not strings": {"kind": "split", "key": "fc.weight", "to": [1, 2], "axis": 0},
    "merge axis null": {"kind": "merge", "match": ["a", "b"], "to": "ab", "axis": None},
    "perm a number": {"kind": "transpose", "key": "fc.weight", "perm": 3},
    "perm not a permutation": {"kind": "transpose", "key": "fc.weight", "perm": [0, 0]},
    "perm of strings": {"kind": "transpose", "key": "fc.weight", "perm": ["1", "0"]},
    "bad group name": {"kind": "rename", "match": r"fc\.(?P<t>weight)", "to": r"x.\g<name>"},
    "bad group number": {"kind": "rename", "match": r"fc\.(weight)", "to": r"x.\2"},
    "group in a literal key rule": {"kind": "rename", "key": "fc.weight", "to": r"x.\1"},
    "unsupported escape": {"kind": "rename", "match": r"fc\.weight", "to": r"x\q"},
    "reshape to non-integers": {"kind": "reshape", "key": "fc.weight", "shape": [2.5, 12]},
    "reshape to negatives": {"kind": "reshape", "key": "fc.weight", "shape": [-1, 24]},
    "reshape a string": {"kind": "reshape", "key": "fc.weight", "shape": "24"},
    "cast dtype a list": {"kind": "cast", "key": "fc.weight", "dtype": ["float16"]},
    "rename to a number": {"kind": "rename", "key": "fc.weight", "to": 3},
    "aliases a string": {"kind": "rename", "key": "fc.weight", "to": "x", "aliases": "y"},
    "match a number": {"kind": "drop", "match": 3},
    "match a list outside merge": {"kind": "drop", "match": ["a"]},
    "kind a list": {"kind": ["rename"], "key": "fc.weight", "to": "x"},
    "comment a number": {"kind": "drop", "key": "fc.weight", "comment": 1},
}


@pytest.mark.parametrize("case", list(BAD_RULES))
def test_rule_fields_of_the_wrong_type_or_range(tmp, case):
    rules = [BAD_RULES[case]]
    if rules[0]["kind"] not in ("rename", "drop", "split", "merge") or case == "kind a list":
        rules.append({"kind": "rename", "key": "fc.weight", "to": "fc.weight"})
    src, path = _setup(tmp, rules)
    r = run_convert(src, tmp / "o.pdparams", "--mapping", path)
    assert_one_line_error(r, "rule 1")


@pytest.mark.parametrize("body", ['{"rules": [' * 50000, '[' * 100000 + ']' * 100000, '{"rules": 3}', "\xff"])
def test_broken_rule_files(tmp, body):
    src, path = _setup(tmp, [])
    path.write_bytes(body.encode("utf-8", "surrogateescape") if body != "\xff" else b"\xff\xfe")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", path)
    assert_one_line_error(r, "rules.json")


def test_templates_named_numbered_and_escaped_backslash(tmp):
    state = {"enc.layer.3.w": np.ones(2, np.float32), "层.b": np.zeros(1, np.float32)}
    rules = [{"kind": "rename", "match": r"enc\.layer\.(?P<i>\d+)\.(w)", "to": r"e.\g<i>.\2.\g<0>\\x"},
             {"kind": "rename", "key": "层.b", "to": "层.bias"}]
    src, path = _setup(tmp, rules, state)
    r = run_convert(src, tmp / "o.safetensors", "--mapping", path)
    assert r.code == 0, r
    assert sorted(load_file(str(tmp / "o.safetensors"))) == sorted(["e.3.w.enc.layer.3.w\\x", "层.bias"])


def test_a_literal_key_with_regex_characters_matches_only_itself(tmp):
    state = {"a.b(c)*": np.ones(2, np.float32), "aXb(c)": np.zeros(2, np.float32)}
    rules = [{"kind": "rename", "key": "a.b(c)*", "to": "one"}, {"kind": "drop", "key": "aXb(c)"}]
    src, path = _setup(tmp, rules, state)
    r = run_convert(src, tmp / "o.safetensors", "--mapping", path)
    assert r.code == 0, r
    assert list(load_file(str(tmp / "o.safetensors"))) == ["one"]


def test_a_reshape_whose_element_count_overflows_int64_is_refused(tmp):
    rules = [{"kind": "rename", "key": "fc.weight", "to": "w"},
             {"kind": "reshape", "key": "fc.weight", "shape": [8, 2 ** 61 + 3]}]  # 2**64 + 24 elements
    src, path = _setup(tmp, rules)
    r = run_convert(src, tmp / "o.pdparams", "--mapping", path)
    assert_one_line_error(r, "cannot be reshaped")


@pytest.mark.parametrize("aliases", [["y"], ["z", "z"], ["x"]])
def test_an_alias_may_not_write_a_name_twice(tmp, aliases):
    """Two tensors under one name: the check passed, and paddle.load kept whichever came last."""
    rules = [{"kind": "rename", "key": "a", "to": "x", "aliases": aliases}, {"kind": "rename", "key": "b", "to": "y"}]
    src, path = _setup(tmp, rules, {"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)})
    for out in ("o.pdparams", "o.safetensors"):
        r = run_convert(src, tmp / out, "--mapping", path)
        assert_one_line_error(r, "would be written twice")
        assert not (tmp / out).exists()


# ---- rule files and indexes are regular files of bounded size

def _fifo(tmp, name):
    import os
    path = tmp / name
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom", "sparse 6 GiB", "directory"])
@pytest.mark.slow
def test_a_rule_file_that_is_not_a_small_regular_file_is_refused(tmp, kind):
    """A fifo hung for ever; /dev/zero, /dev/urandom and a 6 GiB sparse file were read until memory ran out."""
    src, _ = _setup(tmp, [])
    if kind == "fifo":
        path, words = _fifo(tmp, "rules.fifo.json"), ("fifo", "not a regular file")
    elif kind.startswith("/dev/"):
        path, words = kind, ("character device", "not a regular file")
    elif kind == "directory":
        (tmp / "rules.d").mkdir()
        path, words = tmp / "rules.d", ("directory", "not a regular file")
    else:
        path = tmp / "sparse.json"
        with open(path, "wb") as f:
            f.truncate(6 << 30)
        words = ("6144.0 MiB", "at most 16.0 MiB")
    r = run_bounded(src, tmp / "o.pdparams", "--mapping", path, timeout=60, memory_gb=4)
    assert_one_line_error(r, "mapping file", *words)
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.slow


def test_a_spec_whose_mapping_is_a_fifo_is_refused(tmp):
    src, _ = _setup(tmp, [])
    fifo = _fifo(tmp, "spec_rules.json")
    spec = tmp / "spec.py"
    spec.write_text("import paddle\nimport torch\n"
                    "def torch_model():\n    return torch.nn.Linear(12, 2)\n"
                    "def paddle_model():\n    return paddle.nn.Linear(12, 2)\n"
                    "def inputs():\n    return []\n"
                    f"mapping = {str(fifo)!r}\n")
    r = run_bounded(src, tmp / "o.pdparams", "--spec", spec, timeout=120)
    assert_one_line_error(r, "mapping file", "fifo", "not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "sparse 6 GiB"])
@pytest.mark.slow
def test_an_index_that_is_not_a_small_regular_file_is_refused(tmp, kind):
    save_file({"a": np.ones(2, np.float32)}, str(tmp / "model-00001.safetensors"))
    name = "model.safetensors.index.json"
    if kind == "fifo":
        _fifo(tmp, name)
        words = ("fifo",)
    else:
        with open(tmp / name, "wb") as f:
            f.truncate(6 << 30)
        words = ("checkpoint index", "at most 64.0 MiB")
    r = run_bounded(tmp / name, tmp / "o.pdparams", timeout=60, memory_gb=4)
    assert_one_line_error(r, "not a regular file" if kind == "fifo" else "larger than", *words)


@pytest.mark.slow


def test_a_rule_file_with_too_many_rules_is_refused(tmp):
    from converter.rules.ruleset import MAX_RULES
    src, path = _setup(tmp, [{"kind": "drop", "key": f"k{i}"} for i in range(MAX_RULES + 1)])
    r = run_convert(src, tmp / "o.pdparams", "--mapping", path)
    assert_one_line_error(r, f"{MAX_RULES + 1} rules", "one pattern")


# ---- planning with many rules

@pytest.mark.slow

def test_20000_patterns_against_2000_keys_plan_in_seconds(tmp):
    """One RE2 set of 20 000 patterns does not compile: every rule was tried on every key (minutes)."""
    state = {f"layer.{i}.weight": np.full(1, i, np.float32) for i in range(2000)}
    rules = [{"kind": "rename", "match": fr"layer\.{i}\.(weight)", "to": fr"l.{i}.\1"} for i in range(20000)]
    src, path = _setup(tmp, rules, state)
    r = run_bounded(src, tmp / "o.safetensors", "--mapping", path, timeout=240)
    assert r.code == 0, r
    assert r.seconds < 90, r
    out = load_file(str(tmp / "o.safetensors"))
    assert len(out) == 2000 and all(out[f"l.{i}.weight"][0] == i for i in range(2000))


@pytest.mark.slow


def test_the_rule_index_names_exactly_the_rules_that_match(tmp):
    """Sets of at most 512 patterns (and their halves): the candidates a key gets are every rule that
    matches it, checked against matching every rule one by one."""
    from converter.rules.ruleset import RuleIndex, SET_SIZE, parse_ruleset
    specs = [{"kind": "rename", "match": fr"(enc|dec)\.{i % 700}\.(w|b)", "to": "x"} for i in range(1300)]
    specs += [{"kind": "rename", "match": r"(.*)\.w", "to": "y"}, {"kind": "rename", "key": "enc.3.w", "to": "z"}]
    ruleset = parse_ruleset({"rules": specs}, "many")
    index = RuleIndex(ruleset.rules)
    assert len(ruleset.rules) > 2 * SET_SIZE and len(index.sets["naming"].sets) >= 3
    for key in ["enc.3.w", "dec.699.b", "enc.700.w", "x.w", "nothing", "dec.12.b"]:
        got = [rule.where for rule, _ in index.matching(key, "naming")]
        expected = [rule.where for rule in ruleset.rules if rule.match(key) is not None]
        assert got == expected, key
    assert len(index.matching("enc.3.w", "naming")) == 4  # rules 4 and 704, (.*)\.w and the literal key


def test_a_rule_files_name_or_description_that_is_no_string_is_one_line(tmp_path):
    from converter.errors import UserError
    from converter.rules.ruleset import load_ruleset
    for field in ("name", "description"):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps({field: ["k"], "rules": []}))
        with pytest.raises(UserError, match=f"'{field}' must be a string"):
            load_ruleset(str(path))
