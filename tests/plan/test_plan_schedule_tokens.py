"""Mixture schedules in tokens: a phase that ends at a count of tokens ends at the step that
reaches it (``ceil(tokens / tokens_per_step)``), so the plan stays the pure step arithmetic;
the tokens per step are a plan parameter (state, fingerprint), and every misuse is one
clear error."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError
from shardstream.plan import (
    MixtureSchedule,
    Phase,
    PlanConfig,
    ScheduledPlan,
    SourceSpec,
    plan_fingerprint,
)

SOURCES = [SourceSpec(shard_sizes=np.full(8, 25), name="web@v1"),
           SourceSpec(shard_sizes=np.full(4, 25), name="code@v1")]  # fmt: skip


def _tokens_per_step(global_batch: int, group: int, rows: int, seq_len: int) -> int:
    """A step packed at read time: ``global_batch / group`` groups of ``rows`` rows."""
    return global_batch // group * rows * seq_len


@pytest.mark.parametrize(
    ("global_batch", "group", "rows", "seq_len"),
    [(8, 2, 3, 48), (8, 8, 5, 48), (16, 4, 3, 64), (12, 3, 1, 2048), (32, 32, 64, 4096)],
)
def test_token_ends_land_on_the_step_that_reaches_them(
    global_batch: int, group: int, rows: int, seq_len: int
) -> None:
    per = _tokens_per_step(global_batch, group, rows, seq_len)
    ends_in_tokens = [3 * per - 1, 3 * per, 3 * per + 1, 7 * per]
    for first, second in itertools.pairwise(ends_in_tokens):
        if -(-first // per) == -(-second // per):
            continue  # within one step: refused (tested below)
        schedule = MixtureSchedule(
            [
                Phase(until_tokens=first, weights=(1, 0)),
                Phase(until_tokens=second, weights=(1, 1)),
                Phase(weights=(0, 1)),
            ],
            tokens_per_step=per,
        )
        ends = schedule.step_ends()
        assert ends == (-(-first // per), -(-second // per), None)
        # The phase's tokens are all at its weights: its last step reaches its end, the
        # step before does not.
        for tokens, end in zip((first, second), ends, strict=False):
            assert end is not None and (end - 1) * per < tokens <= end * per


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    per=st.integers(1, 10**7),
    gaps=st.lists(st.integers(1, 10**9), min_size=1, max_size=5),
)
def test_token_ends_are_the_steps_reaching_them_or_one_clear_error(
    per: int, gaps: list[int]
) -> None:
    ends = list(np.cumsum(gaps).tolist())
    phases = [Phase(until_tokens=t, weights=(1, i)) for i, t in enumerate(ends)]
    steps = [-(-t // per) for t in ends]
    if len(set(steps)) < len(steps):
        with pytest.raises(PlanError, match="no step of its own"):
            MixtureSchedule([*phases, Phase(weights=(0, 1))], tokens_per_step=per)
        return
    schedule = MixtureSchedule([*phases, Phase(weights=(0, 1))], tokens_per_step=per)
    assert schedule.step_ends() == (*steps, None)
    assert [start for start, _ in schedule.pieces()] == [0, *steps]


@pytest.mark.parametrize(("global_batch", "per_row"), [(8, 48), (16, 48), (16, 100), (24, 7)])
def test_the_plan_under_tokens_is_the_plan_under_the_steps_they_reach(
    global_batch: int, per_row: int
) -> None:
    """Boundaries in tokens cut the epoch where the equivalent step schedule does, on every
    global batch size, and every world size reads those same global batches."""
    per = global_batch * per_row  # e.g. fixed-length rows: a step is B x seq_len tokens
    tokens = MixtureSchedule(
        [
            Phase(until_tokens=2 * per + 1, weights=(4, 1)),  # reaches into step 2
            Phase(until_tokens=6 * per, weights=(4, 1), end_weights=(1, 4), steps=2),
            Phase(weights=(1, 4)),
        ],
        tokens_per_step=per,
    )
    steps = MixtureSchedule(
        [
            Phase(until=3, weights=(4, 1)),
            Phase(until=6, weights=(4, 1), end_weights=(1, 4), steps=2),
            Phase(weights=(1, 4)),
        ]
    )
    assert tokens.in_steps() == steps and tokens.pieces() == steps.pieces()
    cfg = PlanConfig(seed=3, global_batch_size=global_batch, num_partitions=2, epoch_size=240)
    for epoch in (0, 1):
        a = ScheduledPlan(SOURCES, cfg, epoch, tokens)
        b = ScheduledPlan(SOURCES, cfg, epoch, steps)
        assert a.segment_starts.tolist() == b.segment_starts.tolist()
        want = a.global_batches(0, a.num_batches)
        assert np.array_equal(want, b.global_batches(0, b.num_batches))
        for world in (w for w in (1, 2, 4, 8) if global_batch % w == 0):
            ranks = [a.rank_batches(np.arange(a.num_batches), r, world) for r in range(world)]
            assert np.array_equal(np.concatenate(ranks, axis=1).reshape(-1), want)


def test_the_tokens_per_step_are_part_of_the_params_and_the_fingerprint() -> None:
    schedule = MixtureSchedule([Phase(until_tokens=5000, weights=(3, 1)), Phase(weights=(1, 3))])
    resolved = schedule.with_tokens_per_step(768)
    params = resolved.to_params()
    assert params == {
        "tokens_per_step": 768,
        "phases": [
            {"weights": [3.0, 1.0], "until_tokens": 5000},
            {"weights": [1.0, 3.0], "until_tokens": None},
        ],
    }
    assert MixtureSchedule.from_params(params) == resolved
    assert MixtureSchedule.from_params(schedule.to_params()) == schedule
    cfg = PlanConfig(seed=0, global_batch_size=8)
    prints = {
        plan_fingerprint(2, cfg, SOURCES, s)
        for s in (
            resolved,
            schedule.with_tokens_per_step(1024),
            MixtureSchedule([Phase(until=7, weights=(3, 1)), Phase(weights=(1, 3))]),
        )
    }
    assert len(prints) == 3
    # A schedule in steps saves and hashes as it always did (earlier states still resume).
    steps = MixtureSchedule([Phase(until=7, weights=(3, 1)), Phase(weights=(1, 3))])
    assert steps.to_params() == [
        {"weights": [3.0, 1.0], "until": 7},
        {"weights": [1.0, 3.0], "until": None},
    ]
    assert steps.with_tokens_per_step(768) is steps


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Phase(weights=(1,), until=5, until_tokens=5000), "both until=5"),
        (lambda: Phase(weights=(1,), until_tokens=0), "until_tokens must be an integer >= 1"),
        (lambda: Phase(weights=(1,), until_tokens=2.5e9), "until_tokens must be an integer"),
        (
            lambda: MixtureSchedule(
                [Phase(until_tokens=100, weights=(1,)), Phase(until=5, weights=(1,))]
            ),
            "phase 1 ends by until but phase 0 by until_tokens",
        ),
        (
            lambda: MixtureSchedule(
                [Phase(until_tokens=100, weights=(1,)), Phase(until_tokens=100, weights=(1,))]
            ),
            "increasing tokens",
        ),
        (
            lambda: MixtureSchedule([Phase(weights=(1,)), Phase(until_tokens=9, weights=(1,))]),
            "no 'until' \\(nor 'until_tokens'\\)",
        ),
        (
            lambda: MixtureSchedule(
                [Phase(until_tokens=100, weights=(1,)), Phase(until_tokens=120, weights=(1,))],
                tokens_per_step=64,
            ),
            "phase 1 ends at token 120, within the previous phase's last step \\(1, at 64",
        ),
        (
            lambda: MixtureSchedule([Phase(until=5, weights=(1,))], tokens_per_step=64),
            "no phase ends by tokens",
        ),
        (
            lambda: MixtureSchedule([Phase(until_tokens=5, weights=(1,))], tokens_per_step=0),
            "tokens_per_step must be an integer >= 1",
        ),
        (
            lambda: MixtureSchedule([Phase(until_tokens=5, weights=(1,))]).pieces(),
            "does not know the tokens a step consumes",
        ),
        (
            lambda: MixtureSchedule.from_params({"phases": [{"weights": [1]}]}),
            "fields \\['phases', 'tokens_per_step'\\]",
        ),
    ],
)
def test_bad_token_schedules_are_one_clear_error(make: object, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make()  # type: ignore[operator]


def test_a_plan_needs_the_tokens_per_step() -> None:
    schedule = MixtureSchedule([Phase(until_tokens=500, weights=(1, 0)), Phase(weights=(0, 1))])
    with pytest.raises(PlanError, match="tokens_per_step=global batch rows x seq_len"):
        ScheduledPlan(SOURCES, PlanConfig(seed=0, global_batch_size=8), 0, schedule)
