"""`icelog replay --table NS.TABLE --to-topic NAME`: an archive table's records produced into a topic."""

from __future__ import annotations

import argparse
import logging

from icelog.config import load_settings
from icelog.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay", help="produce an archive table's records (as of a snapshot) into a topic, exactly once",
        description="Produce the records of an archive table (record layout) into a topic: each key's records in "
                    "their order, keys placed by Kafka's default partitioner, bytes and timestamps as archived. "
                    "Interrupted, the same command resumes it.")
    replay.add_argument("--table", required=True, metavar="NAMESPACE.TABLE", help="e.g. icelog.orders")
    replay.add_argument("--to-topic", required=True, metavar="NAME", help="created if missing")
    replay.add_argument("--partitions", type=int, metavar="N",
                        help="partitions of the topic if it is created (default: the source topic's)")
    replay.add_argument("--topic-config", dest="configs", action="append", default=[], metavar="KEY=VALUE",
                        help="a config of the topic if it is created (repeatable), e.g. "
                             "icelog.archive.iceberg.table=icelog.orders_restored")
    replay.add_argument("--snapshot", type=int, metavar="ID", help="replay the table as of this snapshot")
    replay.add_argument("--as-of", type=int, metavar="TIMESTAMP_MS",
                        help="replay the table as of the snapshot current at this time (ms since the epoch)")
    replay.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="the broker to produce to (default: archive.bootstrap_servers, else the listen address)")
    replay.add_argument("--client-property", action="append", default=[], metavar="KEY=VALUE", dest="properties",
                        help="a librdkafka client setting (security.protocol, sasl.*, ssl.*), over "
                             "archive.client_properties; repeatable")
    replay.add_argument("--data-dir", help="the broker's data directory, whose catalog holds the table "
                                           "(default ./icelog-data)")
    replay.add_argument("--transaction-records", type=int, default=None, help=argparse.SUPPRESS)
    replay.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from icelog.replay.producer import DEFAULT_TRANSACTION_RECORDS
    from icelog.replay.run import ReplayRequest, replay

    logging.basicConfig(level=logging.WARNING)
    properties = _pairs("--client-property", args.properties)
    configs = _pairs("--topic-config", args.configs)
    if args.snapshot is not None and args.as_of is not None:  # refused before anything is opened
        raise ConfigError("--snapshot and --as-of both name a snapshot: pass one of them")
    settings = load_settings(args.config, data_dir=args.data_dir)
    bootstrap = args.bootstrap or ",".join(settings.archive_bootstrap)
    request = ReplayRequest(
        args.table, args.to_topic, args.partitions, args.snapshot, args.as_of, bootstrap,
        {**settings.archive.client_properties, **properties},
        args.transaction_records or DEFAULT_TRANSACTION_RECORDS, configs,
    )
    outcome = replay(settings, request)
    if outcome.already_done:
        print(f"topic {args.to_topic} already holds the replay of {args.table} at snapshot {outcome.snapshot_id} "
              f"({outcome.records} records): nothing to do")
        return 0
    print(f"replayed {outcome.records} records of {args.table} (snapshot {outcome.snapshot_id}) into "
          f"{args.to_topic} ({outcome.partitions} partitions); {outcome.produced} produced by this run")
    return 0


def _pairs(option: str, pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out
