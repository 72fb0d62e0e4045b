"""Property-based tests of rule files: a valid rule set for a small checkpoint, then (often) one
field replaced by a value of the wrong type or range, a pattern RE2 refuses, a catastrophic
pattern, a bad template. Every file ends in exit 0 (the conversion's own bit-for-bit check
passed) or exit 2 with one line naming the rule, within bounded time."""

import pytest
import json
import os
import tempfile

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from helpers.hostile_forge import assert_clean_verdict, fuzz_settings, run_in_process

SOURCE = {"enc.layer.0.w": np.arange(12, dtype=np.float32).reshape(2, 6),
          "enc.layer.1.w": np.arange(12, 24, dtype=np.float32).reshape(2, 6),
          "fc.b": np.arange(4, dtype=np.float16), "a" * 35: np.arange(1, dtype=np.int64)}

NAMING = {
    "enc": [[{"kind": "rename", "match": r"enc\.layer\.(?P<i>\d+)\.w", "to": r"layers.\g<i>.weight"}],
            [{"kind": "merge", "match": [r"enc\.layer\.0\.w", r"enc\.layer\.1\.w"], "to": "both", "axis": 0}],
            [{"kind": "split", "key": "enc.layer.0.w", "to": ["q", "k"], "axis": 1, "sizes": [2, 4]},
             {"kind": "drop", "key": "enc.layer.1.w"}]],
    "fc": [[{"kind": "rename", "key": "fc.b", "to": "fc.bias"}], [{"kind": "drop", "match": r"fc\..*"}],
           [{"kind": "rename", "key": "fc.b", "to": "fc.bias", "aliases": ["layers.0.weight"]}]],
    "a": [[{"kind": "rename", "match": "(a+)", "to": r"\1.x"}], [{"kind": "drop", "match": "a{35}"}]],
}
EXTRA = [{"kind": "transpose", "match": r"enc\.layer\.1\.w"}, {"kind": "cast", "key": "fc.b", "dtype": "bfloat16"},
         {"kind": "cast", "match": r"enc\..*", "dtype": "float16"}, {"kind": "reshape", "key": "enc.layer.0.w", "shape": [3, 4]},
         {"kind": "transpose", "key": "enc.layer.0.w", "perm": [1, 0]}]
JUNK = [None, True, 3, -1, 2.5, "x", "", "0", [], ["a"], [1, -1], [2.5, 12], {"a": 1}, r"\g<zz>", r"\q", r"\9",
        "(a+)+b", r"(a)\1", "(?=a)", "[", "a" * 40, "float64", "int8", [0, 0], [1, 0, 2], "\ud800"]
FIELDS = ["kind", "key", "match", "to", "axis", "sizes", "perm", "shape", "dtype", "aliases", "comment"]


@st.composite
def rule_files(draw):
    rules = []
    for group in sorted(NAMING):
        rules += draw(st.sampled_from(NAMING[group]))
    rules += draw(st.lists(st.sampled_from(EXTRA), max_size=3, unique_by=lambda r: json.dumps(r)))
    rules = [dict(r) for r in rules]
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        rule = rules[draw(st.integers(0, len(rules) - 1))]
        rule[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(JUNK))
    return draw(st.permutations(rules))


@fuzz_settings(250)
@given(rule_files(), st.sampled_from(["safetensors", "pdparams"]))
@pytest.mark.slow
def test_fuzz_rule_files(rules, fmt):
    with tempfile.TemporaryDirectory() as d:
        src, out, path = os.path.join(d, "m.safetensors"), os.path.join(d, f"o.{fmt}"), os.path.join(d, "r.json")
        save_file(SOURCE, src)
        with open(path, "w") as f:
            json.dump({"name": "fuzz", "rules": rules}, f)
        r = run_in_process(src, out, "--mapping", path, seconds=20)
        event(f"exit {r.code}")
        assert_clean_verdict(r)
        if r.code == 2:
            assert not os.path.exists(out)
        elif fmt == "safetensors":
            with safe_open(out, "numpy") as f:
                names = set(f.keys())
            assert names and not names & {"enc.layer.0.w", "enc.layer.1.w"}  # every source key went through a rule
