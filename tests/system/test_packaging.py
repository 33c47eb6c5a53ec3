"""Packaging: every import of src/icelog is a runtime dependency, and the wheel works without extras.

The fast tests read every import with `ast` (function-level ones too: the archiver imports pyspark, pyarrow
and the registry client inside functions) and map each third-party module to the distribution that ships it.
The slow test builds the wheel, installs it without extras into a clean venv (and the Iceberg jar from Maven with
scripts/fetch-jars.sh) and runs the broker and one archive pass from there, as a user who ran `pip install icelog`
would.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def normalize(name: str) -> str:
    """PEP 503 name normalization: `PyYAML` == `pyyaml`, `kafka_python` == `kafka-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"cannot read a distribution name from {requirement!r}"
    return normalize(match.group(1))


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def runtime_dependencies() -> set[str]:
    return {requirement_name(r) for r in project()["dependencies"]}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import that can run: anywhere but under `if TYPE_CHECKING:`.

    Imports with an ImportError fallback count too: aiokafka's compiled parser has a pure fallback that is
    5x slower, and a plain install must not get the slow path silently.
    """
    yield from _imports_in(list(ast.iter_child_nodes(tree)))


def _imports_in(nodes: list[ast.AST]) -> Iterator[tuple[int, str]]:
    for node in nodes:
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from _imports_in(node.orelse)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                yield node.lineno, node.module
        else:
            yield from _imports_in(list(ast.iter_child_nodes(node)))


def third_party_imports() -> dict[str, list[str]]:
    """Third-party module → the places (file:line) under src/icelog that import it at run time."""
    found: dict[str, list[str]] = {}
    for path in sorted((SRC / "icelog").rglob("*.py")):
        for line, module in runtime_imports(ast.parse(path.read_text(), str(path))):
            top = module.partition(".")[0]
            if top in sys.stdlib_module_names or top in ("icelog", "__future__"):
                continue
            found.setdefault(module, []).append(f"{path.relative_to(SRC)}:{line}")
    return found


def distributions_of(module: str, index: dict[str, list[str]]) -> set[str]:
    """The installed distributions that ship `module` (several share a namespace such as `google`)."""
    candidates = index.get(module.partition(".")[0], [])
    if len(candidates) <= 1:
        return {normalize(d) for d in candidates}
    prefix = module.replace(".", "/")
    shipping = set()
    for dist in candidates:
        files = importlib.metadata.distribution(dist).files or []
        if any(str(f).startswith((prefix + "/", prefix + ".")) for f in files):
            shipping.add(normalize(dist))
    return shipping


def test_every_runtime_import_is_a_runtime_dependency() -> None:
    # An import only in an extra (today: confluent_kafka in `dev`) gives `pip install icelog` an archiver
    # that fails every pass; `[project].dependencies` is what a plain install gets.
    dependencies = runtime_dependencies()
    index = importlib.metadata.packages_distributions()
    problems = []
    for module, places in sorted(third_party_imports().items()):
        dists = distributions_of(module, index)
        if not dists:
            problems.append(f"{module} ({', '.join(places)}): no installed distribution ships it")
        elif not dists & dependencies:
            problems.append(
                f"{module} ({', '.join(places)}) comes from {sorted(dists)}, which is not in [project].dependencies"
            )
    assert not problems, "add these to [project].dependencies in pyproject.toml (with a # why):\n" + "\n".join(
        problems
    )


def readme_dependency_rows() -> dict[str, set[str]]:
    """The manual's "Dependencies and why" table: package name → its rows' kinds (runtime, dev, Debian)."""
    text = (ROOT / "docs" / "dependencies.md").read_text()
    section = text.split("# Dependencies and why", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| package", "|---")):
            continue
        label = line.split("|")[1].strip()
        head = label.split("`")[0]
        kind = head.split(":")[0].strip() if ":" in head else "runtime"  # "dev: `pytest`, …", "Debian: …"
        for name in re.findall(r"`([^`]+)`", label):
            rows.setdefault(normalize(name.split("[")[0]), set()).add(kind)
    return rows


def test_readme_explains_every_dependency() -> None:
    # The README says why each dependency is there: it must list exactly [project].dependencies as runtime
    # packages, and every dev-only package.
    rows = readme_dependency_rows()
    documented = {name for name, kinds in rows.items() if "runtime" in kinds}
    dependencies = runtime_dependencies()
    missing = sorted(dependencies - documented)
    assert not missing, f"docs/dependencies.md's table does not explain {missing}"
    assert not documented - dependencies, (
        f"docs/dependencies.md's table lists {sorted(documented - dependencies)} as runtime dependencies, "
        "but pyproject.toml's [project].dependencies does not"
    )
    dev_only = {requirement_name(r) for r in project()["optional-dependencies"]["dev"]} - dependencies
    undocumented_dev = {name for name in dev_only if "dev" not in rows.get(name, set())}
    assert not undocumented_dev, f"docs/dependencies.md's table does not list dev packages {sorted(undocumented_dev)}"


# -- the wheel, installed without extras ------------------------------------------------------------------------

# Not copied into the wheel's build tree: VCS, virtualenvs (.venv is 1 GB), data and build output.
_NOT_SOURCE = {".git", ".venv", "icelog-data", "build", "dist", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _copy_source(dest: Path) -> Path:
    """The checkout as it is (uncommitted edits too), without build output, so building leaves it clean."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        if Path(directory) == ROOT:
            skip |= _NOT_SOURCE & set(names)
        return skip

    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def _clean_env() -> dict[str, str]:
    # PYTHONPATH=src (how developers run the tests) would make the venv import the checkout, not the wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env or _clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _InstalledBroker:
    """`<venv>/bin/icelog serve`: the broker as the wheel installs it (archiver off; the test runs one pass)."""

    def __init__(self, venv: Path, data_dir: Path) -> None:
        self.port, self.registry_port = _free_port(), _free_port()
        self.log_path = data_dir.parent / "broker.log"
        env = {**_clean_env(), "ICELOG_ARCHIVE__ENABLED": "false",
               "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{self.registry_port}",
               "ICELOG_METRICS_LISTEN": f"127.0.0.1:{_free_port()}"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [venv / "bin" / "icelog", "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", data_dir],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=data_dir.parent,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"broker exited {self.proc.returncode}:\n{self.log_path.read_text()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"broker did not listen within 60 s:\n{self.log_path.read_text()}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.slow
@pytest.mark.spark  # the archive pass of the installed wheel
def test_wheel_without_extras_serves_and_archives(tmp_path: Path) -> None:
    timings: dict[str, float] = {}

    def step(name: str, started: float) -> None:
        timings[name] = round(time.monotonic() - started, 1)

    # Build the wheel generically (pure or with compiled extensions) from a copy of the checkout.
    started = time.monotonic()
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, _copy_source(tmp_path / "src")],
         cwd=tmp_path, timeout=600)
    [wheel] = wheels.glob("icelog-*.whl")
    step("build wheel", started)

    # A clean venv (no system site-packages) gets the wheel and [project].dependencies, no extras.
    started = time.monotonic()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling all of pyspark costs about a minute; Python compiles what it imports anyway.
    _run([python, "-m", "pip", "install", "-q", "--no-compile", wheel], cwd=tmp_path, timeout=1200)
    # The Iceberg Spark runtime comes from Maven Central, not pip: the user's second step (docs/deployment.md),
    # from Maven's local repository that `make setup` filled (no network).
    _run([ROOT / "scripts" / "fetch-jars.sh", venv / "jars"], cwd=tmp_path, timeout=600)
    step("venv + install + jars", started)
    assert not (venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
                / "pytest").exists(), "the clean venv must not have the dev extra"

    # Every third-party module src/icelog imports (function-level ones too) resolves there, and so does every
    # icelog module; icelog comes from the wheel, not the checkout.
    started = time.monotonic()
    third_party = sorted(third_party_imports())
    ours = sorted(name for name in (
        ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for p in (SRC / "icelog").rglob("*.py")
    ) if name != "icelog.__main__")
    script = (
        "import importlib, sys, icelog\n"
        "failed = []\n"
        f"for m in {third_party + ours!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{m}: {type(exc).__name__}: {exc}')\n"
        "print(icelog.__file__)\n"
        "sys.exit('cannot import without extras:\\n' + '\\n'.join(failed) if failed else 0)\n"
    )
    where = _run([python, "-c", script], cwd=tmp_path, timeout=300)
    assert where.strip().startswith(str(venv)), f"icelog was imported from {where.strip()}, not the installed wheel"
    assert "serve" in _run([venv / "bin" / "icelog", "--help"], cwd=tmp_path, timeout=60)
    step("imports + --help", started)

    # The installed broker takes a topic archived to Iceberg and records from a real client.
    started = time.monotonic()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = _InstalledBroker(venv, data_dir)
    topic = "packaged"
    try:
        _run([venv / "bin" / "icelog", "topic", "--bootstrap", broker.bootstrap, "create", topic, "--partitions", "2",
              "--config", "icelog.archive.kind=iceberg"], cwd=tmp_path, timeout=60)
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        produced = []
        for i in range(20):
            key, value, headers = f"k{i}".encode(), f"value {i}".encode(), [("n", str(i).encode())]
            meta = producer.send(topic, key=key, value=value, headers=headers, partition=i % 2).get(timeout=30)
            produced.append((meta.partition, meta.offset, key, value, (("n", str(i).encode()),)))
        producer.close()
        step("serve + topic + produce", started)
    finally:
        broker.stop()

    # One archive pass with the installed CLI, from cron as it were: the broker is down (the archiver reads
    # the embedded registry's state from the metadata store, issue 8 point 3).
    started = time.monotonic()
    _run([venv / "bin" / "icelog", "archive", "--once", "--data-dir", data_dir, "--topic", topic],
         cwd=tmp_path, timeout=900, env=_clean_env())
    step("archive --once (broker down)", started)

    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir}/warehouse")
    rows = catalog.load_table(("icelog", topic)).scan().to_arrow().to_pylist()
    archived = sorted(
        (r["kafka"]["partition"], r["kafka"]["offset"], r["key"]["__raw__"], r["value"]["__raw__"],
         tuple((h["key"], h["value"]) for h in r["headers"]))
        for r in rows
    )
    assert archived == sorted(produced)
    print(f"packaging test timings (s): {timings}")
    shutil.rmtree(venv)  # about 1 GB; kept only when the test fails, for a look at what was installed
