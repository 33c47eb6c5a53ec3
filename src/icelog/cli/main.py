"""`icelog serve | topic ... | user ... | status`: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError

from icelog.config import IntakeSettings, Settings, load_settings
from icelog.errors import ConfigError, IcelogError


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(
        args.config, listen=getattr(args, "listen", None), data_dir=getattr(args, "data_dir", None),
        registry_listen=getattr(args, "registry_listen", None), metrics_listen=getattr(args, "metrics_listen", None),
    )
    intake_url = getattr(args, "intake_url", None)
    if intake_url is not None:  # over the file and ICELOG_INTAKE__URL, checked as they are
        intake = settings.intake.model_dump()
        intake["url"] = intake_url
        try:
            settings.intake = IntakeSettings(**intake)
        except ValidationError as exc:
            raise ConfigError(f"--intake-url: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    return settings


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the broker's event loop: uvloop's (libuv; ~15-20 % less broker CPU per produced byte than asyncio's
    own loop in bench/broker_bench.py), or asyncio's where uvloop does not exist (Windows)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def cmd_serve(args: argparse.Namespace) -> int:
    from icelog.allocator import keep_large_buffers
    from icelog.broker import Broker
    from icelog.cli.memory_trace import start_from_env

    settings = _settings(args)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    keep_large_buffers(settings.memory.arena_max)
    start_from_env()  # ICELOG_TRACEMALLOC: a debugging aid (where memory grows)
    run_event_loop(Broker(settings).run())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="icelog", description="Kafka-compatible storage whose history is Iceberg")
    parser.add_argument("--config", help="YAML config file (default ./icelog.yaml if present, or $ICELOG_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the broker")
    serve.add_argument("--listen", help="HOST:PORT of the Kafka listener (default localhost:9092)")
    serve.add_argument("--data-dir", help="where all state lives (default ./icelog-data)")
    serve.add_argument("--intake-url", help="s3://BUCKET/PREFIX: the intake in object storage (default: the data dir)")
    serve.add_argument(
        "--registry-listen", help="HOST:PORT of the embedded schema registry (default localhost:8081; off: none)"
    )
    serve.add_argument(
        "--metrics-listen", help="HOST:PORT of /metrics, /healthz and /readyz (default localhost:9644; off: none)"
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    from icelog.cli import acl, archive, maintain, sql, status, topic

    topic.add_parser(sub)
    from icelog.cli import group

    group.add_parser(sub)
    status.add_parser(sub)
    archive.add_parser(sub)
    maintain.add_parser(sub)
    sql.add_parser(sub)
    acl.add_parser(sub)
    from icelog.cli import user

    user.add_parser(sub)
    from icelog.cli import sink

    sink.add_parser(sub)
    from icelog.cli import replay

    replay.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that has gone (`| head`) is met below
        return code
    except IcelogError as exc:
        print(f"icelog: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `icelog topic list | head`: the reader has gone, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
