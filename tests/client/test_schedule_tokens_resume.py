"""Mixture schedules in tokens through the reader: a phase ends at the step whose tokens
reach its end (packed rows of a fixed count, or fixed-length token rows), the tokens per
step are recorded in the resume state, a resume inside a phase on another world size
continues with exactly the batches of an uninterrupted run, and a reader whose steps'
tokens vary is refused with the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PackOptions,
    PlanOptions,
    StreamingDataset,
    Topology,
)
from shardstream.errors import ConfigError, ResumeError
from shardstream.plan import MixtureSchedule, Phase
from tests.fixtures.datasets import TOKENS, write_documents, write_tokens

GLOBAL_BATCH = 8
PACK = PackOptions(seq_len=48, rows=3, group=2)
PER_STEP = GLOBAL_BATCH // 2 * 3 * 48  # 4 groups of 3 rows of 48: 576 tokens a step
SCHEDULE = MixtureSchedule(
    [
        Phase(until_tokens=5 * PER_STEP + 1, weights=(1.0, 0.0)),  # steps 0-5: web only
        Phase(until_tokens=14 * PER_STEP, weights=(3, 1), end_weights=(1, 3), steps=4),
        Phase(weights=(1.0, 3.0)),
    ]
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two document sources, ``web`` (tokens < 10**6) and ``code`` (tokens >= 10**6)."""
    out = []
    rng = np.random.default_rng(5)
    for s, name in enumerate(("web", "code")):
        path = tmp_path_factory.mktemp(name)
        write_documents(path, s, rng)
        out.append(str(path))
    return out


def _dataset(
    sources: list[str], cache: Path, world: int, rank: int, *,
    pack: PackOptions | None = PACK, schedule: MixtureSchedule = SCHEDULE,
) -> StreamingDataset:  # fmt: skip
    return StreamingDataset(
        sources,
        batch_size=GLOBAL_BATCH // world,
        plan=PlanOptions(seed=9, num_partitions=2, schedule=schedule),
        cache=CacheOptions(dir=cache),
        decode=DecodeOptions(sample_ids=True),
        topology=Topology(rank=rank, world_size=world),
        pack=pack,
    )


def _steps(
    sources: list[str], cache: Path, world: int, state: dict[str, Any] | None = None
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Every global step's packed rows and document ids (ranks concatenated)."""
    per_rank = []
    for rank in range(world):
        ds = _dataset(sources, cache, world, rank)
        if state is not None:
            ds.load_state_dict(state)
        per_rank.append([{k: v.numpy() for k, v in b.items() if k != "cu_seqlens"} for b in ds])
    return [
        {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        for batches in zip(*per_rank, strict=True)
    ]


def test_the_phases_end_at_the_steps_their_tokens_reach(sources: list[str], tmp_path: Path) -> None:
    steps = _steps(sources, tmp_path / "c", 1)
    assert all(s["input_ids"].size == PER_STEP for s in steps)  # fixed rows: fixed tokens
    code = [float(np.mean(s["sample_id"] >= 200)) for s in steps]  # ids of code follow web's
    assert code[:6] == [0.0] * 6 and code[6] > 0  # the 5 x 576 + 1st token is in step 5
    assert np.mean(code[14:]) == pytest.approx(0.75, abs=0.02)
    for world in (1, 2, 4):
        state = _dataset(sources, tmp_path / "c", world, 0).state_dict()
        assert state["plan"]["schedule"] == {
            "tokens_per_step": PER_STEP,
            "phases": SCHEDULE.to_params()["phases"],  # type: ignore[call-overload]
        }


@pytest.mark.parametrize("cut", [3, 5, 6, 9, 14])
def test_a_resume_inside_a_phase_on_other_world_sizes_reads_the_same_rows(
    sources: list[str], tmp_path: Path, cut: int
) -> None:
    cache = tmp_path / "c"
    full = _steps(sources, cache, 1)
    ds = _dataset(sources, cache, 2, 1)
    it = iter(ds)
    for _ in range(cut):
        next(it)
    state = ds.state_dict()
    assert state["batch"] == cut
    for world in (1, 4):
        rest = _steps(sources, cache, world, state)
        assert len(rest) == len(full) - cut
        for step, (want, got) in enumerate(zip(full[cut:], rest, strict=True), cut):
            for key in want:
                np.testing.assert_array_equal(want[key], got[key], err_msg=f"{key} {step}")


def test_a_resume_with_other_phase_ends_or_rows_is_refused(
    sources: list[str], tmp_path: Path
) -> None:
    state = _dataset(sources, tmp_path / "c", 1, 0).state_dict()
    moved = MixtureSchedule(
        [Phase(until_tokens=7 * PER_STEP, weights=(1.0, 0.0)), *SCHEDULE.phases[1:]]
    )
    with pytest.raises(ResumeError, match="schedule"):
        _dataset(sources, tmp_path / "c", 1, 0, schedule=moved).load_state_dict(state)
    more_rows = PackOptions(seq_len=48, rows=4, group=2)  # 768 tokens a step
    with pytest.raises(ResumeError, match="tokens_per_step': 768"):
        _dataset(sources, tmp_path / "c", 1, 0, pack=more_rows).load_state_dict(state)


def test_steps_whose_tokens_vary_are_refused_with_the_fix(
    sources: list[str], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"varying length .*PackOptions\(seq_len=\.\.\., rows="):
        _dataset(sources, tmp_path / "c", 1, 0, pack=None)
    with pytest.raises(ConfigError, match=r"PackOptions\.rows is None"):
        _dataset(sources, tmp_path / "c", 1, 0, pack=PackOptions(seq_len=48, group=2))
    close = MixtureSchedule(
        [Phase(until_tokens=100, weights=(1, 0)), Phase(until_tokens=200, weights=(0, 1))]
    )
    with pytest.raises(ConfigError, match=r"PlanOptions\.schedule: .*no step of its own"):
        _dataset(sources, tmp_path / "c", 1, 0, schedule=close)


def test_fixed_length_rows_count_batch_x_length_tokens(tmp_path: Path) -> None:
    """Unpacked rows of a fixed length (``build text``): a step is ``B x seq_len``."""
    for name, first in (("a", 0), ("b", 1000)):
        write_tokens(tmp_path / name, 64, first_id=first)
    per_step = GLOBAL_BATCH * TOKENS
    schedule = MixtureSchedule(
        [Phase(until_tokens=3 * per_step, weights=(1, 0)), Phase(weights=(0, 1))]
    )
    ds = StreamingDataset(
        [str(tmp_path / "a"), str(tmp_path / "b")],
        batch_size=GLOBAL_BATCH,
        plan=PlanOptions(seed=2, schedule=schedule),
        cache=CacheOptions(dir=tmp_path / "c"),
    )
    ids = [batch["id"].numpy() for batch in ds]
    assert [bool((b >= 1000).any()) for b in ids[:5]] == [False, False, False, True, True]
    assert ds.state_dict()["plan"]["schedule"]["tokens_per_step"] == per_step
