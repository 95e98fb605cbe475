"""argparse value types shared by the command lines (``k8s-bridge``, ``python -m bridge.emulator``)."""

from __future__ import annotations

import argparse
import math
import typing


def _finite(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {raw!r}")
    return value


def positive_float(raw: str) -> float:
    """A finite number above 0 (a rate: 0 would mean "never", and divides by zero)."""
    value = _finite(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {raw!r}")
    return value


def non_negative_float(raw: str) -> float:
    """A finite number ≥ 0 (a duration where 0 means "no limit")."""
    value = _finite(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {raw!r}")
    return value


def non_negative_int(raw: str) -> int:
    """A whole number ≥ 0 (a count where 0 means "no limit")."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {raw!r}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (the project's rule for errors)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
