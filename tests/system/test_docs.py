"""The manual cannot rot: the site builds with --strict, and every piece of code it names exists; BENCHMARKS.md
holds short cells.

`mkdocs build --strict` fails on a link between pages that points nowhere, an anchor that is gone, or a link to
code that was moved (scripts/mkdocs_code_links.py). The pages, README.md and BENCHMARKS.md also name code in
prose (`src/icelog/lake/iceberg_java.py`, `tests/archive/test_pk_tables.py`, `archive/upsert.py` relative to the
package); each such path must exist in the tree, so a move that forgets the docs fails here.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "icelog"
MKDOCS = Path(sys.executable).parent / "mkdocs"
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

# A path from the repository root (src/icelog/x.py, tests/test_x.py, bench/x.py, scripts/x.sh), or one relative to
# the package (archive/upsert.py, schema/codec/{rebuild,proto_decode}.py, wire/handlers/*) as architecture.md
# writes them. Braces list alternatives, * is a glob.
_PATH_CHARS = r"[\w./*{},-]*[\w*}]"
ROOT_PATH = re.compile(rf"(?<![\w.<>-])((?:src/icelog|tests|bench|scripts)/{_PATH_CHARS})")
PACKAGE_PATH = re.compile(
    rf"(?<![\w./<>-])((?:{'|'.join(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != '__pycache__')})"
    rf"/{_PATH_CHARS})"
)
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def expand(path: str) -> list[str]:
    """`a/{b,c}.py` → `a/b.py`, `a/c.py`."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(chosen) for chosen in itertools.product(*choices)]


def exists(base: Path, path: str) -> bool:
    path = path.rstrip(".,")  # the end of a sentence
    return any(
        any(base.glob(each)) if "*" in each else (base / each).exists()
        for each in expand(path)
    )


def named_paths(text: str) -> list[tuple[Path, str]]:
    package_relative = [(PACKAGE, m) for m in PACKAGE_PATH.findall(text) if m.endswith((".py", ".c", "*"))]
    return [(ROOT, m) for m in ROOT_PATH.findall(text)] + package_relative


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    # The deletion-vector writer is reachable from the site: page → the module that writes the DVs.
    page = (tmp_path / "site" / "primary-key-tables" / "index.html").read_text()
    assert 'href="../src/icelog/lake/iceberg_java.py"' in page
    assert (tmp_path / "site" / "src" / "icelog" / "lake" / "iceberg_java.py").is_file()


def test_every_code_path_the_docs_name_exists() -> None:
    missing = []
    for page in PAGES:
        for base, path in named_paths(page.read_text()):
            if not exists(base, path):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "the docs name code that is not in the tree:\n" + "\n".join(missing)


def test_the_check_sees_the_paths_it_should() -> None:
    # The patterns above are what keeps the docs honest; a pattern that matched nothing would pass every tree.
    text = "see `src/icelog/archive/upsert.py`, [x](../tests/archive/test_pk_tables.py), `archive/pk_index.py`, " \
           "`schema/codec/{rebuild,nowhere}.py`, `wire/handlers/*`, key/value, `bench/results/<name>`"
    assert sorted(p for _, p in named_paths(text)) == sorted([
        "src/icelog/archive/upsert.py", "tests/archive/test_pk_tables.py", "bench/results", "archive/pk_index.py",
        "schema/codec/{rebuild,nowhere}.py", "wire/handlers/*",
    ])
    assert exists(PACKAGE, "schema/codec/{rebuild,nowhere}.py")  # one alternative is enough
    assert not exists(ROOT, "src/icelog/archive/nowhere.py")


def test_links_outside_the_site_resolve() -> None:
    # README.md and BENCHMARKS.md are not pages of the site, so mkdocs does not check their links.
    missing = []
    for page in (ROOT / "README.md", ROOT / "BENCHMARKS.md"):
        for target in LINK.findall(page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, "links to nothing:\n" + "\n".join(missing)


BENCHMARK_CELL_MAX = 200


def test_benchmarks_md_holds_short_current_figures() -> None:
    # A row holds the current figure, its baseline, ratio, target, date and commit; what explains a figure goes to
    # docs/benchmarks.md and earlier runs to git, so no cell grows into a changelog.
    long_cells = [
        f"line {number}: {len(cell)} characters: {cell[:80]}…"
        for number, line in enumerate((ROOT / "BENCHMARKS.md").read_text().splitlines(), start=1)
        if line.startswith("|")
        for cell in (c.strip() for c in line.strip().strip("|").split("|"))
        if len(cell) > BENCHMARK_CELL_MAX
    ]
    assert not long_cells, f"BENCHMARKS.md cells over {BENCHMARK_CELL_MAX} characters:\n" + "\n".join(long_cells)


def test_compatibility_page_lists_every_advertised_api_version() -> None:
    """docs/compatibility.md's "APIs served" table is what ApiVersions advertises, API by API, range by range."""
    from kafka.protocol.api_key import ApiKey

    from icelog.wire.versions import SUPPORTED_VERSIONS

    section = (ROOT / "docs" / "compatibility.md").read_text().split("## APIs served", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+)–(\d+) \|", section, re.MULTILINE)
    documented = {int(key): (name, int(low), int(high)) for name, key, low, high in rows}
    advertised = {int(key): (ApiKey(key).name, low, high) for key, (low, high) in SUPPORTED_VERSIONS.items()}
    assert documented == advertised
