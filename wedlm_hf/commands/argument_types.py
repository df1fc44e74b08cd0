"""Argument types of the `wedlm-hf` options: a value that cannot be right is refused while parsing, in one line.

The function name never reaches the user, the ArgumentTypeError message does.
"""

import argparse
import os


def positive_int(value: str) -> int:
    number = _number(int, value, "a whole number")
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number (1 or more)")
    return number


def non_negative_int(value: str) -> int:
    number = _number(int, value, "a whole number")
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative: give 0 or more")
    return number


def tcp_port(value: str) -> int:
    number = _number(int, value, "a whole number")
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port: give 0 to 65535 (0: any free one)")
    return number


def non_negative_float(value: str) -> float:
    number = _number(float, value, "a number")
    if not number >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r} is not a number >= 0")
    return number


def positive_float(value: str) -> float:
    number = _number(float, value, "a number")
    if not 0 < number < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number > 0")
    return number


def threshold(value: str) -> float | None:
    """tau in nats, or 'none' (one token per forward)."""
    if value.strip().lower() == "none":
        return None
    try:
        return non_negative_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a number >= 0 nor 'none'") from None


def _number(kind, value: str, what: str):
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None


def existing_folder(value: str) -> str:
    """A local folder that exists (checkpoints, tokenizers, export folders)."""
    path = os.path.expanduser(value)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{value} is a file, not a folder: give the folder that holds it")
    raise argparse.ArgumentTypeError(
        f"no folder {value}: give an existing local folder (download Hub models first with "
        "`hf download ORG/NAME --local-dir DIR`)"
    )


def existing_file(value: str) -> str:
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{value} is a folder, not a file")
    raise argparse.ArgumentTypeError(f"no file {value}")


def training_data(value: str) -> str:
    """'offline-mix' or an existing .txt / .jsonl file."""
    if value == "offline-mix":
        return value
    path = existing_file(value)
    if not path.endswith((".txt", ".jsonl")):
        raise argparse.ArgumentTypeError(f"{value}: give .txt or .jsonl files, or 'offline-mix'")
    return path


def prompt_text(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError('the prompt is empty: give the text to continue, e.g. "def fibonacci(n):"')
    return value
