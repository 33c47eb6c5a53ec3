def validate_records(
    buffer: bytes | bytearray | memoryview, count: int, base_timestamp: int, max_timestamp: int,
    require_keys: bool = False,
) -> tuple[int, int, str] | None: ...
