"""setup.py as pip reads it: each console script names a function that exists, and every package
of converter/ is listed (a wheel built from a list that misses one lacks its modules)."""

import ast
import importlib
import os

from helpers.cli import ROOT


def _setup_call() -> dict:
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_each_console_script_names_a_function_that_exists():
    scripts = dict(line.split("=", 1) for line in _setup_call()["entry_points"]["console_scripts"])
    assert sorted(scripts) == ["convert-weights", "verify-port"]
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target


def test_every_package_is_listed():
    setup = _setup_call()
    found = {os.path.relpath(folder, ROOT).replace(os.sep, ".")
             for folder, _, files in os.walk(os.path.join(ROOT, "converter")) if "__init__.py" in files}
    assert "converter.cli" in found
    assert found <= set(setup["packages"]), sorted(found - set(setup["packages"]))
