"""Rule files: linear-time patterns, and every field checked for type and range when read."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import run_convert
from hostile_forge import assert_one_line_error, run_bounded


def _setup(tmp, rules, state=None):
    state = state if state is not None else {"fc.weight": np.arange(24, dtype=np.float32).reshape(2, 12)}
    save_file(state, str(tmp / "m.safetensors"))
    (tmp / "rules.json").write_text(json.dumps({"name": "t", "rules": rules}))
    return tmp / "m.safetensors", tmp / "rules.json"


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
