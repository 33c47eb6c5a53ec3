"""The layers of src/icelog import each other in one direction only (issue 8, "shape the house").

Every import in every module is read with `ast` — top-level, function-level and `TYPE_CHECKING` ones alike,
since a function-level import is still a dependency — and checked against ALLOWED below. The same table is
in docs/architecture.md ("Allowed imports"). Adding a package means adding a row here; a split package
(e.g. `schema/` → `schema/registry/`, `schema/enforce/`, `schema/archive/`) may get finer rows, since a
module's rule is the longest row that names it or a package above it. Two more tests keep
docs/architecture.md's layer table and allowed-imports table in step with the tree and with ALLOWED.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Leaves every layer may use: the error root and the crash-test hook (icelog.faults imports nothing of ours).
ERRORS = {"icelog.errors", "icelog.faults"}
# The config layer: broker settings, topic names and every topic config key (Kafka's, icelog.archive.*,
# icelog.schema.*). It imports nothing above it, so the log, the lake and the schema layer all read it.
CONFIG = {"icelog.config", "icelog.topics", "icelog.topic_configs"} | ERRORS
EVERYTHING_BUT_CLI = {
    "icelog.errors", "icelog.faults", "icelog.config", "icelog.topics", "icelog.topic_configs", "icelog.meta",
    "icelog.log", "icelog.coordinator", "icelog.schema", "icelog.lake", "icelog.pipeline", "icelog.wire",
    "icelog.readback",
}

# module or package → the icelog modules/packages it may import (besides its own top-level package). Every
# layer above the config layer may read all of it (CONFIG); the rules that matter are between the others.
ALLOWED: dict[str, set[str]] = {
    "icelog": set(),  # the package's __init__
    "icelog.errors": set(),
    "icelog.faults": set(),
    "icelog.config": ERRORS,
    "icelog.topic_configs": {"icelog.config"} | ERRORS,  # declarations only: never topics.py, never a feature
    "icelog.topics": {"icelog.topic_configs"} | ERRORS,
    "icelog.meta": ERRORS,
    # The intake log: offsets, files, retention. Knows nothing of Iceberg, Spark, schemas or the protocol.
    "icelog.log": CONFIG | {"icelog.meta"},
    "icelog.coordinator": CONFIG | {"icelog.log", "icelog.meta"},
    # Registry, Protobuf, Protobuf → Iceberg types. Never the wire, the pipeline or the lake; of the log only
    # its one varint codec (a leaf module: Confluent's envelope writes message indexes as zig-zag varints)...
    "icelog.schema": CONFIG | {"icelog.meta", "icelog.log.varint"},
    # ...and produce-time enforcement decodes and re-encodes produced batches with the log's parser.
    "icelog.schema.enforce": CONFIG | {"icelog.meta", "icelog.log.varint", "icelog.log.batch"},
    # Table layouts, catalog, Spark session: pure functions of settings. Never the log or the broker.
    "icelog.lake": CONFIG,
    # The archive job reads the intake's file format and batch headers (read-only) and writes the lake.
    "icelog.pipeline": CONFIG | {"icelog.meta", "icelog.log", "icelog.lake", "icelog.schema"},
    # Read-back: Kafka record batches from the archive tables (pyiceberg, pyarrow). Knows the lake and how
    # rows rebuild payloads (schema.archive), of the log only the batch layout and varints; never the wire.
    "icelog.readback": CONFIG | {"icelog.lake", "icelog.schema.archive", "icelog.log.record_format",
                                 "icelog.log.varint"},
    # The Kafka protocol: knows nothing of Iceberg or Spark; of schemas only produce-time enforcement.
    "icelog.wire": CONFIG | {"icelog.meta", "icelog.log", "icelog.coordinator", "icelog.schema.enforce"},
    # The broker process assembles the layers (the archiver is a child process it supervises).
    "icelog.broker": EVERYTHING_BUT_CLI,
    "icelog.cli": EVERYTHING_BUT_CLI | {"icelog.broker"},
    "icelog.__main__": {"icelog.cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SRC / "icelog").rglob("*.py"))}


def icelog_imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported icelog module) for every import statement anywhere in the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from icelog.x import y` imports the module icelog.x.y when there is one.
            subs = {f"{target}.{alias.name}" for alias in node.names}
            for found in sorted({sub if sub in known else target for sub in subs}):
                yield node.lineno, found


def rule_for(name: str) -> str | None:
    """The longest ALLOWED row naming this module or a package above it (the root row only names itself)."""
    best = None
    for row in ALLOWED:
        matches = name == row or (row != "icelog" and name.startswith(row + "."))
        if matches and (best is None or len(row) > len(best)):
            best = row
    return best


def top_level(name: str) -> str:
    return ".".join(name.split(".")[:2])


def within(target: str, prefixes: set[str]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def test_every_module_has_a_layer() -> None:
    missing = sorted(name for name in modules() if rule_for(name) is None)
    assert not missing, f"add a row to ALLOWED (and docs/architecture.md) for: {missing}"


def test_no_import_crosses_a_layer_the_wrong_way() -> None:
    known = set(modules())
    wrong = []
    for name, path in modules().items():
        row = rule_for(name)
        assert row is not None
        for line, target in icelog_imports(name, path, known):
            if not (target == "icelog" or target.startswith("icelog.")):
                continue
            if top_level(target) == top_level(name) and name != "icelog":
                continue  # inside one top-level package
            if not within(target, ALLOWED[row]):
                allowed = sorted(ALLOWED[row])
                wrong.append(f"{path.relative_to(SRC)}:{line} imports {target} (row {row!r} allows {allowed})")
    assert not wrong, "imports against the layer table:\n" + "\n".join(wrong)


def test_the_layer_table_has_no_circle() -> None:
    # Between top-level packages the allowed directions form a DAG: no two layers may import each other.
    graph = {top_level(row): set() for row in ALLOWED if row != "icelog"}
    for row, targets in ALLOWED.items():
        if row != "icelog":
            graph[top_level(row)] |= {top_level(t) for t in targets} - {top_level(row)}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 1:
            raise AssertionError("circle in ALLOWED: " + " → ".join([*trail, node]))
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])


def test_no_row_is_stale() -> None:
    # A row that names no module (after a move or split) would hide a missing rule for the new place.
    names = set(modules())
    stale = sorted(row for row in ALLOWED if not any(n == row or n.startswith(row + ".") for n in names))
    assert not stale, f"ALLOWED rows that match no module under src/icelog: {stale}"


def _doc_section(title: str) -> str:
    text = (SRC.parent / "docs" / "architecture.md").read_text()
    return text.split(title, 1)[1].split("\n#", 1)[0]


def _table_rows(section: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    ][1:]


def test_architecture_doc_allows_what_the_test_allows() -> None:
    # docs/architecture.md "Allowed imports" is this table in prose; they must not drift apart.
    documented = {}
    for name, targets in _table_rows(_doc_section("### Allowed imports")):
        row = "icelog." + name.strip("`")
        if targets.startswith("everything but"):
            allowed = set(EVERYTHING_BUT_CLI)
        elif targets.startswith("everything"):
            allowed = EVERYTHING_BUT_CLI | {"icelog.broker"}
        else:  # names in backticks, but not those in a parenthesised "why"; "config layer" is all three
            allowed = {"icelog." + t for t in re.findall(r"`([^`]+)`", re.sub(r"\(.*?\)", "", targets))}
            if targets.startswith("config layer"):
                allowed |= CONFIG
        documented[row] = allowed | ERRORS
    expected = {row: targets | ERRORS for row, targets in ALLOWED.items()
                if row not in ("icelog", "icelog.errors", "icelog.faults", "icelog.__main__")}
    assert documented == expected


def test_architecture_doc_names_every_module() -> None:
    # The "Layers" table's modules column covers the tree: every module file is named (or a `dir/*` holds it).
    patterns = []
    for cells in _table_rows(_doc_section("## Layers and their one reason to change")):
        for item in re.findall(r"`([^`]+)`", cells[1]):
            braces = re.fullmatch(r"(.*)\{(.+)\}(.*)", item)
            patterns += [braces[1] + part + braces[3] for part in braces[2].split(",")] if braces else [item]
    missing = []
    for path in sorted((SRC / "icelog").rglob("*.py")):
        rel = path.relative_to(SRC / "icelog").as_posix()
        if path.name == "__init__.py" or any(fnmatch.fnmatch(rel, p) for p in patterns):
            continue
        missing.append(rel)
    assert not missing, f"docs/architecture.md's layer table does not name {missing}"
