"""verify-port's options reach the API's VerifyOptions, which checks them once; what it refuses
is said in the command's words, one line, exit 2, before anything runs."""

import json

import pytest

from helpers.cli import run_verify, spec_path

EMULATE_WORDS = "error: --emulate takes SIDE=MODE with SIDE torch or paddle and MODE tf32, bf16 or fp16; got "


@pytest.mark.parametrize("value", ["jax=tf32", "paddle=int8", "paddle", "torch=tf32=x", "=bf16"])
def test_an_emulation_it_does_not_take_names_the_value_given(value):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--emulate", "torch=bf16", "--emulate", value)
    assert r.code == 2, r
    assert r.stderr == f"{EMULATE_WORDS}'{value}'\n", r
    assert r.stdout == ""


@pytest.mark.parametrize("steps", ["0", "10001", "99999999999999999999"])
def test_a_step_count_it_does_not_take_is_said_as_the_option(steps):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--train", "--steps", steps)
    assert r.code == 2, r
    assert r.stderr == f"error: --steps takes 1 to 10000 steps; got {steps}\n", r
    assert r.stdout == ""


def test_the_emulation_asked_for_is_the_one_run(tmp):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--emulate", "paddle=bf16",
                   "--emulate", "torch=fp16", "--json", tmp / "r.json")
    assert r.code in (0, 1), r
    precision = json.loads((tmp / "r.json").read_text())["precision"]
    assert (precision["paddle"]["emulated"], precision["torch"]["emulated"]) == ("bf16", "fp16"), precision


@pytest.mark.parametrize("size", ["abc", "0", "-1G", "6 parsecs", "9" * 40])
def test_a_memory_size_it_does_not_take_is_said_as_the_option(size):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--max-memory", size)
    assert r.code == 2, r
    assert r.stderr.startswith("error: --max-memory takes a size above 0") and r.stderr.endswith(f"got '{size}'\n"), r
    assert r.stdout == "" and r.stderr.count("\n") == 1


def test_a_run_that_does_not_fit_in_the_memory_given_says_so_before_it_runs():
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu", "--max-memory", "1MiB")
    assert r.code == 2, r
    assert r.stderr.startswith("error: verify-port: --max-memory 1 MiB less the ") and "leaves no memory for the run" in r.stderr, r
    assert r.stdout == "" and r.stderr.count("\n") == 1
