"""The ``shardstream demo`` command (imports only argparse at load time)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``shardstream demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="run the whole system end to end on this machine (server, build, train, resume, "
        "resume on another number of ranks)",
        description="Start a server on SQLite, build and publish a tokenized dataset from "
        "public-domain text, train a tiny model, kill it mid-run with SIGKILL, resume from the "
        "server and check the sample sequence against an uninterrupted run; then kill a job of "
        "2 ranks mid-epoch, resume it on 4 ranks and check that the epoch was read exactly once, "
        "in the same order.",
    )
    parser.add_argument(
        "--workdir", help="where to keep the evidence (default: a new folder under the temp dir)"
    )
    parser.add_argument("--steps", type=int, default=120, help="training steps (default 120)")
    parser.add_argument(
        "--kill-at", type=int, default=75, help="SIGKILL the trainer at this step (default 75)"
    )
    parser.add_argument(
        "--commit-every", type=int, default=10, help="checkpoint interval in steps (default 10)"
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from shardstream.demo.run import DemoConfig, run_demo

    config = DemoConfig(steps=args.steps, kill_at=args.kill_at, commit_every=args.commit_every)
    return 0 if run_demo(config, args.workdir) else 1
