"""`icelog sink [--once] [--name NAME]`: archive topics of external Kafka clusters into icelog's tables."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import TYPE_CHECKING

from icelog.cli.archive import archiver_settings, stop_on_signals

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
    sink.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # set by `icelog serve`
    sink.set_defaults(func=cmd_sink)


def cmd_sink(args: argparse.Namespace) -> int:
    from icelog.archive.service import lower_priority
    from icelog.lake.spark import create_session
    from icelog.sink.service import SinkService, selected

    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = archiver_settings(args)
    names = selected(settings, args.names)
    services: list[SinkService] = []
    spark: SparkSession | None = None
    try:
        for name in names:
            services.append(SinkService(settings, name))
            services[-1].acquire(wait_s=0 if args.once else 30)
        lower_priority(settings.archive.nice)
        # One Spark session for every sink (each sink's archiver runs its passes on it).
        spark = create_session(services[0].settings, "icelog-sink")
        for service in services:
            service.attach(spark)
        if args.once:
            return max(service.run_once() for service in services)
        stop = threading.Event()
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
