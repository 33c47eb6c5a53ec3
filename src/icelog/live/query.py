"""Which archive tables a SQL query names, and the query with each one replaced by a view (`icelog sql --live`).

A table is named as `[catalog.]namespace.table`, each part bare or back-quoted (`icelog.orders`,
`` lake.icelog.`orders-v2` ``). The query is tokenized as Spark SQL's lexer would see it for this purpose: string
literals ('…', "…"), comments (-- …, /* … */) and back-quoted identifiers are skipped whole, so a table name inside
a string is never replaced; a dotted name is replaced only when it is one of the given tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class NameAt:
    """A dotted name in the query: its parts (unquoted) and where it is."""

    parts: tuple[str, ...]
    start: int
    end: int


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """The index after the literal or identifier opened at `i` (a backslash escapes in strings, `` doubles)."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\" and quote != "`":
            j += 2
            continue
        if text[j] == quote:
            if quote == "`" and text[j + 1 : j + 2] == "`":
                j += 2
                continue
            return j + 1
        j += 1
    return j


def _part(text: str, i: int) -> tuple[str, int] | None:
    """The identifier starting at `i` (bare or back-quoted) and the index after it."""
    if i < len(text) and text[i] == "`":
        end = _skip_quoted(text, i, "`")
        return text[i + 1 : end - 1].replace("``", "`"), end
    match = _IDENT.match(text, i)
    return (match.group(), match.end()) if match else None


def dotted_names(text: str) -> Iterator[NameAt]:
    """Every dotted identifier (two parts or more) outside literals and comments."""
    i = 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _skip_quoted(text, i, c)
        elif text.startswith("--", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline + 1
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = len(text) if close < 0 else close + 2
        elif c == "`" or c.isalpha() or c == "_":
            if i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):  # inside a number or a longer name
                i += 1
                continue
            start, parts = i, []
            found = _part(text, i)
            while found is not None:
                parts.append(found[0])
                i = found[1]
                after = _SPACE.match(text, i)
                dot = after.end() if after else i
                if not text.startswith(".", dot):
                    break
                nxt = _SPACE.match(text, dot + 1)
                found = _part(text, nxt.end() if nxt else dot + 1)
                if found is None:
                    break
            if len(parts) >= 2:
                yield NameAt(tuple(parts), start, i)
        else:
            i += 1


def replace_tables(
    text: str, tables: Mapping[tuple[str, str], str], catalog: str, view: Callable[[str], str]
) -> tuple[str, list[str]]:
    """`text` with every reference to a table of `tables` ((namespace, table) → topic) replaced by `view(topic)`;
    and the topics named, in order. Names compare as Spark compares them: case-insensitively."""
    folded = {(ns.lower(), name.lower()): topic for (ns, name), topic in tables.items()}
    out: list[str] = []
    named: list[str] = []
    last = 0
    for name in dotted_names(text):
        parts = [p.lower() for p in name.parts]
        if len(parts) == 3 and parts[0] != catalog.lower():
            continue
        if len(parts) not in (2, 3):
            continue
        topic = folded.get((parts[-2], parts[-1]))
        if topic is None:
            continue
        out += [text[last : name.start], view(topic)]
        last = name.end
        if topic not in named:
            named.append(topic)
    out.append(text[last:])
    return "".join(out), named
