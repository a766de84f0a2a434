"""The ``shardstream`` command line.

Each part of the distribution contributes its own sub-commands through a ``register``
function in its ``cli`` module. Those modules import only :mod:`argparse` at load time,
so ``shardstream --help`` works on a client-only install; the heavy imports (pyarrow,
FastAPI, SQLAlchemy) happen inside the command handlers, which report a missing extra
with the ``pip install`` line that fixes it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

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


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every part's sub-commands registered."""
    parser = argparse.ArgumentParser(
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
    """Entry point of the ``shardstream`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # one line per HTTP request is debugging detail
        logging.getLogger("httpx").setLevel(logging.WARNING)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shardstream: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
