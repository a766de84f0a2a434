"""Proof of resume with read-time packing and a mixture schedule (DESIGN §3 properties 8
and 9, §4): a real 2-rank gloo job over two document sources, packed at read time, whose
mixture weights change at step 30 (then ramp until 40) is SIGKILLed before the change and
resumed on 1 rank x 2 workers and on 4 ranks x 1 worker. The documents each step consumes
(the ids) and the packed rows each step trains on (tokens and restarting positions) equal
the uninterrupted run's, across the schedule's boundaries; see :mod:`tests.harness`.

The schedule is given twice: by steps, and by tokens consumed (issue 26: 768 tokens a
step with a fixed number of packed rows, so the first 22,941 tokens end at step 30 and
30,720 at step 40); the state of the latter records its tokens a step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from shardstream.client.state import ReaderState
from shardstream.mds import MDSWriter
from shardstream.plan import MixtureSchedule, Phase
from tests.harness.compare import check_elastic_resume, check_reference
from tests.harness.config import DataSettings, TrainerConfig
from tests.harness.records import AttemptLog, IdArray, checkpoint_path, load_checkpoint
from tests.harness.scenario import attempt, resume_state_dict, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

DOCS = 600  # per source
GLOBAL_BATCH = 16
EPOCH = 960  # documents an epoch: no source runs out, so each document is read at most once
STEPS = EPOCH // GLOBAL_BATCH  # 60
CKPT_EVERY = 10
KILL_AT = 25  # checkpoint 20: the resume crosses the boundaries at 30, 35 and 40
PACK = {"seq_len": 64, "rows": 3, "group": 4, "method": "first_fit", "eos_id": 0}
PER_STEP = GLOBAL_BATCH // 4 * 3 * 64  # 768 tokens a step, on every world size
SCHEDULES = {
    "steps": MixtureSchedule(
        [
            Phase(until=30, weights=(3, 1)),
            Phase(until=40, weights=(3, 1), end_weights=(1, 3), steps=2),
            Phase(weights=(1, 3)),
        ]
    ),
    "tokens": MixtureSchedule(
        [
            Phase(until_tokens=29 * PER_STEP + 69, weights=(3, 1)),  # reached in step 29
            Phase(until_tokens=40 * PER_STEP, weights=(3, 1), end_weights=(1, 3), steps=2),
            Phase(weights=(1, 3)),
        ]
    ),
}


@dataclass
class Fixture:
    root: Path
    sources: list[str]
    schedule: MixtureSchedule = SCHEDULES["steps"]
    refs: dict[int, AttemptLog] = field(default_factory=dict)

    def config(self, name: str, **changes: object) -> TrainerConfig:
        base = TrainerConfig(
            attempt_dir=str(self.root / name),
            data=DataSettings(
                source=self.sources[0],
                more_sources=self.sources[1:],
                global_batch_size=GLOBAL_BATCH,
                num_partitions=4,
                seed=77,
                cache_dir=str(self.root / "cache"),
                epoch_size=EPOCH,
                schedule=self.schedule.to_params(),  # in tokens: the reader sets the step
                pack=PACK,
            ),
            num_workers=2,
            checkpoint_every=CKPT_EVERY,
            step_sleep_s=0.02,
        )
        return attempt(base, name, **changes)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    root = tmp_path_factory.mktemp("packed-resume")
    rng = np.random.default_rng(3)
    sources = []
    for s in range(2):
        out = root / f"src{s}"
        with MDSWriter(out, {"tokens": "ndarray:uint32"}, size_limit=2 << 10) as writer:
            for doc in range(DOCS):
                n = int(np.clip(rng.lognormal(2.8, 0.8), 1, 150))
                tokens = np.arange(1, n + 1) + 1000 * doc + 10**6 * s  # 0 is the EOS
                writer.write({"tokens": tokens.astype(np.uint32)})
        sources.append(str(out))
    yield Fixture(root=root, sources=sources)


@pytest.fixture(params=sorted(SCHEDULES))
def run(request: pytest.FixtureRequest, fx: Fixture) -> Fixture:
    """The data of ``fx``, with the schedule by steps or by tokens (its own attempts)."""
    return Fixture(fx.root / request.param, fx.sources, schedule=SCHEDULES[request.param])


def _rows(log: AttemptLog, first: int, last: int) -> list[IdArray]:
    return [log.global_batch(s) for s in range(first, last + 1)]


@pytest.mark.slow
def test_packed_scheduled_run_killed_on_2_ranks_resumes_on_1_and_4(run: Fixture) -> None:
    fx = run
    ref_cfg = fx.config("ref-w2", step_sleep_s=0.0)
    ref = run_epoch(ref_cfg, 2)
    assert check_reference(ref, GLOBAL_BATCH) == STEPS
    ref_rows = AttemptLog.read(Path(ref_cfg.attempt_dir), 2, rows=True)
    # The schedule took effect: source 1's documents are a quarter of the first 30 steps
    # and three quarters of the last 20 (ids of source 1 are those past source 0's DOCS).
    share = [float(np.mean(ref.global_batch(s) >= DOCS)) for s in range(1, STEPS + 1)]
    assert np.mean(share[:30]) == pytest.approx(0.25, abs=0.01)
    assert np.mean(share[40:]) == pytest.approx(0.75, abs=0.01)

    killed_cfg = fx.config("killed-w2")
    killed = run_and_kill(killed_cfg, 2, kill_at_step=KILL_AT)
    assert killed.checkpoint_step < 30
    saved = load_checkpoint(
        checkpoint_path(Path(killed_cfg.attempt_dir), killed.checkpoint_step, 0)
    )
    plan = ReaderState.from_stateful_loader(saved).plan  # a step size in tokens is in the state
    expected = fx.schedule
    if expected.in_tokens:
        expected = expected.with_tokens_per_step(PER_STEP)
    assert plan["schedule"] == expected.to_params()
    killed_rows = AttemptLog.read(Path(killed_cfg.attempt_dir), 2, rows=True)
    last = killed.log.last_common_step()
    for want, got in zip(_rows(ref_rows, 1, last), _rows(killed_rows, 1, last), strict=True):
        np.testing.assert_array_equal(got, want)

    resume = resume_state_dict(killed_cfg, killed)
    for world, workers in ((1, 2), (4, 1)):
        cfg = fx.config(f"resumed-w{world}", num_workers=workers, resume_state_dict=resume)
        resumed = run_epoch(cfg, world)
        report = check_elastic_resume(ref, killed.log, resumed, killed.checkpoint_step, 16)
        assert report.total_steps == STEPS
        rows = AttemptLog.read(Path(cfg.attempt_dir), world, rows=True)
        first = killed.checkpoint_step + 1
        for step, (want, got) in enumerate(
            zip(_rows(ref_rows, first, STEPS), _rows(rows, first, STEPS), strict=True), first
        ):
            assert np.array_equal(got, want), f"packed rows of step {step} on {world} ranks"
