"""`icelog sink [--once] [--name NAME]`: archive topics of external Kafka clusters into icelog's tables."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import TYPE_CHECKING

from icelog.cli.archive import archiver_settings, lock_place, parent_alive, stop_on_signals
from icelog.errors import IcelogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sink = sub.add_parser("sink", help="archive topics of external Kafka clusters (icelog.yaml's sinks)")
    sink.add_argument("--once", action="store_true",
                      help="one pass of each sink that archives every committed record, then exit (cron-style)")
    sink.add_argument("--name", action="append", dest="names", metavar="NAME",
                      help="run only this sink (repeatable; default: every configured sink)")
    sink.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file (the one with `sinks:`)")
    sink.add_argument("--data-dir", help="icelog's data directory (default ./icelog-data); the sinks' state is "
                                         "under <data_dir>/sinks/")
    sink.add_argument("--spark-master", help="spark.master (default from config: local[N], half the cores)")
    sink.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sink.add_argument("--standby", action="store_true", help=(
        "continuous: while another process runs a sink, stand by (no Spark started) and take it over once it lets "
        "go; without it, give up after 30 s. `icelog serve`'s sinks always stand by"))
    sink.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # set by `icelog serve`: stands by
    sink.set_defaults(func=cmd_sink)


def cmd_sink(args: argparse.Namespace) -> int:
    from icelog.archive.service import lower_priority
    from icelog.lake.spark import create_session
    from icelog.sink.service import SinkService, selected

    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.standby and args.once:
        raise IcelogError("--standby is for continuous sinks (--once gives up at once if another process runs one)")
    settings = archiver_settings(args)
    names = selected(settings, args.names)
    services: list[SinkService] = []
    spark: SparkSession | None = None
    stop = threading.Event()
    standby = not args.once and (args.standby or args.parent_pid is not None)
    if standby:  # (before Spark: a standby has none; its handler is set again once Spark has taken SIGINT)
        stop_on_signals(stop)
    try:
        for name in names:  # (every process takes the locks in the same order: no two wait for each other)
            services.append(SinkService(settings, name))
            if not standby:
                services[-1].acquire(wait_s=0 if args.once else 30)
            elif not services[-1].lock.stand_by(stop, lambda: parent_alive(args.parent_pid),
                                                where=lock_place(settings, services[-1].lock.name)):
                return 0  # stopped, or its broker is gone, while standing by
        lower_priority(settings.archive.nice, relative=True)
        # One Spark session for every sink (each sink's archiver runs its passes on it).
        spark = create_session(services[0].settings, "icelog-sink")
        for service in services:
            service.attach(spark)
        if args.once:
            return max(service.run_once() for service in services)
        stop_on_signals(stop)
        for service in services:
            service.service.stop_event = stop
            service.watch()
        threads = [threading.Thread(target=s.service.run_forever, args=(args.parent_pid,), name=f"sink-{s.name}",
                                    daemon=True) for s in services]
        for thread in threads:
            thread.start()
        while not stop.wait(1.0):
            if args.parent_pid is not None and os.getppid() != args.parent_pid:
                break
            if not all(t.is_alive() for t in threads):  # a sink's Spark driver died: exit so serve restarts us
                stop.set()
                return 3
        return 0
    finally:
        for service in services:
            service.close()
        if spark is not None:
            spark.stop()
