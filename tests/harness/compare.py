"""The resume checks: compare an interrupted + resumed epoch with an uninterrupted one.

Vocabulary (steps count from 1; step ``s`` consumed global batch ``s - 1``):

* ``reference``: the uninterrupted run, steps ``1 .. N``.
* ``killed``: the run that was SIGKILLed; rank ``r`` completed steps ``1 .. K_r``.
* ``S``: the checkpoint step the restart resumed from (``S <= min K_r``). The trainer's
  checkpoint is the source of truth, so what the killed run consumed in steps
  ``S + 1 .. K_r`` is *re-consumed* after the restart; that is correct, and checked:
  the restart must consume exactly those samples again at those steps.
* ``resumed``: the restart; every rank logs steps ``S + 1 .. N``.

The consumed epoch is then ``killed[1 .. S] + resumed[S + 1 .. N]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.harness.records import AttemptLog, IdArray


@dataclass(frozen=True)
class ResumeReport:
    """Numbers a test can print or assert on."""

    checkpoint_step: int
    killed_at: tuple[int, ...]  # last complete step per rank of the killed run
    total_steps: int
    reconsumed_samples: int  # consumed after the checkpoint, before the kill, then again


def _first_difference(a: IdArray, b: IdArray) -> str:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    at = int(diff[0]) if len(diff) else n
    return (
        f"lengths {len(a)} vs {len(b)}; first difference at position {at}: "
        f"{a[at : at + 5].tolist()} vs {b[at : at + 5].tolist()}"
    )


def check_reference(ref: AttemptLog, samples_per_step: int) -> int:
    """The uninterrupted run itself: equal steps on all ranks, every sample at most once.

    Returns its number of steps ``N``.
    """
    steps = {tuple(ref.steps(r)) for r in range(ref.world_size)}
    assert len(steps) == 1, f"ranks of the reference run logged different steps: {steps}"
    n = ref.last_common_step()
    assert n > 0 and ref.first_step() == 1
    everything = np.concatenate([ref.global_batch(s) for s in range(1, n + 1)])
    assert len(everything) == n * samples_per_step, "a global batch has the wrong size"
    assert len(np.unique(everything)) == len(everything), "the reference consumed a sample twice"
    return n


def _check_killed_prefix(ref: AttemptLog, killed: AttemptLog, n: int, step: int) -> None:
    """The killed run up to its kill is the reference run (same world size) and mid-epoch."""
    for r in range(killed.world_size):
        last = max(killed.steps(r), default=0)
        assert step <= last < n, (
            f"rank {r} of the killed run stopped at step {last}; the kill must land after "
            f"checkpoint step {step} and before the epoch's end (step {n})"
        )
        if ref.world_size == killed.world_size:
            got = killed.rank_sequence(r, 1, last)
            want = ref.rank_sequence(r, 1, last)
            assert np.array_equal(got, want), (
                f"rank {r}: the killed run diverged from the reference before the kill: "
                + _first_difference(got, want)
            )


def _check_resumed_steps(resumed: AttemptLog, step: int, n: int) -> None:
    for r in range(resumed.world_size):
        steps = resumed.steps(r)
        assert steps == list(range(step + 1, n + 1)), (
            f"rank {r} of the resumed run logged steps {steps[:3]}..{steps[-3:]}; expected "
            f"{step + 1}..{n} (resume after checkpoint step {step}, finish the epoch)"
        )


def _reconsumed(killed: AttemptLog, resumed: AttemptLog, step: int) -> int:
    """Samples the killed run consumed after checkpoint ``step``: the restart must consume
    the same ones again at the same steps (same world size) / in the same global batches."""
    count = 0
    last_all = killed.last_common_step()
    for s in range(step + 1, last_all + 1):
        if killed.world_size == resumed.world_size:
            for r in range(killed.world_size):
                got, want = resumed.ranks[r][s], killed.ranks[r][s]
                assert np.array_equal(got, want), (
                    f"rank {r} step {s}: consumed before the kill and re-consumed after "
                    f"the resume must match: {_first_difference(got, want)}"
                )
        else:
            got, want = resumed.global_batch(s), killed.global_batch(s)
            assert np.array_equal(got, want), (
                f"global batch of step {s} before the kill vs after the resume: "
                + _first_difference(got, want)
            )
        count += len(killed.global_batch(s))
    return count


def check_same_world_resume(
    ref: AttemptLog, killed: AttemptLog, resumed: AttemptLog, step: int, samples_per_step: int
) -> ResumeReport:
    """Same world size: per rank, ``killed[1..S] + resumed[S+1..N]`` equals ``ref[1..N]``."""
    assert ref.world_size == killed.world_size == resumed.world_size
    n = check_reference(ref, samples_per_step)
    _check_killed_prefix(ref, killed, n, step)
    _check_resumed_steps(resumed, step, n)
    for r in range(ref.world_size):
        got = np.concatenate(
            [killed.rank_sequence(r, 1, step), resumed.rank_sequence(r, step + 1, n)]
        )
        want = ref.rank_sequence(r, 1, n)
        assert np.array_equal(got, want), (
            f"rank {r}: consumed sequence (killed up to step {step} + resumed) differs from "
            f"the uninterrupted run: {_first_difference(got, want)}"
        )
    return ResumeReport(
        checkpoint_step=step,
        killed_at=tuple(max(killed.steps(r), default=0) for r in range(killed.world_size)),
        total_steps=n,
        reconsumed_samples=_reconsumed(killed, resumed, step),
    )


def check_elastic_resume(
    ref: AttemptLog, killed: AttemptLog, resumed: AttemptLog, step: int, samples_per_step: int
) -> ResumeReport:
    """Any world sizes: the global order (per step, the ranks' batches in rank order) of
    ``killed[1..S] + resumed[S+1..N]`` equals the reference's, and every sample the epoch
    consumed is consumed exactly once."""
    n = check_reference(ref, samples_per_step)
    _check_killed_prefix(ref, killed, n, step)
    _check_resumed_steps(resumed, step, n)
    batches = [killed.global_batch(s) for s in range(1, step + 1)]
    batches += [resumed.global_batch(s) for s in range(step + 1, n + 1)]
    for s, got in enumerate(batches, start=1):
        want = ref.global_batch(s)
        if not np.array_equal(got, want):
            same_set = np.array_equal(np.sort(got), np.sort(want))
            raise AssertionError(
                f"global batch of step {s} ({'resumed' if s > step else 'killed'} run, "
                f"{'same samples, other order' if same_set else 'different samples'}) "
                f"differs from the uninterrupted run: {_first_difference(got, want)}"
            )
    everything = np.concatenate(batches)
    ids, counts = np.unique(everything, return_counts=True)
    assert counts.max() == 1, f"samples consumed twice over the epoch: {ids[counts > 1][:10]}"
    assert len(everything) == n * samples_per_step
    return ResumeReport(
        checkpoint_step=step,
        killed_at=tuple(max(killed.steps(r), default=0) for r in range(killed.world_size)),
        total_steps=n,
        reconsumed_samples=_reconsumed(killed, resumed, step),
    )
