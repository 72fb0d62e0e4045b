"""CI runs exactly the README's test commands (the main suite, then the real-model suite in
its side environment); the README's main-job command is the bundled default."""

import os

from helpers.cli import ROOT


def _readme_lines(prefix):
    with open(os.path.join(ROOT, "README.md")) as f:
        return [line.strip() for line in f if line.startswith("    " + prefix)]


def _ci_lines():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_test_command():
    main_job, tests = _readme_lines("pip install -c constraints.txt")
    ci = _ci_lines()
    assert tests in ci
    assert tests.endswith("python -m pytest -q tests")
    assert main_job.endswith("verify-port --bisect")


def test_ci_runs_the_real_model_suite_after_the_main_tests():
    (side,) = {line for line in _readme_lines("PY=$(scripts/side_env.sh)") if "tests/real_models" in line}
    ci = _ci_lines()
    assert side in ci and ci.index(side) > ci.index(_readme_lines("pip install -c constraints.txt")[1])


def test_ci_checks_the_shipped_rule_sets_against_paddlenlp():
    (check,) = {line for line in _readme_lines("PY=$(scripts/side_env.sh)") if "check_mappings_paddlenlp" in line}
    assert check in _ci_lines()


def test_setup_installs_every_package_of_the_project():
    """A package missing from setup.py's list works in an editable install and is gone from
    a real one (converter.train was, for a while)."""
    import ast
    with open(os.path.join(ROOT, "setup.py")) as f:
        call = next(n for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", "") == "setup")
    listed = set(ast.literal_eval(next(k.value for k in call.keywords if k.arg == "packages")))
    found = {os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "converter"))
             if "__init__.py" in files}
    assert found <= listed, f"setup.py's packages lack {sorted(found - listed)}"
