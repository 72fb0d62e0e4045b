"""One meaning per class name: no two public classes of the package share a name (a reader who
meets `Reading` or `Held` in one module must not find another class of that name elsewhere)."""

import ast
import os
from collections import defaultdict

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "converter")


def test_no_two_public_classes_share_a_name():
    where = defaultdict(list)
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in tree.body:
                    if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                        where[node.name].append(os.path.relpath(path, PACKAGE))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
