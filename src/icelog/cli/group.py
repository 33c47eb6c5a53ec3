"""`icelog group list|describe`: consumer groups (classic and KIP-848), their members and lag, through the Kafka admin
API."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

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


def _bootstrap(args: argparse.Namespace) -> str:
    from icelog.config import load_settings

    return str(args.bootstrap or load_settings(args.config).listen)


def _admin(args: argparse.Namespace) -> KafkaAdminClient:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    bootstrap = _bootstrap(args)
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
        print(f"{group['group_id']}\t{group.get('group_state') or ''}\t{group.get('protocol_type') or ''}\t"
              f"{group.get('group_type') or 'classic'}")
    return 0


def _consumer_group(bootstrap: str, group_id: str) -> Any | None:
    """ConsumerGroupDescribe of a KIP-848 group (None for a classic or unknown group, which DescribeGroups covers),
    asked of the broker `bootstrap` names: an icelog broker coordinates every group."""
    from icelog.client.connection import BrokerConnection
    from icelog.client.properties import ClientProperties
    from icelog.wire.messages import ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse

    connection = BrokerConnection(bootstrap, ClientProperties(client_id="icelog-cli"))
    try:
        response = connection.request(
            ConsumerGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=False), 0,
            ConsumerGroupDescribeResponse,
        )
    finally:
        connection.close()
    group = response.groups[0]
    return group if group.error_code == 0 else None


def _partitions(assignment: Any) -> str:
    return " ".join(f"{t.topic_name}:{','.join(map(str, t.partitions))}" for t in assignment.topic_partitions) or "-"


def _print_members(described: dict[str, Any], consumer: Any | None, group_id: str) -> None:
    if consumer is not None:
        print(f"group {group_id}  type consumer  state {consumer.group_state}  assignor {consumer.assignor_name}  "
              f"epoch {consumer.group_epoch}  members {len(consumer.members)}")
        for m in consumer.members:
            instance = f"  instance {m.instance_id}" if m.instance_id else ""
            print(f"  member {m.member_id}  epoch {m.member_epoch}{instance}  client {m.client_id}  host "
                  f"{m.client_host}  partitions {_partitions(m.assignment)}")
        return
    print(
        f"group {group_id}  type classic  state {described.get('group_state')}  "
        f"protocol {described.get('protocol_data') or '-'}  members {len(described.get('members', []))}"
    )
    for member in described.get("members", []):
        print(f"  member {member['member_id']}  client {member['client_id']}  host {member['client_host']}")


def cmd_describe(args: argparse.Namespace) -> int:
    from kafka.admin import OffsetSpec
    from kafka.errors import KafkaError

    admin = _admin(args)
    bootstrap = _bootstrap(args)
    try:
        described = admin.describe_groups([args.group_id])[args.group_id]
        # A KIP-848 group is Dead to DescribeGroups, as in Kafka: ConsumerGroupDescribe tells its members.
        consumer = _consumer_group(bootstrap, args.group_id) if described.get("group_state") == "Dead" else None
        committed = admin.list_group_offsets(args.group_id)[args.group_id]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in committed}) if committed else {}
    except KafkaError as exc:
        raise IcelogError(str(exc)) from exc
    finally:
        admin.close()
    if described.get("group_state") == "Dead" and consumer is None and not committed:
        raise IcelogError(f"group {args.group_id!r} does not exist")
    _print_members(described, consumer, args.group_id)
    print(f"  {'TOPIC':<30} {'PARTITION':>9} {'COMMITTED':>12} {'END':>12} {'LAG':>10}")
    total = 0
    for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
        end = ends[tp].offset if tp in ends else -1
        lag = max(end - committed[tp].offset, 0) if end >= 0 and committed[tp].offset >= 0 else 0
        total += lag
        print(f"  {tp.topic:<30} {tp.partition:>9} {committed[tp].offset:>12} {end:>12} {lag:>10}")
    print(f"  total lag {total}")
    return 0
