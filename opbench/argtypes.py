"""Argument types that check numbers when the command line is parsed: a bad value exits 2 with
argparse's message naming the flag (``argument --repeat: must be >= 1, got 0``) before anything runs."""
from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from typing import TypeVar

from opbench.exceptions import OpBenchError

T = TypeVar("T")


def _number(kind: type[int] | type[float], low: float, inclusive: bool) -> Callable[[str], float]:
    bound = f"{'>=' if inclusive else '>'} {low:g}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


positive_int = _number(int, 1, True)
nonneg_int = _number(int, 0, True)
positive_float = _number(float, 0, False)
nonneg_float = _number(float, 0, True)


def lengths(text: str) -> tuple[int, ...]:
    """``"32,64,128"`` -> (32, 64, 128): distinct positive integers, ascending (sequence lengths, buckets)."""
    values = [int(positive_int(part)) for part in text.split(",")]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"must be distinct, got {text}")
    return tuple(sorted(values))


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port (1-65535), got {text}")
    return int(value)


def checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """A library parser as an argument type: the :class:`OpBenchError` it raises becomes argparse's message."""
    @functools.wraps(parse)
    def argument(text: str) -> T:
        try:
            return parse(text)
        except OpBenchError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return argument
