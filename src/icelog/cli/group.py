"""`icelog group list|describe`: consumer groups, their members and lag, through the Kafka admin API."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from icelog.cli.topic import bootstrap_after_action
from icelog.errors import IcelogError

if TYPE_CHECKING:
    from kafka import KafkaAdminClient


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("group", help="list and describe consumer groups on a running broker")
    group.add_argument("--bootstrap", help="broker HOST:PORT (default: the configured listen address)")
    after = bootstrap_after_action()
    actions = group.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="list consumer groups and their states", parents=[after]).set_defaults(
        func=cmd_list)
    describe = actions.add_parser("describe", help="members, committed offsets and lag of a group", parents=[after])
    describe.add_argument("group_id")
    describe.set_defaults(func=cmd_describe)


def _admin(args: argparse.Namespace) -> KafkaAdminClient:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from icelog.config import load_settings

    bootstrap = args.bootstrap or load_settings(args.config).listen
    try:
        return KafkaAdminClient(bootstrap_servers=bootstrap, client_id="icelog-cli", request_timeout_ms=15000)
    except KafkaError as exc:
        raise IcelogError(f"no broker answers at {bootstrap} ({exc}); start one or pass --bootstrap") from exc


def cmd_list(args: argparse.Namespace) -> int:
    from kafka.errors import KafkaError

    admin = _admin(args)
    try:
        groups = admin.list_groups()
    except KafkaError as exc:
        raise IcelogError(str(exc)) from exc
    finally:
        admin.close()
    for group in sorted(groups, key=lambda g: g["group_id"]):
        print(f"{group['group_id']}\t{group.get('group_state') or ''}\t{group.get('protocol_type') or ''}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from kafka.admin import OffsetSpec
    from kafka.errors import KafkaError

    admin = _admin(args)
    try:
        described = admin.describe_groups([args.group_id])[args.group_id]
        committed = admin.list_group_offsets(args.group_id)[args.group_id]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in committed}) if committed else {}
    except KafkaError as exc:
        raise IcelogError(str(exc)) from exc
    finally:
        admin.close()
    if described.get("group_state") == "Dead" and not committed:
        raise IcelogError(f"group {args.group_id!r} does not exist")
    print(
        f"group {args.group_id}  state {described.get('group_state')}  "
        f"protocol {described.get('protocol_data') or '-'}  members {len(described.get('members', []))}"
    )
    for member in described.get("members", []):
        print(f"  member {member['member_id']}  client {member['client_id']}  host {member['client_host']}")
    print(f"  {'TOPIC':<30} {'PARTITION':>9} {'COMMITTED':>12} {'END':>12} {'LAG':>10}")
    total = 0
    for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
        end = ends[tp].offset if tp in ends else -1
        lag = max(end - committed[tp].offset, 0) if end >= 0 and committed[tp].offset >= 0 else 0
        total += lag
        print(f"  {tp.topic:<30} {tp.partition:>9} {committed[tp].offset:>12} {end:>12} {lag:>10}")
    print(f"  total lag {total}")
    return 0
