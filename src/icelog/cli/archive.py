"""`icelog archive [--once]`: archive topics into Iceberg tables with Spark (continuously, or one pass)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Collection, Iterable
from pathlib import Path

from icelog.config import Settings, load_settings
from icelog.errors import IcelogError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    archive = sub.add_parser("archive", help="archive topics into Iceberg tables (a Spark job)")
    archive.add_argument(
        "--once",
        action="store_true",
        help="one pass that archives every committed record, then exit (cron-style)",
    )
    archive.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="NAME",
        help="with --once: archive only this topic (repeatable)",
    )
    archive.add_argument("--data-dir", help=(
        "the broker's data directory (default ./icelog-data); with meta_url in PostgreSQL and archive.read_via "
        "kafka, a directory of this archiver's own"))
    archive.add_argument("--spark-master", help="spark.master (default from config: local[N], half the cores)")
    archive.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    archive.add_argument("--standby", action="store_true", help=(
        "continuous: while another archiver holds the metadata store's archiver lock, stand by (no Spark started) "
        "and take over once it lets go; without it, give up after 30 s. `icelog serve`'s archiver always stands by"))
    archive.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # set by `icelog serve`: stands by
    archive.set_defaults(func=cmd_archive)


def archiver_settings(args: argparse.Namespace) -> Settings:
    from icelog.config import SETTINGS_ENV

    inherited = os.environ.get(SETTINGS_ENV)
    if inherited:  # started by `icelog serve`: exactly the broker's settings
        settings = Settings.model_validate_json(inherited)
    else:
        settings = load_settings(args.config, data_dir=args.data_dir)
    if args.spark_master:
        settings.archive.spark_master = args.spark_master
    return settings


def require_metadata(settings: Settings) -> None:
    """Refuse a data directory that holds no icelog data (rather than create an empty metadata store there)."""
    if settings.meta_url is None and not (settings.data_dir / "meta.db").exists():
        raise IcelogError(f"no icelog data in {settings.data_dir} (no meta.db); pass the broker's --data-dir")


def refuse_unknown_topics(asked: Iterable[str], known: Collection[str]) -> None:
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise IcelogError(f"no topic {', '.join(unknown)}; `icelog topic list` shows the topics")


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`, from a thread of their own: a handler runs on the main thread between two
    bytecodes, possibly while that thread holds the event's own lock inside `stop.wait()`; setting it there
    deadlocks (the service then ignores every later signal)."""
    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def lock_place(settings: Settings, name: str = "archiver.lock") -> str:
    """Where the store's lock `name` lives, for a standby's log line (no password)."""
    url = settings.metadata_url
    if url.startswith(("postgresql://", "postgres://")):
        from icelog.meta.postgres.database import server_of

        return f"a PostgreSQL advisory lock in {server_of(url)}"
    path = Path(url.removeprefix("sqlite:///")).parent / name
    try:
        holder = path.read_text().strip()  # (the holder writes its pid there: meta/sqlite/locks.py)
    except OSError:
        holder = ""
    return f"flock on {path}" + (f", pid {holder}" if holder.isdigit() else "")


def cmd_archive(args: argparse.Namespace) -> int:
    from icelog.archive.locks import ArchiverLock
    from icelog.archive.service import ArchiveService

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.topics and not args.once:
        raise IcelogError("--topic needs --once (the continuous archiver archives every topic)")
    if args.standby and args.once:
        raise IcelogError("--standby is for the continuous archiver (--once gives up at once if another one runs)")
    settings = archiver_settings(args)
    # A typo in a cron line (the data dir, a topic) must not archive nothing, silently, for ever.
    require_metadata(settings)
    from icelog.meta.backends import open_store

    store = open_store(settings.metadata_url)  # kept open for the lock: one archiver per metadata store
    lock = ArchiverLock(store)
    stop = threading.Event()
    try:
        if args.topics:
            refuse_unknown_topics(args.topics, {t.name for t in store.list_topics()})
        if args.once:
            lock.acquire(wait_s=0)
        elif args.standby or args.parent_pid is not None:
            # Another broker's archiver (or a dedicated one) archives the store: wait for its lock, with no JVM, for
            # as long as it holds it, rather than exit and be restarted every 30 s by the broker.
            stop_on_signals(stop)
            if not lock.stand_by(stop, lambda: parent_alive(args.parent_pid), where=lock_place(settings)):
                log.info("stopped while standing by" if stop.is_set() else
                         "the broker that started the archiver is gone; stopping")
                store.close()
                return 0
        else:
            lock.acquire(wait_s=30)
    except BaseException:
        store.close()
        raise
    service = ArchiveService(settings, stop_event=stop)
    try:
        if args.once:
            results = service.run_once(force=True, topics=args.topics)
            for result in results:
                status = f"failed: {result.error}" if result.error else f"{result.records} records"
                print(f"{result.topic}: {status}; next offsets {result.offsets}")
            return 1 if any(r.error for r in results) else 0
        stop_on_signals(service.stop_event)
        return 0 if service.run_forever(parent_pid=args.parent_pid) else 3
    finally:
        service.close()
        lock.release()
        store.close()


def parent_alive(parent_pid: int | None) -> bool:
    """Whether the broker that started this archiver (if one did) is still its parent."""
    return parent_pid is None or os.getppid() == parent_pid
