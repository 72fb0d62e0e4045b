"""Every output (DST, --json, --emit-mapping, verify-port's --json and --html) is atomic and
no-clobber, none may be an input, and all are checked before anything is written."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from helpers.cli import ROOT, run_convert, run_verify, spec_path
from helpers.hostile_forge import assert_one_line_error, no_leftovers

KEEP_ALL = [{"kind": "rename", "match": "(.*)", "to": r"\1"}]


@pytest.fixture
def ckpt(tmp):
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, tmp / "m.pt")
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    return tmp / "m.pt", tmp / "rules.json"


@pytest.mark.parametrize("option", ["--json", "--emit-mapping"])
def test_report_outputs_are_not_clobbered_without_force(tmp, ckpt, option):
    src, rules = ckpt
    (tmp / "report.txt").write_text("precious")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, option, tmp / "report.txt")
    assert_one_line_error(r, "report.txt", "--force")
    assert (tmp / "report.txt").read_text() == "precious"
    assert not (tmp / "o.pdparams").exists()
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, option, tmp / "report.txt", "--force")
    assert r.code == 0, r
    assert (tmp / "report.txt").read_text() != "precious"
    json.loads((tmp / "report.txt").read_text())


@pytest.mark.parametrize("option", ["--json", "--emit-mapping"])
def test_no_output_may_be_the_source_even_with_force(tmp, ckpt, option):
    src, rules = ckpt
    before = src.read_bytes()
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, option, src, "--force")
    assert_one_line_error(r, "also an input")
    assert src.read_bytes() == before
    assert not (tmp / "o.pdparams").exists()


def test_emit_mapping_may_not_overwrite_the_rule_file_it_reads(tmp, ckpt):
    src, rules = ckpt
    before = rules.read_text()
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, "--emit-mapping", rules, "--force")
    assert_one_line_error(r, "also an input")
    assert rules.read_text() == before


def test_json_into_a_missing_directory_fails_before_dst_is_written(tmp, ckpt):
    src, rules = ckpt
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, "--json", tmp / "nowhere" / "r.json")
    assert_one_line_error(r, "nowhere", "does not exist")
    assert not (tmp / "o.pdparams").exists()


def test_emit_mapping_equal_to_dst_is_refused(tmp, ckpt):
    src, rules = ckpt
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, "--emit-mapping", tmp / "o.pdparams")
    assert_one_line_error(r, "same file")
    assert not (tmp / "o.pdparams").exists()
    (tmp / "o.pdparams").write_bytes(b"old")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, "--json", tmp / "o.pdparams", "--force")
    assert_one_line_error(r, "same file")
    assert (tmp / "o.pdparams").read_bytes() == b"old"


def test_an_output_may_not_be_a_shard_the_index_names(tmp):
    save_file({"w": torch.ones(2)}, str(tmp / "model-1.safetensors"))
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    before = (tmp / "model-1.safetensors").read_bytes()
    r = run_convert(tmp, tmp / "o.safetensors", "--mapping", tmp / "rules.json", "--json", tmp / "model-1.safetensors",
                    "--force")
    assert_one_line_error(r, "also an input")
    assert (tmp / "model-1.safetensors").read_bytes() == before


def test_a_hard_link_to_the_source_is_the_source(tmp, ckpt):
    src, rules = ckpt
    os.link(src, tmp / "alias.pdparams")
    before = src.read_bytes()
    r = run_convert(src, tmp / "alias.pdparams", "--mapping", rules, "--force")
    assert_one_line_error(r, "also an input")
    assert src.read_bytes() == before


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow


def test_stale_temporaries_of_dead_runs_are_removed(tmp, ckpt):
    from converter.io.temporaries import _hidden_prefix
    src, rules = ckpt
    ours = _hidden_prefix(str(tmp / "o.pdparams"))
    stale = tmp / f"{ours}{_dead_pid()}.partial"
    stale.write_bytes(b"x" * 1000)
    alive = tmp / f"{ours}{os.getpid()}.abc.partial"  # a run still going: left alone
    alive.write_bytes(b"y")
    other = tmp / f"{_hidden_prefix(str(tmp / 'other.pdparams'))}{_dead_pid()}.partial"  # another destination's
    other.write_bytes(b"z")
    elsewhere = tmp / f".o.pdparams.another-machine.{_dead_pid()}.partial"  # a run on another machine
    elsewhere.write_bytes(b"w")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 0, r
    assert not stale.exists() and alive.exists() and other.exists() and elsewhere.exists()


def _write_and_die(tmp, without_tmpfile: bool):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        if {without_tmpfile!r}:
            del os.O_TMPFILE
        from converter.io.atomic import AtomicOutput
        with AtomicOutput({str(tmp / 'o.pdparams')!r}) as f:
            f.write(b"x" * (1 << 20))
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script])
    assert p.returncode == -signal.SIGKILL


@pytest.mark.slow


def test_without_o_tmpfile_a_killed_run_leaves_a_hidden_file_the_next_run_removes(tmp, ckpt):
    src, rules = ckpt
    _write_and_die(tmp, without_tmpfile=True)
    assert len(no_leftovers(tmp)) == 1  # the window README.md states
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules)
    assert r.code == 0, r
    assert no_leftovers(tmp) == []


def test_with_o_tmpfile_a_new_output_never_has_a_temporary_name(tmp, ckpt, monkeypatch):
    """The anonymous file is linked straight to DST: there is no moment at which a kill could
    leave a hidden name behind."""
    from converter.io import atomic
    names = []
    original = atomic._link_anonymous

    def spy(fd, dst):
        names.append(os.path.basename(dst))
        return original(fd, dst)
    monkeypatch.setattr(atomic, "_link_anonymous", spy)
    src, rules = ckpt
    assert run_convert(src, tmp / "o.pdparams", "--mapping", rules).code == 0
    assert names == ["o.pdparams"]


@pytest.mark.parametrize("without_tmpfile", [False, True])
def test_an_output_that_appears_meanwhile_is_not_replaced(tmp, monkeypatch, without_tmpfile):
    from converter.errors import UserError
    from converter.io.atomic import AtomicOutput
    if without_tmpfile:
        monkeypatch.delattr(os, "O_TMPFILE")
    target = tmp / "late.bin"
    with pytest.raises(UserError, match="appeared while this ran"):
        with AtomicOutput(str(target)) as f:
            f.write(b"new")
            target.write_bytes(b"someone else's")
    assert target.read_bytes() == b"someone else's"
    assert no_leftovers(tmp) == []


def test_verify_port_reports_are_guarded_before_the_run(tmp):
    (tmp / "r.json").write_text("precious")
    r = run_verify("--spec", spec_path("cnn"), "--json", tmp / "r.json", "--html", tmp / "r.html")
    assert_one_line_error(r, "r.json", "--force")
    assert (tmp / "r.json").read_text() == "precious" and not (tmp / "r.html").exists()
    r = run_verify("--spec", spec_path("cnn"), "--html", spec_path("cnn"), "--force")
    assert_one_line_error(r, "also an input")
    r = run_verify("--spec", spec_path("cnn"), "--json", tmp / "same.out", "--html", tmp / "same.out")
    assert_one_line_error(r, "same file")


def test_an_output_name_that_is_not_utf8(tmp, ckpt):
    """File names are bytes: one that is not UTF-8 reaches Python as surrogate escapes."""
    src, rules = ckpt
    name = os.fsdecode(b"out\xff.pdparams")
    r = run_convert(src, tmp / name, "--mapping", rules)
    assert r.code == 0, r
    assert os.listdir(os.fsencode(str(tmp))).count(b"out\xff.pdparams") == 1


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_report_files_written_together_are_all_or_nothing(tmp, failing):
    """verify-port's --emit-optimizer, --json and --html go through one write_outputs: a file that
    fails while being written (here, text that is not encodable), wherever it comes, leaves none
    of them; when all can be written, all are, each with its own text."""
    from converter.cli_common import write_outputs
    paths = [str(tmp / "a.py"), str(tmp / "b.json"), str(tmp / "c.html")]
    texts = ["x = 1\n", "{}\n", "<p>ok</p>"]
    bad = list(texts)
    bad[failing] = "bad \ud800"
    with pytest.raises(UnicodeEncodeError):
        write_outputs(dict(zip(paths, bad)), force=False)
    assert sorted(os.listdir(tmp)) == []
    write_outputs({paths[0]: texts[0], None: "skipped", paths[1]: texts[1], paths[2]: texts[2]}, force=False)
    assert [open(p).read() for p in paths] == texts
    assert sorted(os.listdir(tmp)) == ["a.py", "b.json", "c.html"]
