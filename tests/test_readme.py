"""CI runs exactly the README's test command; the README's main-job command is the bundled default."""

import os

from conftest import ROOT


def _readme_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        return [line.strip() for line in f if line.startswith("    pip install -c constraints.txt")]


def test_ci_runs_the_readme_test_command():
    main_job, tests = _readme_commands()
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert ci[-1] == tests
    assert tests.endswith("python -m pytest -q tests")
    assert main_job.endswith("verify-port --bisect")
