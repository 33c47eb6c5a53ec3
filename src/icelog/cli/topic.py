"""`icelog topic create|list|describe|delete`: topic admin through the Kafka admin API of a running broker."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from icelog.errors import ConfigError, IcelogError

if TYPE_CHECKING:
    from kafka import KafkaAdminClient


def bootstrap_after_action() -> argparse.ArgumentParser:
    """A parent parser for an action: --bootstrap after it too (`icelog topic list --bootstrap X`); absent there,
    the one before the action stands."""
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--bootstrap", default=argparse.SUPPRESS, help="broker HOST:PORT")
    return after


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topic = sub.add_parser("topic", help="create, list, describe and delete topics on a running broker")
    topic.add_argument("--bootstrap", help="broker HOST:PORT (default: the configured listen address)")
    after = bootstrap_after_action()
    actions = topic.add_subparsers(dest="action", required=True)

    create = actions.add_parser("create", help="create a topic", parents=[after])
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--config", dest="configs", action="append", default=[], metavar="KEY=VALUE")
    create.set_defaults(func=cmd_create)

    actions.add_parser("list", help="list topics", parents=[after]).set_defaults(func=cmd_list)

    describe = actions.add_parser("describe", help="partitions and configs of a topic", parents=[after])
    describe.add_argument("name")
    describe.set_defaults(func=cmd_describe)

    delete = actions.add_parser("delete", help="delete a topic and its data", parents=[after])
    delete.add_argument("name")
    delete.set_defaults(func=cmd_delete)


def _admin(args: argparse.Namespace) -> KafkaAdminClient:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from icelog.config import load_settings

    bootstrap = args.bootstrap or load_settings(args.config).listen
    try:
        # kafka-python 3 has no NoBrokersAvailable: an unreachable broker is a KafkaTimeoutError after
        # bootstrap_timeout_ms (30 s by default, too long for a command line).
        return KafkaAdminClient(
            bootstrap_servers=bootstrap, client_id="icelog-cli", request_timeout_ms=15000,
            bootstrap_timeout_ms=5000,
        )
    except KafkaError:
        raise IcelogError(
            f"no broker answers at {bootstrap}; start one with `icelog serve` or pass --bootstrap"
        ) from None


def _parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--config expects KEY=VALUE, got {pair!r}")
        configs[key] = value
    return configs


def _raise_kafka(exc: Exception) -> None:
    # kafka-python's message embeds the whole request and response; keep the error and the broker's reason.
    reason = re.search(r"error_message=(['\"])(.*?)\1", str(exc))
    name = getattr(exc, "message", None) or type(exc).__name__
    raise IcelogError(f"{name}: {reason.group(2)}" if reason else str(exc)) from exc


def cmd_create(args: argparse.Namespace) -> int:
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

    configs = _parse_configs(args.configs)
    admin = _admin(args)
    try:
        admin.create_topics([NewTopic(args.name, args.partitions, 1, topic_configs=configs)])
    except KafkaError as exc:
        _raise_kafka(exc)
    finally:
        admin.close()
    print(f"created topic {args.name} with {args.partitions} partition(s)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    admin = _admin(args)
    try:
        for name in sorted(admin.list_topics()):
            print(name)
    finally:
        admin.close()
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import KafkaError

    admin = _admin(args)
    try:
        described = admin.describe_topics([args.name])
        # kafka-python 3 lists only non-default configs unless asked for all.
        resource = ConfigResource(ConfigResourceType.TOPIC, args.name)
        configs = admin.describe_configs([resource], config_filter="all")
    except KafkaError as exc:
        _raise_kafka(exc)
    finally:
        admin.close()
    for topic in described:
        if topic.get("error_code"):
            raise IcelogError(f"topic {args.name!r} does not exist")
        print(f"topic {topic['name']}  partitions {len(topic['partitions'])}")
    # kafka-python 3 answers {"topic": {name: {key: {"value": ..., "config_source": "DEFAULT_CONFIG", ...}}}}
    for key, entry in sorted(configs.get("topic", {}).get(args.name, {}).items()):
        default = " (default)" if entry.get("config_source") == "DEFAULT_CONFIG" else ""
        print(f"  {key}={entry['value']}{default}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from kafka.errors import KafkaError

    admin = _admin(args)
    try:
        admin.delete_topics([args.name])
    except KafkaError as exc:
        _raise_kafka(exc)
    finally:
        admin.close()
    print(f"deleted topic {args.name}")
    return 0
