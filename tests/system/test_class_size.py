"""No god classes: no class in src/ defines more than 30 methods.

A class that does that much has more than one reason to change; split it the way the metadata store's backends
are split (meta/sqlite/, meta/postgres/: one class per slice of the interface, each in its own module, and the
store assembled from them). Counted: the functions written in a class's own body (methods, properties, static and
class methods), not what it inherits.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MOST_METHODS = 30


def methods_per_class(source: str) -> dict[str, int]:
    """Each class of a module's source (nested ones by their dotted name) → the functions in its own body."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                counts[name] = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in child.body)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return counts


def test_the_counter_counts_a_class_own_methods() -> None:
    source = (
        "class A:\n    def a(self): ...\n    async def b(self): ...\n    @property\n    def c(self): ...\n"
        "    class Inner:\n        def d(self): ...\n"
        "class B(A):\n    x = 1\n"
    )
    assert methods_per_class(source) == {"A": 3, "A.Inner": 1, "B": 0}


def test_no_class_in_src_has_more_than_30_methods() -> None:
    too_big = [
        f"{path.relative_to(SRC)}: {name} has {count} methods"
        for path in sorted(SRC.rglob("*.py"))
        for name, count in methods_per_class(path.read_text()).items()
        if count > MOST_METHODS
    ]
    assert too_big == [], "split by responsibility:\n" + "\n".join(too_big)
