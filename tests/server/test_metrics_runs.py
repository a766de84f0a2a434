"""``/metrics`` needs no token, so what it shows without one is public: the server's own
figures, and no run's. Per-run figures go to a scrape with an admin token only, read from
one row per run kept as the ranks commit (a scrape's cost does not grow with the ranks).
Every test runs on SQLite and PostgreSQL (the ``api`` fixture, an admin)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event, inspect, select, text
from sqlalchemy.orm import Mapper, Session

from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data.run_input_totals import bound
from shardstream.server.db import make_engine
from shardstream.server.migrate import alembic_config, current_revision, upgrade
from shardstream.server.models import RankInputStatsRow
from shardstream.wire import INPUT_BOUND, InputStatsReport
from tests.fixtures.console import mint
from tests.fixtures.query_log import count_queries
from tests.fixtures.run_requests import commit_stats, input_report, mixed_run


def _run_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("shardstream_run_")]


def test_run_figures_only_for_an_admin_scrape(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    assert commit_stats(api, run, 10, input_report(0, 2, 3.0, 1.0)).status_code == 201
    reader = mint(api, "reader", ["read"])
    with TestClient(app) as anonymous:
        public = anonymous.get("/metrics")
        assert public.status_code == 200
        assert "shardstream_http_requests_total" in public.text
        assert _run_lines(public.text) == []
        as_reader = anonymous.get("/metrics", headers={"Authorization": f"Bearer {reader}"})
        assert as_reader.status_code == 200 and _run_lines(as_reader.text) == []
        bad = anonymous.get("/metrics", headers={"Authorization": "Bearer ss_no_such_token"})
        assert bad.status_code == 401
    admin_lines = _run_lines(api.get("/metrics").text)
    assert f'shardstream_run_data_wait_seconds_total{{run="{run}"}} 3.0' in admin_lines


# --- a scrape reads one row per run ---------------------------------------------------


@contextmanager
def rows_loaded(app: FastAPI) -> Iterator[Counter[str]]:
    """Table rows the ORM loads, by table, and SELECTs the engine runs (``"SELECT"``),
    for the duration of the block."""
    loaded: Counter[str] = Counter()

    def on_load(target: Any, context: Any) -> None:
        loaded[type(target).__tablename__] += 1

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            loaded["SELECT"] += 1

    event.listen(Mapper, "load", on_load)
    event.listen(app.state.engine, "before_cursor_execute", on_execute)
    try:
        yield loaded
    finally:
        event.remove(Mapper, "load", on_load)
        event.remove(app.state.engine, "before_cursor_execute", on_execute)


def _report_ranks(app: FastAPI, run: int, ranks: range, world: int) -> None:
    """What the commits of ``ranks`` store (through the server's own code)."""
    with app.state.sessionmaker.begin() as session:
        for rank in ranks:
            wait = float(rank % 4)
            stats = input_report(rank, world, wait, 4.0 - wait + 1.0)
            input_stats_data.record(session, run, 10, InputStatsReport.model_validate(stats))


def test_a_scrape_reads_one_row_per_run_whatever_its_ranks(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """The database work of an admin scrape is the same for 10 and for 1,000 reporting
    ranks: the same SELECTs, one stored row per run, no rank's row."""
    run = mixed_run(api, tmp_path)["id"]
    world = 1000
    api.get("/metrics")  # the token's first use, cached from then on
    work = []
    for ranks in (range(10), range(10, world)):
        _report_ranks(app, run, ranks, world)
        with rows_loaded(app) as loaded, count_queries(app) as log:
            text = api.get("/metrics").text
        work.append((loaded, log.tables))
        lines = _run_lines(text)
        assert f'shardstream_run_ranks_reporting{{run="{run}"}} {float(ranks.stop)}' in lines
    (few, few_tables), (many, many_tables) = work
    assert few == many and few_tables == many_tables
    assert many["run_input_totals"] == 1 and "run_input_stats" not in many
    assert "run_input_stats" not in many_tables
    # The figures are the ranks' sums: waits of 0, 1, 2, 3 s in turn, 5 s a step.
    values = dict(line.rsplit(" ", 1) for line in _run_lines(text))
    assert float(values[f'shardstream_run_data_wait_seconds_total{{run="{run}"}}']) == 1500.0
    assert float(values[f'shardstream_run_data_wait_ratio{{run="{run}"}}']) == 0.3
    assert float(values[f'shardstream_run_ranks_input_bound{{run="{run}"}}']) == 750
    assert float(values[f'shardstream_run_ranks{{run="{run}"}}']) == world
    assert float(values[f'shardstream_run_storage_bytes_total{{run="{run}"}}']) == world << 20


def _from_rank_rows(session: Session, run: int) -> input_stats_data.RunAggregate:
    """A run's figures summed over its ranks' rows at read time (what a scrape did before
    the run's totals were kept)."""
    rows = session.scalars(select(RankInputStatsRow).where(RankInputStatsRow.run_id == run)).all()

    def total(name: str) -> Any:
        return min(sum(min(max(r.total.get(name, 0), 0), bound(name)) for r in rows), bound(name))

    counts = Counter(r.verdict for r in rows)
    return input_stats_data.RunAggregate(
        run_id=run,
        ranks=len(rows),
        world_size=max(r.world_size for r in rows),
        input_bound_ranks=sum(counts[v] for v in INPUT_BOUND),
        data_wait_s=float(total("data_wait_s")),
        step_s=float(total("step_s")),
        storage_bytes=int(total("storage_bytes")),
        storage_requests=int(total("storage_requests")),
        throttled=int(total("throttled")),
        retries=int(total("retries")),
        cache_hits=int(total("cache_hits")),
        cache_misses=int(total("cache_misses")),
        verdict=input_stats_data.verdict_of(counts),
    )


def test_kept_figures_equal_the_sums_over_the_ranks_rows(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """Ranks that change verdict, replay steps, resume on another world size and reach
    the bounds: the run's kept figures are what summing its ranks' rows says."""
    run = mixed_run(api, tmp_path)["id"]
    big = 2**53
    windows = [
        (10, input_report(0, 4, 3.0, 1.0)),
        (10, input_report(1, 4, 0.5, 9.5)),
        (10, input_report(2, 4, 0.25, 9.75, verdict="cpu_bound")),
        (10, input_report(1, 4, 9.0, 1.0)),  # a replayed step: not counted again
        (20, input_report(0, 4, 0.25, 9.75)),  # io_bound -> not_input_bound
        (20, input_report(1, 4, 9.0, 1.0, throttled=7, retries=2)),  # -> io_bound
        (30, input_report(0, 2, 1.0, 1.0, verdict="unknown")),  # resumed on 2 ranks
        (30, input_report(3, 8, 1e9, 1e9, storage_bytes=big, cache_hits=big)),
    ]
    # Rank 3's totals reach their bounds (the seconds after 1,000 windows).
    windows += [(40 + i, input_report(3, 8, 1e9, 1e9, storage_bytes=big)) for i in range(1100)]
    with app.state.sessionmaker() as session:
        for i, (step, stats) in enumerate(windows):
            input_stats_data.record(session, run, step, InputStatsReport.model_validate(stats))
            if i < 10 or i % 100 == 0 or i == len(windows) - 1:
                kept = input_stats_data.running_aggregates(session, 10)
                assert kept == [_from_rank_rows(session, run)], (step, stats["rank"])
        session.commit()
    assert kept[0].storage_bytes == 2**62 and kept[0].data_wait_s == 1e12
    assert kept[0].world_size == 8 and kept[0].verdict == "io_bound"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0010_counts_existing_runs_from_their_ranks(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = make_engine(url)
    try:
        upgrade(engine, "0009_ledger_acceptance")
        ranks = [  # run 1: three ranks (one past a bound, as an older server summed)
            (1, 0, 4, "io_bound", {"data_wait_s": 3.0, "step_s": 1.0, "storage_bytes": 5}),
            (1, 1, 4, "cpu_bound", {"data_wait_s": 1.5, "step_s": 2.0, "retries": 2}),
            (1, 2, 8, "not_input_bound", {"data_wait_s": 2e12, "storage_bytes": 2**63 - 1}),
            (2, 0, 1, "unknown", {"data_wait_s": 0.0, "step_s": 0.0, "cache_hits": 4}),
        ]
        with engine.begin() as conn:
            for run in (1, 2, 3):  # run 3: no rank reported
                conn.execute(
                    text(
                        "INSERT INTO runs (id, seed, global_batch_size, plan, status, "
                        "created_by, created_at, updated_at) VALUES (:id, 1, 8, '{}', "
                        "'running', 'admin', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"id": run},
                )
            for run, rank, world, verdict, total in ranks:
                conn.execute(
                    text(
                        "INSERT INTO run_input_stats (run_id, rank, world_size, step, verdict, "
                        "wait_share, latest, total, history, updated_at) VALUES (:run, "
                        ":rank, :world, 10, :verdict, 0.5, '{}', :total, '[]', "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {
                        "run": run,
                        "rank": rank,
                        "world": world,
                        "verdict": verdict,
                        "total": json.dumps(total),
                    },
                )
        assert upgrade(engine, "0010_run_input_totals") == (
            "0009_ledger_acceptance",
            "0010_run_input_totals",
        )
        with Session(engine) as session:
            got = {a.run_id: a for a in input_stats_data.running_aggregates(session, 10)}
            assert sorted(got) == [1, 2]
            assert got == {run: _from_rank_rows(session, run) for run in (1, 2)}
            assert got[1].ranks == 3 and got[1].world_size == 8 and got[1].verdict == "io_bound"
            assert got[1].data_wait_s == 1e12 and got[1].storage_bytes == 2**62
            assert got[2].cache_hits == 4 and got[2].verdict == "unknown"
            # The next commit adds to the migrated row.
            input_stats_data.record(
                session, 1, 20, InputStatsReport.model_validate(input_report(1, 4, 1.0, 1.0))
            )
            session.commit()
            again = input_stats_data.running_aggregates(session, 10)[0]
            assert again == _from_rank_rows(session, 1) and again.ranks == 3
            assert again.step_s == 4.0 and again.storage_bytes == 2**62
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0009_ledger_acceptance")
        assert current_revision(engine) == "0009_ledger_acceptance"
        assert "run_input_totals" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_ranks_committing_at_once_lose_no_window(postgres_url: str) -> None:
    """Eight ranks' commits in eight transactions at once (PostgreSQL, several replicas'
    case): the run's row counts every window, as its ranks' rows do."""
    engine = make_engine(postgres_url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO runs (id, seed, global_batch_size, plan, status, created_by, "
                    "created_at, updated_at) VALUES (1, 1, 8, '{}', 'running', 'admin', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        ranks = 8
        verdicts = {10: "io_bound", 20: "not_input_bound", 30: "cpu_bound"}
        start = threading.Barrier(ranks, timeout=120)  # a rank that failed breaks it

        def rank_commits(rank: int) -> None:
            for step in (10, 20, 30):
                stats = input_report(rank, ranks, 1.0 + rank, 2.0, verdict=verdicts[step])
                start.wait()
                with Session(engine) as session, session.begin():
                    input_stats_data.record(
                        session, 1, step, InputStatsReport.model_validate(stats)
                    )

        with ThreadPoolExecutor(ranks) as pool:
            list(pool.map(rank_commits, range(ranks)))
        with Session(engine) as session:
            kept = input_stats_data.running_aggregates(session, 10)
            assert kept == [_from_rank_rows(session, 1)]
        assert kept[0].ranks == ranks and kept[0].data_wait_s == 3 * sum(range(1, 9))
        assert kept[0].input_bound_ranks == ranks and kept[0].verdict == "cpu_bound"
    finally:
        engine.dispose()
