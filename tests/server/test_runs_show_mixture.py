"""``APIClient.run_mixture`` and ``shardstream runs show``'s mixture table against a real
uvicorn server: each source's share of the recent windows beside its planned weight, phase
ends in tokens for a schedule in tokens, nothing for a run without a schedule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.api_client._mixture_view import RECENT_WINDOWS, mixture_lines
from shardstream.cli import main
from shardstream.mds import MDSWriter, load_index
from shardstream.plan import MixtureSchedule, Phase
from shardstream.wire import RunMixtureHistory
from tests.fixtures.server import LiveServer

COLUMNS = {"tokens": "ndarray:uint16:2048"}
PER_STEP = 4 * 2048  # a global batch of 4 rows of 2048 tokens

# 3:1 for the first 10 steps' tokens (ends at step 10: rounded up), then 1:3.
SCHEDULE = MixtureSchedule(
    [Phase(until_tokens=10 * PER_STEP - 100, weights=(3, 1)), Phase(weights=(1, 3))],
    tokens_per_step=PER_STEP,
)


def _publish(api: APIClient, root: Path, name: str) -> None:
    folder = root / name
    with MDSWriter(folder, COLUMNS) as writer:
        for i in range(40):
            writer.write({"tokens": np.full(2048, i, np.uint16)})
    from shardstream.shard_builder.publish import DraftVersion

    with DraftVersion(api, name, columns=COLUMNS, storage_root=str(folder)) as draft:
        draft.add_index(load_index(folder / "index.json"))
        draft.publish()


def _plan(schedule: MixtureSchedule | None) -> dict[str, object]:
    params: dict[str, object] = {"global_batch_size": 4, "tail": "drop", "epoch_size": 80}
    if schedule is not None:
        params["schedule"] = schedule.to_params()
    return {"plan": params, "world_size": 1}


def test_runs_show_prints_the_recent_windows_beside_the_planned_weights(
    live_server: LiveServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSTREAM_SERVER", live_server.url)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient() as api:
        for name in ("web", "code"):
            _publish(api, live_server.storage_root, name)
        run = api.create_run([("web", 1), ("code", 1)], global_batch_size=4, name="mix")
        plain = api.create_run([("web", 1), ("code", 1)], global_batch_size=4, name="plain")
        for step in range(1, 19):
            api.commit_checkpoint(
                run.id, step=step, epoch=0, sample_in_epoch=4 * step, plan=_plan(SCHEDULE)
            )
        api.commit_checkpoint(plain.id, step=1, epoch=0, sample_in_epoch=4, plan=_plan(None))
        history = api.run_mixture(run.id)
        assert isinstance(history, RunMixtureHistory) and history.scheduled
        assert history.step == 18 and history.phase_ends == [10]
        assert history.phase_end_tokens == [10 * PER_STEP - 100]
        assert history.tokens_per_step == PER_STEP
        assert [w.samples for w in history.windows] == [[3, 1]] * 10 + [[1, 3]] * 8
        assert api.run_mixture(plain.id).scheduled is False
    capsys.readouterr()

    assert main(["runs", "show", str(run.id)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("mixture:"))
    assert head == (
        "mixture: phases end at 81.82K tokens (step 10); now at 147.456K tokens (step 18); "
        "windows of 1 step"
    )
    table = lines[lines.index(head) + 3 :]
    assert table[0].split() == ["steps", "web", "v1", "code", "v1"]
    rows = table[1 : 1 + RECENT_WINDOWS]
    assert [row.split()[0] for row in rows] == [f"{s}-{s + 1}" for s in range(10, 18)]
    # After the phase change web has 1 of 4 samples (and tokens: the same length), as planned.
    assert all(row.split()[1:] == ["25.0%", "/", "25.0%", "(25.0%)", "75.0%", "/", "75.0%",
                                   "(75.0%)"] for row in rows)  # fmt: skip
    assert table[1 + RECENT_WINDOWS] == "... 10 earlier windows (--json lists them all)"

    assert main(["runs", "show", str(run.id), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["mixture"]["windows"]) == 18
    assert shown["mixture"]["phase_end_tokens"] == [10 * PER_STEP - 100]

    assert main(["runs", "show", str(plain.id)]) == 0
    assert "mixture:" not in capsys.readouterr().out  # no schedule: no section


def test_the_table_words_steps_open_windows_and_many_sources() -> None:
    sources = [f"s{i}" for i in range(10)]
    window = {"samples": list(range(1, 11)), "planned": [0.1] * 10}
    history = RunMixtureHistory(
        run_id=1,
        sources=sources,
        scheduled=True,
        step=12,
        window_steps=4,
        tokens_per_sample=[None] * 10,
        phase_ends=[8],
        windows=[
            {"start": 0, "stop": 4, **window},
            {"start": 4, "stop": 8, **window},
            {"start": 8, "stop": 12, **window},
            {"start": 12, "stop": 13, "open": True, **window},
        ],
    )
    lines = mixture_lines(history)
    assert lines[0] == "mixture: phases end at step 8; now at step 12; windows of 4 steps"
    assert lines[1] == "each source's share of samples (planned) in the latest windows:"
    # The 8 largest sources, in the run's order; no token shares without tokens.
    assert lines[3].split() == ["steps", *(f"s{i}" for i in range(2, 10))]
    assert lines[4].split()[:3] == ["0-4", "5.5%", "(10.0%)"]
    assert lines[7].startswith("12-13 (so far)")
    assert lines[-1] == "... 2 more sources (--json lists them all)"
    assert mixture_lines(history.model_copy(update={"scheduled": False})) == []
    before = history.model_copy(update={"step": None, "windows": []})
    assert mixture_lines(before) == ["mixture: phases end at step 8; no checkpoint yet"]
