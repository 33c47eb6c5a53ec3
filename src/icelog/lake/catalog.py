"""Iceberg catalog configuration: the Spark conf for JDBC (SQLite, PostgreSQL), REST and Hadoop catalogs."""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from icelog.config import Settings
from icelog.errors import ConfigError
from icelog.lake import warehouse

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

# Iceberg's JdbcCatalog tables, schema V1 (JdbcUtil.V0_CREATE_CATALOG_SQL + V1_UPDATE_CATALOG_SQL and
# CREATE_NAMESPACE_PROPERTIES_TABLE_SQL of Iceberg 1.10), created by icelog for the embedded SQLite catalog.
SQLITE_CATALOG_TABLES = (
    "CREATE TABLE IF NOT EXISTS iceberg_tables(catalog_name VARCHAR(255) NOT NULL,"
    "table_namespace VARCHAR(255) NOT NULL,table_name VARCHAR(255) NOT NULL,metadata_location VARCHAR(1000),"
    "previous_metadata_location VARCHAR(1000),iceberg_type VARCHAR(5),"
    "PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties(catalog_name VARCHAR(255) NOT NULL,"
    "namespace VARCHAR(255) NOT NULL,property_key VARCHAR(255),property_value VARCHAR(1000),"
    "PRIMARY KEY (catalog_name, namespace, property_key))",
)

# Debian's JDBC driver jars (libxerial-sqlite-jdbc-java, libpostgresql-jdbc-java), installed by scripts/setup.sh.
JDBC_DRIVER_JARS = {
    "jdbc:sqlite:": Path("/usr/share/java/sqlite-jdbc.jar"),
    "jdbc:postgresql:": Path("/usr/share/java/postgresql.jar"),
}
# Where the set-up puts the jars of jars/pom.xml (from Maven Central): this directory, else <venv>/jars.
JARS_DIR_ENV = "ICELOG_JARS_DIR"
ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12"


def jars_dir() -> Path:
    """The directory of the JVM jars scripts/fetch-jars.sh fetched: $ICELOG_JARS_DIR, else `jars` in the
    virtualenv (or Python installation) icelog runs from."""
    return Path(os.environ.get(JARS_DIR_ENV) or Path(sys.prefix) / "jars")


def iceberg_runtime_jar() -> Path:
    """The Iceberg Spark runtime jar (Maven Central's org.apache.iceberg:iceberg-spark-runtime-3.5_2.12, the
    version jars/pom.xml names), fetched by the set-up: never downloaded here."""
    jars = jars_dir()
    found = sorted(jars.glob(f"{ICEBERG_RUNTIME}-*.jar"))
    if len(found) > 1:  # which one Spark loads must not depend on a directory listing
        raise ConfigError(f"several {ICEBERG_RUNTIME} jars in {jars}: {', '.join(j.name for j in found)}; keep one")
    if not found:
        raise ConfigError(
            f"no {ICEBERG_RUNTIME} jar in {jars}: run `make setup`, or scripts/fetch-jars.sh {jars} "
            f"(or set {JARS_DIR_ENV} to the directory that holds it)"
        )
    return found[0]


def catalog_jars(settings: Settings) -> list[Path]:
    """Jars Spark needs for the configured catalog: the Iceberg runtime, a JDBC driver if any, S3A for a warehouse
    on object storage."""
    jars = [iceberg_runtime_jar()]
    warehouse.check_warehouse(settings.warehouse)
    if warehouse.on_object_storage(settings.warehouse):
        jars.extend(warehouse.s3a_jars(jars_dir()))
    if settings.archive.catalog_type == "jdbc":
        uri = settings.catalog_uri
        for prefix, jar in JDBC_DRIVER_JARS.items():
            if uri.startswith(prefix):
                if not jar.exists():
                    raise ConfigError(f"{uri} needs the JDBC driver {jar}; run scripts/setup.sh")
                jars.append(jar)
    return jars


def catalog_spark_conf(settings: Settings) -> dict[str, str]:
    """spark.sql.catalog.<name>.* entries for the configured Iceberg catalog."""
    archive = settings.archive
    prefix = f"spark.sql.catalog.{archive.catalog_name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.warehouse": settings.warehouse,
        # Other processes (the archiver, `icelog sql`, pyiceberg) commit to the same tables: never serve a
        # cached, stale table version.
        f"{prefix}.cache-enabled": "false",
    }
    if archive.catalog_type == "jdbc":
        uri = settings.catalog_uri
        if not uri.startswith("jdbc:"):
            raise ConfigError(f"archive.catalog_uri {uri!r}: a jdbc catalog needs a jdbc:... URI")
        conf.update({f"{prefix}.type": "jdbc", f"{prefix}.uri": uri, f"{prefix}.jdbc.schema-version": "V1"})
        if uri.startswith("jdbc:sqlite:"):
            prepare_sqlite_catalog(Path(uri.removeprefix("jdbc:sqlite:")))
            # Several connections (Iceberg's client pool, `icelog sql`, pyiceberg) share the file: in WAL
            # mode readers never block a commit, and a busy writer waits instead of failing at once.
            conf[f"{prefix}.jdbc.journal_mode"] = "WAL"
            conf[f"{prefix}.jdbc.busy_timeout"] = "10000"
            # The tables exist (prepare_sqlite_catalog): Iceberg's own check for them leaves a
            # DatabaseMetaData.getTables ResultSet open on a pooled connection, which in WAL mode pins that
            # connection to a read snapshot for good; it then never sees another process's commits.
            conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
    elif archive.catalog_type == "rest":
        if not archive.catalog_uri:
            raise ConfigError("archive.catalog_type rest needs archive.catalog_uri (http(s)://HOST:PORT/...)")
        conf.update({f"{prefix}.type": "rest", f"{prefix}.uri": archive.catalog_uri})
    else:  # hadoop: the warehouse directory is the catalog
        conf[f"{prefix}.type"] = "hadoop"
    for key, value in archive.catalog_properties.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def prepare_sqlite_catalog(path: Path) -> None:
    """Create the embedded catalog's database and Iceberg's catalog tables (idempotent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path, timeout=30) as db:
        db.execute("PRAGMA journal_mode=WAL")
        for statement in SQLITE_CATALOG_TABLES:
            db.execute(statement)
    db.close()


def sqlite_catalog_path(settings: Settings) -> Path | None:
    """The SQLite file of the embedded JDBC catalog, or None for any other catalog."""
    uri = settings.catalog_uri
    if settings.archive.catalog_type == "jdbc" and uri.startswith("jdbc:sqlite:"):
        return Path(uri.removeprefix("jdbc:sqlite:"))
    return None


def sqlite_metadata_locations(path: Path, catalog_name: str) -> dict[tuple[str, str], str]:
    """Every table's current metadata file in the embedded JDBC catalog ((namespace, name) → location), in one
    read-only query ({} while the catalog does not exist): how a reader notices a commit without loading tables."""
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables WHERE catalog_name = ? "
            "AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
            (catalog_name,),
        ).fetchall()
    finally:
        db.close()
    return {(namespace, name): location for namespace, name, location in rows if location}


def masked_url(url: str) -> str:
    """A catalog URL for a message: its password (in the authority or a `password=` parameter) replaced by ***."""
    url = re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)
    return re.sub(r"(?i)(password=)[^&;]*", r"\1***", url)


def postgres_catalog_url(settings: Settings) -> str | None:
    """SQLAlchemy's URL (postgresql+psycopg://) of a JDBC catalog on PostgreSQL, or None for any other catalog.

    The user and password come from the JDBC URL's `user` / `password` parameters or, as Iceberg's JDBC catalog
    takes them, from `archive.catalog_properties` `jdbc.user` / `jdbc.password` (which win)."""
    uri = settings.catalog_uri
    if settings.archive.catalog_type != "jdbc" or not uri.startswith("jdbc:postgresql:"):
        return None
    parsed = urlsplit(uri.removeprefix("jdbc:"))
    params = dict(parse_qsl(parsed.query))
    props = settings.archive.catalog_properties
    user = props.get("jdbc.user", params.pop("user", ""))
    password = props.get("jdbc.password", params.pop("password", ""))
    auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@" if user else ""
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql+psycopg://{auth}{parsed.hostname or 'localhost'}:{parsed.port or 5432}{parsed.path}{query}"


def pyiceberg_catalog_opener(settings: Settings) -> Callable[[], Catalog | None] | None:
    """A function opening pyiceberg onto the archiver's catalog (it returns None while the embedded one does not
    exist yet), or None for a catalog pyiceberg cannot open as Spark does (Hadoop).

    The JDBC catalog on SQLite or PostgreSQL (pyiceberg's SqlCatalog reads the same `iceberg_tables` rows) and
    REST qualify. Used by the broker's read-back and by `icelog status --tables`.
    """
    archive = settings.archive
    io = warehouse.io_properties(settings)  # how its FileIO reaches the tables' files (a bucket's endpoint)
    path = sqlite_catalog_path(settings)
    if path is not None:

        def open_sqlite() -> Catalog | None:
            # Only once the archiver created the file and Iceberg's V1 tables (prepare_sqlite_catalog):
            # pyiceberg would otherwise create its own tables first.
            if not path.exists():
                return None
            from pyiceberg.catalog.sql import SqlCatalog

            return SqlCatalog(archive.catalog_name, uri=f"sqlite:///{path}", warehouse=settings.warehouse, **io)

        return open_sqlite
    postgres = postgres_catalog_url(settings)
    if postgres is not None:

        def open_postgres() -> Catalog | None:
            from pyiceberg.catalog.sql import SqlCatalog

            # pyiceberg's SQL catalog keeps the same `iceberg_tables` rows as Iceberg's JDBC catalog (schema V1)
            return SqlCatalog(archive.catalog_name, uri=postgres, warehouse=settings.warehouse, **io)

        return open_postgres
    if archive.catalog_type == "rest" and archive.catalog_uri:
        uri = archive.catalog_uri

        def open_rest() -> Catalog | None:
            from pyiceberg.catalog.rest import RestCatalog

            return RestCatalog(archive.catalog_name, uri=uri, warehouse=settings.warehouse, **io)

        return open_rest
    return None
