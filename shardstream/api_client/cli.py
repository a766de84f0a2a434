"""``shardstream datasets|runs|tokens``: what the server holds, from the terminal.

Readable tables by default, ``--json`` for scripts (one JSON document on stdout). The
server URL and token come from ``--server`` / ``--token`` or, as for the client SDK, from
``SHARDSTREAM_SERVER`` / ``SHARDSTREAM_TOKEN``. What a token may not read is not shown: the
server filters every list by the token's datasets.

    shardstream datasets list
    shardstream datasets show corpus@2
    shardstream runs show 7 --json
    shardstream runs audit 7          # exit status 0 proven, 1 not, 3 so far, 4 cannot tell
    shardstream runs attempts 7       # every start of the run, a page of the ledger at a time
    shardstream tokens create trainer --scope write --dataset corpus
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from shardstream.api_client._input_view import SLOWEST, input_lines
from shardstream.api_client._mixture_view import mixture_lines
from shardstream.errors import NotFoundError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``datasets``, ``runs`` and ``tokens`` commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help="server URL (default: $SHARDSTREAM_SERVER)")
    common.add_argument("--token", help="API token (default: $SHARDSTREAM_TOKEN)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")

    datasets = subparsers.add_parser("datasets", help="list datasets, show one's versions")
    verbs = datasets.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", parents=[common], help="every dataset this token may read")
    show = verbs.add_parser("show", parents=[common], help="a dataset's versions, or a version")
    show.add_argument("name", metavar="NAME[@VERSION]")
    datasets.set_defaults(handler=_datasets)

    runs = subparsers.add_parser(
        "runs", help="list training runs, show one's checkpoints and input figures"
    )
    verbs = runs.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", parents=[common], help="every run this token may read")
    show = verbs.add_parser(
        "show",
        parents=[common],
        help="a run, its checkpoints, input figures and (with a schedule) mixture",
    )
    show.add_argument("run", type=int, metavar="RUN")
    audit = verbs.add_parser(
        "audit",
        parents=[common],
        help="prove from the run's ledger that every batch was consumed once, in order "
        "(exit status 0 proven, 1 not proven, 3 proven so far, 4 cannot be proven)",
    )
    audit.add_argument("run", type=int, metavar="RUN")
    attempts = verbs.add_parser(
        "attempts", parents=[common], help="every start of a run (its ledger), in order"
    )
    attempts.add_argument("run", type=int, metavar="RUN")
    runs.set_defaults(handler=_runs)

    tokens = subparsers.add_parser("tokens", help="list, create and revoke API tokens (admin)")
    verbs = tokens.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", parents=[common], help="every token (secrets are never shown)")
    create = verbs.add_parser("create", parents=[common], help="a new token; prints its secret")
    create.add_argument("name")
    create.add_argument("--scope", choices=["read", "write", "admin"], default="read")
    create.add_argument(
        "--dataset", action="append", dest="datasets", help="restrict to a dataset (repeat)"
    )
    revoke = verbs.add_parser("revoke", parents=[common], help="revoke a token by id")
    revoke.add_argument("id", type=int)
    tokens.set_defaults(handler=_tokens)


def _client(args: argparse.Namespace) -> Any:
    from shardstream.api_client import APIClient

    return APIClient(args.server, args.token)


def _datasets(args: argparse.Namespace) -> int:
    with _client(args) as api:
        if args.verb == "list":
            rows = [d.model_dump(mode="json") for d in api.list_datasets()]
            cols = ["name", "num_versions", "latest_published", "owner", "created_at"]
            return _out(args, rows, cols)
        name, _, number = args.name.partition("@")
        if number:
            version = api.get_version(name, int(number)).model_dump(mode="json")
            return _out(args, version, list(_VERSION_COLUMNS), single=True)
        rows = [v.model_dump(mode="json") for v in api.list_versions(name)]
        return _out(args, rows, list(_VERSION_COLUMNS))


_VERSION_COLUMNS = (
    "dataset",
    "number",
    "status",
    "num_shards",
    "total_samples",
    "total_bytes",
    "created_by",
    "published_at",
)


def _runs(args: argparse.Namespace) -> int:
    with _client(args) as api:
        if args.verb == "list":
            rows = [_run_row(r.model_dump(mode="json")) for r in api.list_runs()]
            if args.json:
                return _print_json(rows)
            rows = [{**r, "input": _input_cell(r.get("input"))} for r in rows]
            cols = ["id", "name", "status", "sources", "global_batch_size", "input",
                    "created_by"]  # fmt: skip
            return _out(args, rows, cols)
        if args.verb == "audit":
            return _audit(args, api.audit_run(args.run))
        if args.verb == "attempts":
            ledger = [a.model_dump(mode="json") for a in api.list_attempts(args.run)]
            if args.json:
                return _print_json(ledger)
            return _out(args, [_attempt_row(a) for a in ledger], ATTEMPT_COLUMNS)
        run = _run_row(api.get_run(args.run).model_dump(mode="json"))
        checkpoints = [c.model_dump(mode="json") for c in api.list_checkpoints(args.run)]
        # The table lists the slowest ranks; --json has every rank (fetched a page at a time).
        if args.json:
            stats = api.input_stats_all_ranks(args.run)
        else:
            stats = api.input_stats(args.run, limit=SLOWEST)
        inputs = stats.model_dump(mode="json")
        try:
            mixture = api.run_mixture(args.run)
        except NotFoundError:  # a server from before GET /v1/runs/{id}/mixture
            mixture = None
        if args.json:
            shares = None if mixture is None else mixture.model_dump(mode="json")
            return _print_json(
                {**run, "checkpoints": checkpoints, "input_stats": inputs, "mixture": shares}
            )
        _out(args, run, ["id", "name", "status", "sources", "seed", "created_by"], single=True)
        print()
        _out(args, checkpoints, ["step", "epoch", "sample_in_epoch", "created_at", "age"])
        print()
        print("\n".join(input_lines(inputs)))
        lines = [] if mixture is None else mixture_lines(mixture)
        if lines:
            print()
            print("\n".join(lines))
        return 0


AUDIT_EXIT_STATUS = {"proven": 0, "not_proven": 1, "proven_so_far": 3, "cannot_prove": 4}
"""``runs audit``'s exit status per verdict (docs/server.md, *The audit*)."""


def _audit(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Print the audit (``--json``: as the server sends it); the exit status names the
    verdict: 0 proven, 1 not proven, 3 proven so far (the run is not marked completed),
    4 cannot be proven (within the server's bound, or without its plan)."""
    verdict = report.get("verdict") or ("proven_so_far" if report.get("ok") else "not_proven")
    status = AUDIT_EXIT_STATUS.get(verdict, 1)
    if args.json:
        _print_json(report)
        return status
    text = report.get("verdict_text") or verdict.replace("_", " ").upper()
    print(
        f"run {report['run']}: {text}: {report['checkpoints']} checkpoints, latest step "
        f"{report['latest_step']}, {report['samples_per_step']} samples per step"
    )
    for reason in report.get("unproven", []):
        print(f"  cannot be proven: {reason}")
    for epoch in report.get("epochs", []):
        size = "?" if epoch["samples"] is None else epoch["samples"]
        state = "complete" if epoch["complete"] else "in progress"
        print(f"  epoch {epoch['epoch']}: {epoch['consumed_to']} of {size} samples, {state}")
    _more(report, "epochs", "epoch_count", "the verdict covers them all")
    print()
    rows = [_attempt_row(a) for a in report.get("attempts", [])]
    _out(args, rows, ATTEMPT_COLUMNS)
    _more(report, "attempts", "attempt_count", f"shardstream runs attempts {report['run']}")
    for change in report.get("plan_changes", []):
        names = ", ".join(sorted(change.get("changed", {})))
        print(f"plan change by attempt {change['attempt']} at epoch {change.get('epoch')}, "
              f"batch {change.get('batch')}: {names}")  # fmt: skip
    every = f"shardstream runs attempts {report['run']} --json has every attempt's changes"
    _more(report, "plan_changes", "plan_change_count", every)
    failures = report.get("failures", [])
    if failures:
        print(f"\n{report['failure_count']} failure(s):")
        for failure in failures:
            print(f"  - {failure}")
    return status


ATTEMPT_COLUMNS = ["number", "world_size", "workers", "resumed_from", "rolled_back", "created_at"]


def _attempt_row(attempt: dict[str, Any]) -> dict[str, Any]:
    return {
        **attempt,
        "resumed_from": _resumed(attempt),
        "rolled_back": attempt["rolled_back_from"],
    }


def _more(report: dict[str, Any], key: str, count_key: str, where: str) -> None:
    """A line saying how many of the audit's ``key`` its answer left out (it lists the
    first ones of a long list, beside the full count)."""
    shown, total = len(report.get(key, [])), report.get(count_key)
    if isinstance(total, int) and total > shown:
        print(f"... the first {shown} of {total} {key.replace('_', ' ')}; {where}")


def _resumed(attempt: dict[str, Any]) -> str:
    if attempt.get("resumed_step") is None:
        return "start"
    return f"step {attempt['resumed_step']} (attempt {attempt.get('resumed_attempt')})"


def _input_cell(summary: dict[str, Any] | None) -> str:
    """``runs list``'s input column: the run's verdict, and how many ranks wait for data."""
    if not summary or not summary["ranks_reporting"]:
        return "-"
    if not summary["ranks_input_bound"]:
        return str(summary["verdict"])
    return f"{summary['verdict']} ({summary['ranks_input_bound']}/{summary['world_size']} ranks)"


def _run_row(run: dict[str, Any]) -> dict[str, Any]:
    sources = ", ".join(f"{s['dataset']}@{s['version']}" for s in run.get("sources", []))
    return {**run, "sources": sources}


def _tokens(args: argparse.Namespace) -> int:
    with _client(args) as api:
        if args.verb == "create":
            token = api.create_token(args.name, [args.scope], datasets=args.datasets)
            if args.json:
                return _print_json(token.model_dump(mode="json"))
            print(f"token {token.id} ({token.name}), scope {args.scope}; its secret, shown once:")
            print(token.secret)
            return 0
        if args.verb == "revoke":
            token = api.revoke_token(args.id).model_dump(mode="json")
            return _out(args, token, ["id", "name", "revoked_at"], single=True)
        rows = [t.model_dump(mode="json") for t in api.list_tokens()]
        if args.json:
            return _print_json(rows)
        for row in rows:
            row["scopes"] = ",".join(row["scopes"])
            row["datasets"] = "all" if row["datasets"] is None else ",".join(row["datasets"])
        cols = ["id", "name", "prefix", "scopes", "datasets", "created_at", "revoked_at"]
        return _out(args, rows, cols)


def _out(
    args: argparse.Namespace, data: Any, columns: Sequence[str], *, single: bool = False
) -> int:
    """Print ``data`` (rows, or one record) as JSON or as an aligned table."""
    if args.json:
        return _print_json(data)
    if single:
        width = max(len(c) for c in columns)
        for col in columns:
            print(f"{col:<{width}}  {_cell(col, data.get(col))}")
        return 0
    if not data:
        print("(none)")
        return 0
    cells = [[_cell(c, row.get(c, row.get("created_at") if c == "age" else None)) for c in columns]
             for row in data]  # fmt: skip
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column == "age":
        return _age(str(value))
    if column.endswith("_at"):
        return str(value).replace("T", " ")[:19]
    if column.endswith("bytes") and isinstance(value, int):
        return f"{value / 1e6:,.1f} MB"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if column not in ("id", "number", "step", "epoch") else str(value)
    return str(value)


def _age(stamp: str) -> str:
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    seconds = int((datetime.now(timezone.utc) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def _print_json(data: Any) -> int:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0
