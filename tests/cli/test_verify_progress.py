"""verify-port shows what it is doing and how far on one stderr line that tqdm redraws (the
forward passes of either model, the training run and its step), only on a terminal and not under
--quiet; a pipe or a file gets nothing of it."""

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios

import pytest

from converter import progress
from helpers.cli import ROOT, run_verify, spec_path

COMMAND = "import sys; from converter.cli import verify_port; sys.argv[0] = 'verify-port'; verify_port()"


def _on_a_terminal(*args) -> tuple[int, str, str]:
    """verify-port with its stderr on a pseudo-terminal of 120 columns: (exit code, stdout, stderr)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    p = subprocess.Popen([sys.executable, "-c", COMMAND, *map(str, args)], stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = p.stdout.read().decode()
    p.stdout.close()
    return p.wait(), out, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_on_a_terminal_the_passes_and_the_training_steps_are_shown_and_cleared():
    code, out, err = _on_a_terminal("--spec", spec_path("train_mlp"), "--train", "--steps", 2, "--device", "cpu")
    assert code == 0, err
    shown = err.split("\r")
    assert all(s.startswith("verify-port: ") or not s.strip() for s in shown), shown
    for run in ("torch fp32", "torch float64", "paddle fp32"):  # every step of every run drawn
        for k in (1, 2):
            assert any(f"training: {run} step {k}/2 [" in s for s in shown), (run, k, shown)
    assert any("training checks done" in s for s in shown), shown
    assert any(re.search(r"\d+ forward pass\(es\), now (torch|paddle)'s", s) for s in shown), shown
    assert err.endswith("\r") and not shown[-2].strip(), shown  # the line is cleared at the end
    assert out.strip().splitlines()[-1].startswith("PASS: the training checks (2 step(s))"), out


@pytest.mark.slow
def test_quiet_draws_nothing_on_a_terminal():
    code, out, err = _on_a_terminal("--spec", spec_path("train_mlp"), "--train", "--steps", 2, "--device", "cpu",
                                    "--quiet")
    assert code == 0 and out.strip().splitlines()[-1].startswith("PASS"), (out, err)
    assert "verify-port:" not in err, err


def test_a_pipe_gets_no_progress_line(tmp):
    r = run_verify("--spec", spec_path("train_mlp"), "--device", "cpu")
    assert r.code == 0, r
    assert "verify-port:" not in r.stderr and "forward pass" not in r.stderr, r.stderr


def test_the_line_says_each_pass_and_step_and_is_cleared():
    f = io.StringIO()
    with progress.shown(True, file=f):
        progress.forward_pass("torch")
        progress.training_step("paddle fp32", 2, 10)
        assert progress.write("a line above it")
    progress.forward_pass("paddle")  # after the line is gone: nothing drawn
    assert not progress.write("not drawn")
    text = f.getvalue()
    assert "verify-port: 1 forward pass(es), now torch's" in text
    assert "verify-port: 1 forward pass(es), now torch's; training: paddle fp32 step 3/10" in text
    assert "a line above it\n" in text and "not drawn" not in text and "now paddle's" not in text
    assert text.endswith("\r"), repr(text)
