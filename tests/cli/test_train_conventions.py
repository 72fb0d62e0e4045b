"""The conventions that differ between torch and paddle, are not bugs of the port, and the
training checks budget or replay (paddle's BatchNorm running variance updated with the biased batch
variance, paddle's optimizer's own conventions) are printed once each in the terminal report, not
only in the JSON's rows."""

import json

from helpers.cli import run_verify, spec_path


def _train(tmp, name):
    out = tmp / "r.json"
    r = run_verify("--spec", spec_path(name), "--train", "--steps", 2, "--device", "cpu", "--json", out)
    return r, json.loads(out.read_text())["train"]


def test_paddle_s_biased_running_variance_is_said_once_naming_the_variances_replayed(tmp):
    import paddle
    r, train = _train(tmp, "train_cnn")
    assert r.code == 0, r
    said = [line for line in r.stdout.splitlines() if "biased batch variance" in line]
    assert len(said) == 1, said
    assert said[0].startswith(f"  note: convention: paddle {paddle.__version__} updates BatchNorm's running variance")
    assert "'bn._variance', 'bn2._variance'" in said[0] and "not a bug of the port" in said[0]
    assert said[0].removeprefix("  note: ") in train["notes"]
    # the rows it speaks of: the running variances, replayed under paddle's rule
    replayed = {c["paddle"] for c in train["checks"] if "biased batch variance" in c["note"]}
    assert {"bn._variance", "bn2._variance"} <= replayed


def test_the_translated_optimizer_s_conventions_are_said_once(tmp):
    r, train = _train(tmp, "train_mlp")
    assert r.code == 0, r
    lines = r.stdout.splitlines()
    assert lines.count("  note: convention: paddle keeps beta1 and beta2 in float32") == 1, lines
    assert not any("biased batch variance" in line for line in lines)  # no BatchNorm in this pair
