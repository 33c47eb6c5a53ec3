"""`icelog user add|list|delete`: SASL users (SCRAM credentials) in the metadata store, broker up or down.

The commands open the metadata store directly, so the first admin can be created before the broker ever
starts; with the broker running they work too (SQLite WAL) and apply at the next login, since the broker reads
credentials at each one. Only salted SCRAM keys are stored; the password is read from stdin (or a terminal,
without echo) and goes nowhere but the key derivation.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from icelog.cli.archive import require_metadata
from icelog.config import Settings, load_settings
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from icelog.security.credentials import (
    DEFAULT_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialError,
    check_user_name,
    make_credential,
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = sub.add_parser("user", help="add, list and delete SASL users (SCRAM / PLAIN), broker up or down")
    user.add_argument("--data-dir", help="the broker's data directory (default ./icelog-data)")
    # --data-dir and --config after the action too (`icelog user list --data-dir D`); absent there, the one
    # before it stands
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--data-dir", default=argparse.SUPPRESS, help="the broker's data directory")
    after.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file")
    actions = user.add_subparsers(dest="action", required=True)

    add = actions.add_parser(
        "add", parents=[after],
        help="create a user or change its password (one credential per mechanism; PLAIN checks against them)",
    )
    add.add_argument("name")
    add.add_argument(
        "--mechanism", action="append", choices=SCRAM_MECHANISMS,
        help="SCRAM-SHA-256 or SCRAM-SHA-512; may be given twice (default: both, so PLAIN and either SCRAM work)",
    )
    add.add_argument("--password-stdin", action="store_true", required=True,
                     help="read the password from stdin (one line); from a terminal it is not echoed")
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                     help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS}, at most 16384 as in Kafka)")
    add.set_defaults(func=cmd_add)

    actions.add_parser("list", parents=[after], help="users, mechanisms and iterations (never keys)").set_defaults(
        func=cmd_list
    )

    delete = actions.add_parser("delete", parents=[after], help="delete a user (or one mechanism of it)")
    delete.add_argument("name")
    delete.add_argument("--mechanism", choices=SCRAM_MECHANISMS, help="only this credential (default: all)")
    delete.set_defaults(func=cmd_delete)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config, data_dir=args.data_dir)


def _open(settings: Settings) -> MetadataStore:
    return open_store(settings.metadata_url)


def _read_password() -> str:
    """One line from stdin, without its line end; from a terminal, prompted without echo."""
    if sys.stdin.isatty():
        return getpass.getpass("password: ")
    line = sys.stdin.readline()
    return line.removesuffix("\n").removesuffix("\r")


def cmd_add(args: argparse.Namespace) -> int:
    settings = _settings(args)
    check_user_name(args.name)  # before reading a password for a name that cannot be stored
    password = _read_password()
    if not password:
        raise CredentialError("the password is empty; pipe it on stdin, e.g. `printf %s \"$PW\" | icelog user "
                              f"add {args.name} --password-stdin`")
    mechanisms = list(dict.fromkeys(args.mechanism or SCRAM_MECHANISMS))
    # Derive every credential before writing one: a refused password leaves the user as it was.
    credentials = [make_credential(args.name, m, password, iterations=args.iterations) for m in mechanisms]
    store = _open(settings)
    try:
        existed = bool(store.scram_credentials(args.name))
        for credential in credentials:
            store.save_scram_credential(credential)
    finally:
        store.close()
    verb = "updated" if existed else "added"
    print(f"user {args.name} {verb}: {', '.join(mechanisms)} ({args.iterations} iterations)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    require_metadata(settings)
    store = _open(settings)
    try:
        credentials = store.scram_credentials()
    finally:
        store.close()
    rows = [("USER", "MECHANISM", "ITERATIONS")]
    rows += [(c.user, c.mechanism, str(c.iterations)) for c in credentials]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    settings = _settings(args)
    require_metadata(settings)
    store = _open(settings)
    try:
        removed = store.delete_scram_credentials(args.name, args.mechanism)
        left = [c.mechanism for c in store.scram_credentials(args.name)]
    finally:
        store.close()
    if not removed:
        what = f"no {args.mechanism} credential of user {args.name!r}" if args.mechanism else f"no user {args.name!r}"
        print(f"icelog: {what}; `icelog user list` shows the users", file=sys.stderr)
        return 1
    print(f"user {args.name}: {', '.join(left)} left" if left else f"user {args.name} deleted")
    return 0

