"""The package's imports, read from its source (every import statement: at the top, inside a
function, under TYPE_CHECKING): no module imports one of a higher layer, and no import circle."""

import pytest
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "converter")

# low to high; a module may import its own layer and those below. The longest prefix names a
# module's layer. The foundations come in the order they import each other: errors, dtypes,
# the io that reads and writes checkpoints (with the byte layout and worker pipeline it writes
# through, and the commands' one-line errors and report files), the walker and path helpers,
# the per-layer-type families, then the rules that the families let us infer.
LAYERS = [
    ("errors", ["converter.errors", "converter.lazy", "converter.patches", "converter.diagnosis", "converter.results", "converter.progress",
                "converter.hf"]),
    ("dtypes", ["converter.dtypes"]),
    ("io", ["converter.io", "converter.layout", "converter.pipeline", "converter.cli_common"]),
    ("tree/paths", ["converter.tree", "converter.paths"]),
    ("families", ["converter.families"]),
    ("rules", ["converter.rules", "converter.hf.config"]),
    ("frameworks", ["converter.frameworks"]),
    ("convert", ["converter.convert", "converter.inmemory", "converter.hf.directory", "converter.spec"]),
    ("compare", ["converter.compare"]),
    ("verify", ["converter.verify", "converter.hf.pair", "converter.hf.classes", "converter.hf.fields"]),
    ("train", ["converter.train"]),
    ("report", ["converter.report"]),
    ("api", ["converter.api", "converter", "converter.examples"]),
    ("cli/commands", ["converter.cli"]),
]


def modules() -> dict:
    """module name -> (file, is a package)."""
    found = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path[:-3], ROOT).split(os.sep)
                package = parts[-1] == "__init__"
                found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imports(name: str, path: str, package: bool, known: dict) -> list:
    """(line, imported module) for each package module this one imports."""
    here = name if package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import sub` imports the module pkg.sub; `from mod import name` the module mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append((node.lineno, target))
    return out


def layer_of(name: str) -> int:
    """The layer of the longest prefix naming `name` (the package itself, "converter", only by its name)."""
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if name == p or (p != "converter" and name.startswith(p + "."))), default=None)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[1]


def graph() -> dict:
    known = modules()
    return {name: imports(name, path, package, known) for name, (path, package) in known.items()}


def circles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.slow


def test_the_reader_sees_every_kind_of_import():
    edges = graph()
    assert len(edges) > 50
    assert "converter.verify.run" in {t for _, t in edges["converter.api"]}  # a function-local import
    assert "converter.api" in {t for _, t in edges["converter.cli.verify"]}  # `from .. import api`
    assert "converter.errors" in {t for _, t in edges["converter.io.base"]}  # `from ..errors import`
    assert "converter.families" in {t for _, t in edges["converter.families.activation"]}  # `from . import`
    assert all(t != name for name, found in edges.items() for _, t in found)


@pytest.mark.slow


def test_every_module_has_a_layer():
    for name in graph():
        layer_of(name)
    assert layer_of("converter") == layer_of("converter.api") != layer_of("converter.tree")


@pytest.mark.slow


def test_no_import_from_a_lower_layer_to_a_higher_one():
    edges = graph()
    upward = [f"{name} (line {line}, layer {LAYERS[layer_of(name)][0]}) imports {target} (layer "
              f"{LAYERS[layer_of(target)][0]})"
              for name, found in sorted(edges.items()) for line, target in found if layer_of(target) > layer_of(name)]
    assert upward == []


@pytest.mark.slow


def test_families_do_not_import_verify():
    edges = graph()
    assert [(n, t) for n, found in edges.items() if n.startswith("converter.families")
            for _, t in found if t.startswith("converter.verify")] == []


@pytest.mark.slow


def test_no_import_circle():
    assert circles(graph()) == []


def test_the_circle_finder_finds_one():
    edges = {"a": [(1, "b")], "b": [(1, "c")], "c": [(1, "a")], "d": [(1, "a")]}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": [(1, "b")], "b": []}) == []


# what the commands may import outside their own package: the public API, the errors they turn
# into exit codes, their report files, and the renderers of the API's report
COMMANDS_IMPORT = {"converter.api", "converter.errors", "converter.cli_common", "converter.report",
                   "converter.progress"}  # the progress line the commands open


def _in_commands(name: str) -> bool:
    return name == "converter.cli" or name.startswith("converter.cli.")


@pytest.mark.slow
def test_the_commands_call_only_the_public_api():
    edges = graph()
    assert any(_in_commands(name) for name in edges)
    reached = {t for name, found in edges.items() if _in_commands(name) for _, t in found if not _in_commands(t)}
    assert "converter.api" in reached
    assert reached <= COMMANDS_IMPORT, sorted(reached - COMMANDS_IMPORT)
