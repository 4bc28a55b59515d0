"""``autostream`` command line: one sub-command per module in ``autostream.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> int`` exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

COMMANDS = ("demo", "plan", "check", "compare", "calibrate")
VERBOSE_HELP = "log what autostream does (its INFO lines: one per graph planned)"
EXIT_CODES = """\
exit status: 0 done; 1 the command found what it looks for (check: races or other problems;
compare: no solver made a plan); 2 bad usage or input (the message names it); 3 an internal
error (a traceback follows)"""


class LogFormat(logging.Formatter):
    """``LEVEL: origin: message``; a message that already starts with its logger's name
    (autostream's say ``autostream: ...`` to a library user too) is not prefixed twice.

    >>> def line(name, msg):
    ...     return LogFormat().format(logging.LogRecord(name, logging.WARNING, "", 0, msg, (), None))
    >>> line("autostream", "autostream: link fit at world size 2"), line("torch", "slow")
    ('WARNING: autostream: link fit at world size 2', 'WARNING: torch: slow')
    """

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        named = message.startswith(record.name)
        return f"{record.levelname}: " + (message if named else f"{record.name}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autostream",
        description="Automatic multi-stream planning for PyTorch graphs.",
        epilog=EXIT_CODES,
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
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormat())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
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
    except Exception:  # noqa: BLE001 - not 1, which says what a command found
        traceback.print_exc()
        print(f"autostream {args.command}: internal error (the traceback above): please "
              f"report it", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
