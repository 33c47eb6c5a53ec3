def decode(
    program: tuple[tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]], ...], bodies: list[bytes | None],
    head: bytes = b"",
) -> tuple[tuple[int, int, bytes | None, bytes, bytes | None], ...]: ...
