"""The layer rules are declared once, as import-linter contracts in pyproject.toml; these tests run them.

import-linter (grimp) reads every import of every module, top-level, function-level and `TYPE_CHECKING` ones
alike. The second test proves the contracts bite: a copy of the package with one import that crosses a layer the
wrong way, and one that brings Spark into the table spec, must each break a contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def run_lint(src: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache)],
        cwd=src, env=env, capture_output=True, text=True, timeout=300,
    )


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = run_lint(ROOT / "src", tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_wrong_way_import_breaks_a_contract(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "icelog", src / "icelog", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    log_module = src / "icelog" / "log" / "pressure.py"
    wrong = "\n\ndef _wrong() -> None:\n    from icelog.wire import server  # noqa\n"
    log_module.write_text(log_module.read_text() + wrong)
    spec_module = src / "icelog" / "table" / "layout.py"
    spec_module.write_text(spec_module.read_text() + "\nif False:\n    import pyspark  # noqa\n")
    result = run_lint(src, tmp_path / "cache")
    assert result.returncode != 0
    assert "icelog.log.pressure -> icelog.wire.server" in result.stdout
    assert "icelog.table.layout -> pyspark" in result.stdout
