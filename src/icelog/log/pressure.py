"""Back-pressure on produce (Nobu's circuit breaker): slow, then refuse, producers the lake cannot keep up with.

Intake of an archived topic may be dropped only once archived, so a lake that is down or slow makes
the intake grow. Two bounds keep it from filling the disk:
  - per archived topic, `icelog.archive.max.lag.bytes` of unarchived intake: past THROTTLE_FROM of it,
    Produce responses carry `throttle_time_ms` (clients wait before their next request); at the bound,
    batches are refused with NOT_ENOUGH_REPLICAS, which librdkafka, kafka-python and the Java client
    retry by themselves (with idempotence, in order and without duplicates);
  - for every topic, `intake.min_free_bytes` of free space in the data directory, checked against each
    append's own size (LogManager.free_estimate: the last reading less the intake bytes queued since).
The check on the produce path is O(1): it reads counters that a background task refreshes from the
metadata store's archive states (written by the archiver process) every REFRESH_INTERVAL_S, and that
each accepted append raises in between. Nothing accepted is ever dropped: a refused batch stores nothing.
"""

from __future__ import annotations

from icelog.errors import ErrorCode, KafkaApiError

REFRESH_INTERVAL_S = 1.0
THROTTLE_FROM = 0.8  # fraction of the lag bound from which producers are slowed
THROTTLE_MAX_MS = 1000  # throttle just below the bound; grows linearly from THROTTLE_FROM


def space_reason(free_bytes: int, pending: int, min_free_bytes: int) -> str:
    """Why produce is refused for disk space (the Produce error message, the log line, `icelog status`)."""
    append = f" less this append's {pending} bytes" if pending else ""
    return (
        f"the data directory has {free_bytes} bytes free{append}, below intake.min_free_bytes={min_free_bytes}; "
        "produce resumes once space is freed (retention, or a larger disk)"
    )


def admission(
    topic: str, unarchived: int, max_lag_bytes: int | None, free_bytes: int | None, min_free_bytes: int
) -> int:
    """Throttle (ms) for a produce to `topic`; raise a retriable NOT_ENOUGH_REPLICAS past a bound."""
    if free_bytes is not None and free_bytes < min_free_bytes:
        raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS, space_reason(free_bytes, 0, min_free_bytes))
    if max_lag_bytes is None:
        return 0
    if unarchived >= max_lag_bytes:
        raise KafkaApiError(
            ErrorCode.NOT_ENOUGH_REPLICAS,
            f"{topic}: {unarchived} intake bytes are not archived yet, the bound is "
            f"icelog.archive.max.lag.bytes={max_lag_bytes}; produce resumes when the archiver catches up "
            "(see `icelog status`)",
        )
    start = THROTTLE_FROM * max_lag_bytes
    if unarchived < start:
        return 0
    return 1 + int(THROTTLE_MAX_MS * (unarchived - start) / (max_lag_bytes - start))
