"""The repository's paths, and the two commands run as a user runs them."""
import os
import subprocess

from click.testing import CliRunner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECS = os.path.join(ROOT, "tests", "specs")


def spec_path(name: str) -> str:
    return os.path.join(SPECS, name + ".py")


class CliResult:
    def __init__(self, code, stdout, stderr):
        self.code, self.stdout, self.stderr = code, stdout, stderr

    def __repr__(self):
        return f"exit {self.code}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def run_convert(*args) -> CliResult:
    from converter.cli import convert_weights
    r = CliRunner().invoke(convert_weights, [str(a) for a in args], catch_exceptions=False)
    return CliResult(r.exit_code, r.stdout, r.stderr)


def run_verify(*args) -> CliResult:
    from converter.cli import verify_port
    r = CliRunner().invoke(verify_port, [str(a) for a in args], catch_exceptions=False)
    return CliResult(r.exit_code, r.stdout, r.stderr)


def run_script(*args, timeout=600) -> CliResult:
    """Run an installed console script in a fresh process, as a user would."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return CliResult(p.returncode, p.stdout, p.stderr)
