def validate_records(
    buffer: bytes | bytearray | memoryview, count: int, base_timestamp: int, require_keys: bool = False,
    earliest: int = ..., latest: int = ...,
) -> int | tuple[int, int, str]: ...
def read_records(
    buffer: bytes | bytearray | memoryview, count: int, base_offset: int, base_timestamp: int,
    log_append_time: int | None = None,
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]: ...
