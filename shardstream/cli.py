"""The ``shardstream`` command line.

Each part of the distribution contributes its own sub-commands through a ``register``
function in its ``cli`` module. Those modules import only :mod:`argparse` at load time,
so ``shardstream --help`` works on a client-only install; the heavy imports (pyarrow,
FastAPI, SQLAlchemy) happen inside the command handlers, which report a missing extra
with the ``pip install`` line that fixes it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shardstream import __version__
from shardstream.errors import ShardstreamError

# Modules with a ``register(subparsers)`` function, in the order shown by ``--help``.
_COMMAND_MODULES = (
    "shardstream.shard_builder.cli",
    "shardstream.shard_builder.importers.cli",
    "shardstream.shard_builder.publish",
    "shardstream.server.cli",
    "shardstream.api_client.cli",
    "shardstream.client.cli",
    "shardstream.demo.cli",
)

Handler = Callable[[argparse.Namespace], int]

# A path the user gave that the operating system refused: reported like ShardstreamError.
_PATH_ERRORS = (
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    FileExistsError,
)


class _Parser(argparse.ArgumentParser):
    """An argument parser that names the option a mistyped one was probably meant to be.

    Sub-command parsers are made with the class of their parent, so every parser of the
    command line is one of these, and each reports the arguments it does not know itself,
    with its own usage line: ``shardstream build text x --seqlen 5`` ends in
    ``shardstream build text: error: unrecognized arguments: --seqlen 5 (did you mean
    --seq-len?)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if sys.version_info >= (3, 14):  # argparse's own hints, for mistyped choices
            kwargs.setdefault("suggest_on_error", True)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            hints = [hint for arg in extras if (hint := self._closest_option(arg))]
            said = f" (did you mean {' or '.join(hints)}?)" if hints else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{said}")
        return parsed, extras

    def _closest_option(self, arg: str) -> str | None:
        if not arg.startswith("-"):
            return None
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, self._option_string_actions, n=1, cutoff=0.75)
        return close[0] if close else None


def _path_error(exc: OSError) -> str:
    """``No such file or directory: data/corpus.jsonl`` from the OS error of a bad path."""
    if exc.filename is None:
        return str(exc)
    reason = exc.strerror or type(exc).__name__
    target = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    return f"{reason}: {exc.filename}{target}"


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every part's sub-commands registered."""
    parser = _Parser(
        prog="shardstream",
        description="Upload a training dataset once, stream it to many nodes, resume exactly.",
    )
    parser.add_argument("--version", action="version", version=f"shardstream {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that part has no CLI yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shardstream`` console script; returns the exit status.

    When the reader of the output goes away (``shardstream runs show 7 | head``), the
    command stops quietly with status 141, as a Unix tool killed by SIGPIPE does."""
    try:
        try:
            return _main(argv)
        finally:  # a reader gone shows up here, not at exit (where it would be a traceback)
            sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """Stop after a write to a closed pipe: no traceback, and no second error when Python
    flushes what is left of stdout at exit (it goes to /dev/null instead)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # One line per HTTP request, and alembic's per-step migration lines (the migrate
        # command prints one line for the whole upgrade), are debugging detail.
        for noisy in ("httpx", "alembic"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except _PATH_ERRORS as exc:
        print(f"shardstream: error: {_path_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shardstream: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
