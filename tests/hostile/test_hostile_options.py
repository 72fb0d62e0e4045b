"""Options and refusals as an attacker or a careless user gives them: a size or count of hundreds of
digits, and inputs that list thousands of problems. Each is exit 2 with one line (the count and
the first few where it lists them); never an internal error, and nothing written."""

import json

import pytest
import torch

from helpers.cli import run_convert, run_verify, spec_path
from helpers.hf_configs import CASES
from helpers.hostile_forge import no_leftovers

HUGE = "1" + "0" * 400  # a float overflow when read as a float


def _model_dir(tmp, config, weights=None):
    path = tmp / "hf"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    torch.save(weights or {"w": torch.zeros(2)}, path / "pytorch_model.bin")
    return path


def _one_line(r, *words):
    assert r.code == 2, r
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    for word in words:
        assert word in r.stderr, (word, r)


@pytest.mark.parametrize("size", [HUGE, HUGE + "GB", "0", "0.4", "-1", "1e3", "9" * 25 + "TB", "5 parsecs"])
def test_a_shard_size_out_of_bounds_is_one_line(tmp, size):
    """`--max-shard-size 1` and 400 zeros overflowed a float: an internal error (exit 3)."""
    src = _model_dir(tmp, {"model_type": "bert"})
    r = run_convert(src, tmp / "out", "--max-shard-size", size, "--quiet")
    _one_line(r, "--max-shard-size", "give one like 5GB")
    assert len(r.stderr) < 300, r  # the value is cut, with its length
    assert not (tmp / "out").exists() and not no_leftovers(tmp)


def test_a_shard_size_within_bounds_is_exact(tmp):
    from converter.hf.directory import parse_size
    assert parse_size("1") == 1 and parse_size("1.5KB") == 1500 and parse_size("2GiB") == 2 << 30
    assert parse_size("4194304TiB") == 1 << 62


@pytest.mark.parametrize("option,value,words", [
    ("--max-memory", HUGE, ["--max-memory takes a size", "(401 characters)"]),
    ("--max-memory", HUGE + "GiB", ["--max-memory takes a size"]),
    ("--steps", HUGE, ["--steps takes 1 to 10000 steps", "(401 digits)"]),
    ("--steps", "-" + HUGE, ["--steps takes 1 to 10000 steps"]),
    ("--rows", HUGE, ["--rows"]),
    ("--rows", "-1", ["--rows", "is not in the range"]),
])
def test_a_count_or_size_of_verify_port_out_of_bounds_is_one_line(option, value, words):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--train", option, value)
    _one_line(r, *words)
    assert r.stdout == ""


def test_a_config_with_5000_unknown_fields_is_refused_in_one_line(tmp):
    """It was refused with 5001 lines: say the count and the first few."""
    config = dict(CASES["bert"][0], **{f"unknown_{i}": i for i in range(5000)})
    src = _model_dir(tmp, config)
    r = run_convert(src, tmp / "out", "--quiet", "--target", "paddlenlp")
    _one_line(r, "5000 field(s)", "'unknown_0'", "(and 4997 more)", "--force")
    assert len(r.stderr) < 2000, r
    assert not (tmp / "out").exists()


def test_a_checkpoint_with_3000_unmapped_keys_is_refused_in_one_line(tmp):
    rules = tmp / "rules.json"
    rules.write_text(json.dumps({"name": "one", "rules": [{"kind": "rename", "match": "w0", "to": "w0"}]}))
    torch.save({f"w{i}": torch.zeros(1) for i in range(3000)}, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", rules)
    _one_line(r, "2999 problem(s)", "(and 2996 more)")
    assert not (tmp / "o.pdparams").exists()
