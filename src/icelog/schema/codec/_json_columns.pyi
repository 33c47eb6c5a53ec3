def decode(
    program: tuple[tuple[int, int, bytes, tuple[int, ...]], ...], bodies: list[bytes] | list[bytes | None],
    head: bytes = ...,
) -> tuple[tuple[int, int, bytes | None, bytes, bytes | None], ...]: ...
