"""verify-port --train's outputs (--emit-optimizer, --json, --html) go through the guarded output
path of every other output: one that names an input, two that name one file, one that exists
without --force or lies in a missing directory, and an optimizer with nothing to write are exit 2
with one line before any check runs; what is written is committed whole."""

import os
import shutil

import pytest

from helpers.cli import run_verify, spec_path

SPEC_TEXT = open(spec_path("train_mlp")).read()


def _spec(tmp):
    path = tmp / "spec.py"
    shutil.copy(spec_path("train_mlp"), path)
    return path


def _refused_before_running(r, words):
    assert r.code == 2, r
    assert words in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r
    assert "training checks" not in r.stdout, r  # nothing ran


@pytest.mark.parametrize("case", ["names-the-spec", "hard-link-of-the-spec", "same-as-json", "same-as-html",
                                  "exists", "missing-directory"])
def test_bad_emit_optimizer_path_is_refused_before_anything_runs(tmp, case):
    spec = _spec(tmp)
    os.link(spec, tmp / "linked.py")
    (tmp / "old.py").write_text("kept\n")
    args, words = {
        "names-the-spec": (["--emit-optimizer", spec, "--force"], "is also an input"),
        "hard-link-of-the-spec": (["--emit-optimizer", tmp / "linked.py", "--force"], "is also an input"),
        "same-as-json": (["--emit-optimizer", tmp / "o.py", "--json", tmp / "o.py"], "are the same file"),
        "same-as-html": (["--emit-optimizer", tmp / "o.py", "--html", tmp / "o.py"], "are the same file"),
        "exists": (["--emit-optimizer", tmp / "old.py"], "already exists; pass --force"),
        "missing-directory": (["--emit-optimizer", tmp / "no" / "o.py"], "does not exist; create it first"),
    }[case]
    r = run_verify("--spec", spec, "--train", "--steps", 1, "--device", "cpu", *args)
    _refused_before_running(r, words)
    assert spec.read_text() == SPEC_TEXT and (tmp / "old.py").read_text() == "kept\n"
    assert sorted(os.listdir(tmp)) == ["linked.py", "old.py", "spec.py"]


def test_nothing_to_emit_is_refused_before_anything_runs(tmp):
    """torch's optimizer has no translation and the spec gives paddle's itself: --emit-optimizer
    has nothing to write, said before the checks run rather than after them."""
    spec = tmp / "own_optimizer.py"
    marker = tmp / "batches_called"
    spec.write_text(SPEC_TEXT + "\n\ndef torch_optimizer(model):\n    return torch.optim.Adadelta(model.parameters())\n"
                    "\n\ndef paddle_optimizer(model):\n    return paddle.optimizer.Adadelta(parameters=model.parameters())\n"
                    f"\n\n_batches = batches\n\n\ndef batches():\n    open({str(marker)!r}, 'w').close()\n"
                    "    return _batches()\n")
    r = run_verify("--spec", spec, "--train", "--steps", 1, "--device", "cpu", "--emit-optimizer", tmp / "o.py",
                   "--json", tmp / "r.json")
    _refused_before_running(r, "and the spec gives paddle_optimizer(model) itself: there is nothing to write")
    assert not marker.exists(), "the training checks ran before the refusal"
    assert sorted(os.listdir(tmp)) == ["own_optimizer.py"]


@pytest.mark.slow


def test_emitted_optimizer_replaces_an_old_file_whole_with_force(tmp):
    spec = _spec(tmp)
    (tmp / "opt.py").write_text("old\n")
    r = run_verify("--spec", spec, "--train", "--steps", 1, "--device", "cpu", "--emit-optimizer", tmp / "opt.py",
                   "--json", tmp / "r.json", "--force")
    assert r.code == 0, r
    code = (tmp / "opt.py").read_text()
    compile(code, "opt.py", "exec")
    assert "def paddle_optimizer(model):" in code and "paddle.optimizer.AdamW(" in code
    assert sorted(os.listdir(tmp)) == ["opt.py", "r.json", "spec.py"]  # no partial file left beside them


@pytest.mark.slow


def test_paddle_batchnorm_training_notice_is_not_in_our_output():
    """Paddle's BatchNorm warns on every training-mode call that it tracks its running statistics;
    --train says nothing of it, and leaves the warning filters as it found them."""
    import warnings

    import paddle

    from converter.spec import PortSpec
    from helpers.train import train_check
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = train_check(PortSpec.from_file(spec_path("train_cnn")), steps=1, device="cpu")
        assert report.verdict == "pass"
        assert not [w for w in seen if "track global mean and variance" in str(w.message)], [str(w.message) for w in seen]
        layer = paddle.nn.BatchNorm2D(3)
        layer.train()
        layer(paddle.ones([2, 3, 4, 4]))  # outside the checks paddle's notice is shown as before
        assert any("track global mean and variance" in str(w.message) for w in seen)
