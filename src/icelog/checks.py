"""Validators of config values, shared by every topic config key: a check raises ValueError naming the fix.

Imports nothing of icelog: the keys' owners (topics.py, table/config.py) and every layer above may use it.
"""

from __future__ import annotations

from collections.abc import Callable

Check = Callable[[str], None]


def check_long(minimum: int) -> Check:
    """A validator of integer config values at or above `minimum`."""

    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise ValueError(f"{number} is below the minimum {minimum}")

    return check


def check_ratio(value: str) -> None:
    """A validator of a fraction between 0 and 1 (min.cleanable.dirty.ratio)."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not 0 <= number <= 1:
        raise ValueError(f"{number} is not between 0 and 1")


def one_of(*choices: str) -> Check:
    """A validator of values that must be one of `choices`."""

    def check(value: str) -> None:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")

    return check
