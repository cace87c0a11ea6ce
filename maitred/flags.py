"""Flag value types shared by the ``maitred`` commands: each refuses what a command could not
use, and argparse names the flag in its one-line error. Standard library only, because every
invocation (the Claude Code hook included) builds the parsers that use them."""

import argparse
import math
from collections.abc import Callable


def whole(minimum: int, maximum: int | None = None, *, unit: str = "whole number") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {unit}") from None
        if value < minimum or maximum is not None and value > maximum:
            bound = f"between {minimum} and {maximum:,}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def positive(unit: str = "number") -> Callable[[str], float]:
    """A positive, finite float (NaN and infinity would make a run hang or never end)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {unit}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive, finite {unit}, got {text!r}")
        return value

    return parse


def bounded(low: float, high: float, *, open_low: bool = False) -> Callable[[str], float]:
    """A float in [low, high] (or (low, high] with ``open_low``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value > high or value < low or (open_low and value == low):
            interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text!r}")
        return value

    return parse


port = whole(1, 65535, unit="port number")
seconds = positive("number of seconds")
