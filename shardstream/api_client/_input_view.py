"""``shardstream runs show``'s input section: is the run waiting for data, on which ranks?"""

from __future__ import annotations

from typing import Any

from shardstream.wire import percentiles

__all__ = ["input_lines"]

SLOWEST = 16
"""Ranks listed (the slowest, by wait share of their latest window); --json has them all."""


def input_lines(stats: dict[str, Any]) -> list[str]:
    """The run's input figures (``GET /v1/runs/{id}/input-stats``: its slowest ranks and
    the figures over all of them) as lines for a terminal."""
    ranks = stats["ranks"]
    if not ranks:
        return ["input: no rank has reported input figures yet (they come with commits)"]
    share = stats["wait_share"]
    head = (
        f"input: {stats['verdict']}; data wait {share:.1%} of the loop's time over "
        f"{stats['ranks_reporting']} of {stats['world_size']} ranks"
    )
    if stats["missing_count"]:
        listed = ", ".join(str(r) for r in stats["missing"][:20])
        more = "" if stats["missing_count"] <= 20 else f" and {stats['missing_count'] - 20} more"
        head += f"; never reported: rank {listed}{more}"
    lines = [head, *_packing(ranks), ""]
    header = ("rank", "wait", "verdict", "ready p50/p95/p99 ms", "storage", "retries",
              "throttled", "cache hit/miss", "step")  # fmt: skip
    rows = [header]
    for rank in ranks[:SLOWEST]:
        latest = rank["latest"]
        total = rank["total"]
        pct = percentiles(latest["latency_counts"])
        rows.append(
            (
                str(rank["rank"]),
                f"{rank['wait_share']:.1%}",
                rank["verdict"],
                "/".join(f"{v:g}" for v in pct) or "-",
                f"{total['storage_bytes'] / 2**20:.1f} MiB",
                str(total["retries"]),
                str(total["throttled"]),
                f"{total['cache_hits']}/{total['cache_misses']}",
                str(rank["step"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]  # fmt: skip
    if stats["ranks_reporting"] > min(len(ranks), SLOWEST):
        more = stats["ranks_reporting"] - min(len(ranks), SLOWEST)
        lines.append(f"... {more} more ranks (--json lists them all)")
    return lines


def _packing(ranks: list[dict[str, Any]]) -> list[str]:
    """A line on read-time packing's truncation over the ranks listed (none without
    packing, or from a server that does not count it)."""
    cut = sum(int(r["total"].get("truncated_tokens", 0)) for r in ranks)
    seen = cut + sum(int(r["total"].get("packed_tokens", 0)) for r in ranks)
    if not seen:
        return []
    line = f"packing: truncated {cut} of {seen} document tokens ({cut / seen:.1%})"
    if len(ranks) > 1:
        line += f" over the {len(ranks)} ranks listed"
    if cut:
        line += "; fixed PackOptions.rows do not hold them (raise rows, or rows=None)"
    return [line]
