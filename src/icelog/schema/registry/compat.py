"""Compatibility levels, as Confluent defines them, over each schema type's own rules (compiled.incompatibilities).

BACKWARD: readers of the new schema read data of the latest one (incompatibilities(latest, new));
FORWARD: readers of the latest read data of the new one (incompatibilities(new, latest)); FULL: both.
The *_TRANSITIVE levels check against every live version instead of the latest only; NONE checks nothing.
Avro follows Avro's schema resolution, JSON Schema Confluent's open/closed content-model rules, Protobuf
Confluent's Protobuf diff (avro_schema.py, json_schema.py, protobuf_compat.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from icelog.schema.compiled import CompiledSchema, incompatibilities

LEVELS = (
    "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


def check(level: str, candidate: CompiledSchema, existing: Sequence[CompiledSchema]) -> list[str]:
    """Problems that keep `candidate` from joining a subject whose live versions are `existing` (oldest first)."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    base = level.removesuffix("_TRANSITIVE")
    problems: list[str] = []
    for previous in against:
        if base in ("BACKWARD", "FULL"):
            problems += [f"backward: {p}" for p in incompatibilities(previous, candidate)]
        if base in ("FORWARD", "FULL"):
            problems += [f"forward: {p}" for p in incompatibilities(candidate, previous)]
    return problems
