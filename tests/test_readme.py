"""What README.md and docs/ state, checked: CI runs exactly the README's test commands, the README
stays short and links every page of docs/, every link resolves, every option the commands are shown
with is one the command takes, every repository path named exists, and the README's HF-to-PaddleNLP
spec is a complete spec (it is run in tests/real_models/test_readme_spec.py)."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _read(path):
    with open(path) as f:
        return f.read()


def _readme_lines(prefix):
    with open(README) as f:
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


def test_ci_runs_the_paddleformers_suite_the_readme_gives():
    (side,) = _readme_lines("PY=$(scripts/side_env_paddleformers.sh)")
    assert side.endswith("pytest -q tests/real_models_paddleformers") and side in _ci_lines()


def test_ci_runs_the_ports_suite_the_readme_gives():
    (side,) = _readme_lines("PY=$(scripts/side_env_ports.sh)")
    assert side.endswith("pytest -q tests/real_ports") and side in _ci_lines()


def test_ci_checks_the_shipped_rule_sets_against_paddlenlp():
    (check,) = {line for line in _readme_lines("PY=$(scripts/side_env.sh)") if "check_mappings_paddlenlp" in line}
    assert check in _ci_lines()


def test_setup_installs_every_package_of_the_project():
    """A package missing from setup.py's list works in an editable install and is gone from
    a real one."""
    listed = set(ast.literal_eval(_setup_keyword("packages")))
    found = {os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "converter"))
             if "__init__.py" in files}
    assert found <= listed, f"setup.py's packages lack {sorted(found - listed)}"


def _setup_keyword(name):
    call = next(n for n in ast.walk(ast.parse(_read(os.path.join(ROOT, "setup.py"))))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    return next(k.value for k in call.keywords if k.arg == name)


# ---- the README: short, the two set-up commands first, every page of docs/ linked

def test_readme_is_at_most_200_lines_and_starts_with_the_two_setup_commands():
    text = _read(README)
    assert len(text.splitlines()) <= 200
    commands = [line.strip() for line in text.splitlines() if line.startswith("    ") and line.strip()]
    assert commands[:2] == _readme_lines("pip install -c constraints.txt")


def _links(path):
    """(target file, anchor) of every relative Markdown link in `path`."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _read(path)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        out.append((os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path, anchor))
    return out


def _anchors(path):
    """GitHub's anchors of the headings of a Markdown file."""
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", _read(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def test_the_readme_links_every_page_of_docs():
    assert len(DOCS) >= 10
    linked = {file for file, _ in _links(README)}
    assert set(DOCS) <= linked, f"not linked from README.md: {sorted(set(DOCS) - linked)}"


@pytest.mark.parametrize("page", [README] + DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_link_resolves(page):
    for file, anchor in _links(page):
        assert os.path.isfile(file), f"{page}: link to {file}, which does not exist"
        if anchor:
            assert anchor in _anchors(file), f"{page}: no heading '#{anchor}' in {file}"


@pytest.mark.parametrize("page", [README] + DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_repository_path_named_exists(page):
    for path in re.findall(r"`((?:converter|tests|scripts|mappings)/[\w./-]+)`", _read(page)):
        assert os.path.exists(os.path.join(ROOT, path)), f"{page} names {path}, which does not exist"


def test_the_anchor_rule_matches_a_heading_with_punctuation():
    """The slug rule the link check uses: lower case, punctuation dropped, spaces to hyphens."""
    assert "where-paddlenlp-281-cannot-match-hf" in _anchors(os.path.join(ROOT, "docs", "validation.md"))


# ---- every option shown is one the command takes

def _help(command):
    """`command --help` as the installed console script prints it (setup.py's entry point)."""
    entry = next(e for e in ast.literal_eval(_setup_keyword("entry_points"))["console_scripts"]
                 if e.startswith(command + "="))
    module, function = entry.split("=", 1)[1].split(":")
    code = f"import sys; sys.argv = [{command!r}, '--help']; from {module} import {function}; {function}()"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("command", ["convert-weights", "verify-port"])
def test_every_option_shown_is_a_real_option(command):
    shown = set()
    for page in [README] + DOCS:
        for line in _read(page).splitlines():
            if line.strip().startswith(command + " "):
                shown |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    assert len(shown) >= 5, shown
    taken = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _help(command)))
    assert shown <= taken, f"{command} does not take {sorted(shown - taken)}"


def test_the_quick_starts_show_each_command():
    lines = [line.strip() for line in _read(README).splitlines() if line.startswith("    ")]
    assert any(re.fullmatch(r"convert-weights \S+\.bin \S+\.pdparams", line) for line in lines)
    assert any(re.fullmatch(r"convert-weights [\w-]+ [\w-]+", line) for line in lines)  # a directory
    assert "verify-port --spec my_bert_spec.py --bisect" in lines
    assert any(line.startswith("verify-port --spec my_bert_spec.py --train") for line in lines)


# ---- the README's HF-to-PaddleNLP spec

def readme_spec():
    """The README's complete spec: the Python block that sets HF_DIR and PD_DIR."""
    blocks = re.findall(r"```python\n(.*?)```", _read(README), re.S)
    (spec,) = [b for b in blocks if re.search(r"^HF_DIR = ", b, re.M) and re.search(r"^PD_DIR = ", b, re.M)]
    return spec


def test_the_readme_spec_defines_the_whole_contract():
    tree = ast.parse(readme_spec())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"torch_model", "paddle_model", "inputs"} <= functions
    (mapping,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "mapping" for t in n.targets)]
    assert os.path.isfile(os.path.join(ROOT, "mappings", ast.literal_eval(mapping) + ".json"))
    source = readme_spec()
    assert "LazyGuard" in source and "from_pretrained(PD_DIR)" in source


def test_the_readme_spec_names_the_directories_the_quick_start_converts():
    namespace = {}
    assignments = [n for n in ast.parse(readme_spec()).body if isinstance(n, ast.Assign)]
    exec(compile(ast.Module(assignments, []), "README.md", "exec"), namespace)
    assert f"    convert-weights {namespace['HF_DIR']} {namespace['PD_DIR']}" in _read(README).splitlines()
