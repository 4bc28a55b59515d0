"""``autostream`` command line: one sub-command per module in ``autostream.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> int`` exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

COMMANDS = ("demo", "plan", "check", "compare", "calibrate")
VERBOSE_HELP = "log what autostream does (its INFO lines: one per graph planned)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autostream",
        description="Automatic multi-stream planning for PyTorch graphs.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"autostream.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"autostream.commands.{name}":
                raise
            continue
        module.register(sub)
    for command in sub.choices.values():  # `autostream plan ... -v` as well as `autostream -v plan`
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=VERBOSE_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autostream`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    if args.verbose:  # autostream's lines only: torch's INFO logs are not the user's question
        logging.getLogger("autostream").setLevel(logging.INFO)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"autostream {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
