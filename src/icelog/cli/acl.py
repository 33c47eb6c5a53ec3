"""`icelog acl add|list|remove`: Kafka ACLs in the metadata store, with kafka-acls.sh's flag names.

Works on the store directly, broker up or down (the first grants before the first start, or a broker that
refuses its admin): a running broker notices the store's security generation move and applies the change within
about a second. Bindings are checked as CreateAcls checks them (security/acl.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from enum import IntEnum
from typing import TYPE_CHECKING

from icelog.cli.archive import require_metadata
from icelog.config import load_settings
from icelog.errors import IcelogError
from icelog.meta.backends import open_store
from icelog.meta.security import AclEntry
from icelog.security.acl import (
    CLUSTER_NAME,
    AclFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ACLResourceType,
    InvalidAclError,
    validate_binding,
)

if TYPE_CHECKING:
    from icelog.meta.store import MetadataStore

# kafka-acls.sh's operation names (Read, IdempotentWrite, ...) by ACLOperation
OPERATIONS = {op.name.replace("_", "").lower(): op for op in ACLOperation if op.value > 1}
PATTERNS = {p.name.lower(): p for p in ACLResourcePatternType if p.value > 0}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acl = sub.add_parser("acl", help="add, list and remove Kafka ACLs (broker up or down)")
    actions = acl.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    common.add_argument("--topic", action="append", default=[], help="a topic (repeatable)")
    common.add_argument("--group", action="append", default=[], help="a consumer group (repeatable)")
    common.add_argument("--transactional-id", action="append", default=[], help="a transactional id (repeatable)")
    common.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    common.add_argument(
        "--resource-pattern-type", default=None, help="literal (default) or prefixed; list/remove: also any, match"
    )
    grants = argparse.ArgumentParser(add_help=False)
    grants.add_argument("--allow-principal", action="append", default=[], help="User:NAME or User:* (repeatable)")
    grants.add_argument("--deny-principal", action="append", default=[], help="User:NAME or User:* (repeatable)")
    grants.add_argument("--allow-host", action="append", default=[], help="host of the allow principals (default *)")
    grants.add_argument("--deny-host", action="append", default=[], help="host of the deny principals (default *)")
    grants.add_argument("--host", action="append", default=[], help="host of every principal (default *)")
    grants.add_argument(
        "--operation", action="append", default=[],
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, "
        "IdempotentWrite or All (repeatable)",
    )
    add = actions.add_parser("add", help="grant or deny operations on resources", parents=[common, grants])
    add.set_defaults(func=cmd_add)
    remove = actions.add_parser(
        "remove", help="remove bindings (only a resource given: every binding on it)", parents=[common, grants]
    )
    remove.set_defaults(func=cmd_remove)
    listing = actions.add_parser("list", help="list bindings (of some resources, or all)", parents=[common])
    listing.add_argument("--principal", help="only this principal's bindings")
    listing.set_defaults(func=cmd_list)


def _resources(args: argparse.Namespace) -> list[tuple[ACLResourceType, str]]:
    out = [(ACLResourceType.TOPIC, n) for n in args.topic] + [(ACLResourceType.GROUP, n) for n in args.group]
    out += [(ACLResourceType.TRANSACTIONAL_ID, n) for n in args.transactional_id]
    if args.cluster:
        out.append((ACLResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _pattern(args: argparse.Namespace, allowed: tuple[str, ...]) -> ACLResourcePatternType:
    name = (args.resource_pattern_type or "literal").lower()
    if name not in allowed:
        raise IcelogError(f"--resource-pattern-type {args.resource_pattern_type}: use one of {', '.join(allowed)}")
    return PATTERNS[name]


def _operations(args: argparse.Namespace) -> list[ACLOperation]:
    out = []
    for name in args.operation:
        op = OPERATIONS.get(name.replace("-", "").replace("_", "").lower())
        if op is None:
            raise IcelogError(f"--operation {name}: use one of Read, Write, Create, Delete, Alter, Describe, "
                              "ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All")
        out.append(op)
    return out


def _principals(args: argparse.Namespace) -> Iterator[tuple[ACLPermissionType, str, list[str]]]:
    """(permission, principal, hosts) of every --allow-principal and --deny-principal."""
    for permission, principals, hosts in (
        (ACLPermissionType.ALLOW, args.allow_principal, args.allow_host),
        (ACLPermissionType.DENY, args.deny_principal, args.deny_host),
    ):
        for principal in principals:
            yield permission, principal, (hosts + args.host) or ["*"]


def _store(args: argparse.Namespace, create: bool = False) -> MetadataStore:
    settings = load_settings(args.config, data_dir=args.data_dir)
    if not create:  # a mistyped --data-dir must not look like a broker without ACLs
        require_metadata(settings)
    else:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return open_store(settings.metadata_url)


def cmd_add(args: argparse.Namespace) -> int:
    resources = _resources(args)
    operations = _operations(args)
    if not resources:
        raise IcelogError("name a resource: --topic T, --group G, --transactional-id T or --cluster")
    if not args.allow_principal and not args.deny_principal:
        raise IcelogError("name who: --allow-principal User:NAME or --deny-principal User:NAME (User:* for everyone)")
    if not operations:
        raise IcelogError("name what: --operation Read (repeatable; All for every operation)")
    pattern = _pattern(args, ("literal", "prefixed"))
    entries = [
        AclEntry(rtype, name, pattern, principal, host, op, permission)
        for rtype, name in resources
        for permission, principal, hosts in _principals(args)
        for host in hosts
        for op in operations
    ]
    for entry in entries:
        try:
            validate_binding(entry)
        except InvalidAclError as exc:
            raise IcelogError(f"{exc} ({_describe(entry)}); nothing was added") from None
    store = _store(args, create=True)
    try:
        store.add_acls(entries)
    finally:
        store.close()
    for entry in entries:
        print(f"added: {_describe(entry)}")
    return 0


def _filters(args: argparse.Namespace, grants: list[tuple[int, str | None, str | None]]) -> list[AclFilter]:
    """One filter per resource (or one over all) and (permission, principal, host) and operation given: a
    resource given matches its --resource-pattern-type (literal by default, as kafka-acls.sh), none every one."""
    resources: list[tuple[int, str | None]] = list(_resources(args))
    pattern: int = ACLResourcePatternType.ANY
    if resources or args.resource_pattern_type:
        pattern = _pattern(args, ("literal", "prefixed", "any", "match"))
    operations: list[int] = list(_operations(args)) if getattr(args, "operation", None) else [ACLOperation.ANY]
    return [
        AclFilter(rtype, name, pattern, principal, host, op, permission)
        for rtype, name in resources or [(ACLResourceType.ANY, None)]
        for permission, principal, host in grants
        for op in operations
    ]


def cmd_list(args: argparse.Namespace) -> int:
    filters = _filters(args, [(ACLPermissionType.ANY, args.principal, None)])
    store = _store(args)
    try:
        entries = store.acls()
    finally:
        store.close()
    shown = [e for e in entries if any(f.matches(e) for f in filters)]
    rows = [("RESOURCE-TYPE", "RESOURCE", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION")]
    rows += [_cells(e) for e in shown]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    if not _resources(args):
        raise IcelogError("name the resource whose bindings to remove: --topic T, --group G, --transactional-id T "
                          "or --cluster")
    hosts_given = bool(args.host or args.allow_host or args.deny_host)
    grants: list[tuple[int, str | None, str | None]] = [
        (permission, principal, host)
        for permission, principal, hosts in _principals(args)
        for host in (hosts if hosts_given else [None])
    ] or [(ACLPermissionType.ANY, None, None)]
    filters = _filters(args, grants)
    store = _store(args)
    try:
        removed = [e for e in store.acls() if any(f.matches(e) for f in filters)]
        if removed:
            store.delete_acls(removed)
    finally:
        store.close()
    for entry in removed:
        print(f"removed: {_describe(entry)}")
    if not removed:
        print("no binding matched; `icelog acl list` shows them", file=sys.stderr)
    return 0


def _cells(e: AclEntry) -> tuple[str, str, str, str, str, str, str]:
    return (
        _name(ACLResourceType, e.resource_type), e.resource_name, _name(ACLResourcePatternType, e.pattern_type),
        e.principal, e.host, _name(ACLOperation, e.operation), _name(ACLPermissionType, e.permission),
    )


def _name(enum: type[IntEnum], code: int) -> str:
    return next((str(m.name) for m in enum if m.value == code), str(code))


def _describe(e: AclEntry) -> str:
    rtype, name, pattern, principal, host, op, permission = _cells(e)
    return f"{permission} {principal} from {host} {op} on {rtype} {name!r} ({pattern})"
