"""``shardstream demo`` — the README's run command — works end to end on this machine.

Besides the demo's own verdicts, the test reads the evidence it leaves and checks the elastic
resume itself: the rank logs of the job killed on 2 ranks (up to its checkpoint) and of the
job resumed on 4 ranks, stitched rank by rank, are the uninterrupted run's epoch.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed


def ids_by_step(log: Path) -> dict[int, list[int]]:
    """``step [loss] ids`` lines; a last line cut by SIGKILL (no newline) is left out."""
    lines = log.read_text().split("\n")[:-1]
    return {int(p[0]): [int(i) for i in p[-1].split(",")] for p in (x.split() for x in lines)}


@dataclass(frozen=True)
class Demo:
    out: str
    work: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """One run of the demo (about half a minute), whose output and evidence both tests read."""
    work = tmp_path_factory.mktemp("demo") / "work"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardstream",
            "demo",
            "--workdir",
            str(work),
            "--steps",
            "60",
            "--kill-at",
            "35",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return Demo(result.stdout, work)


@pytest.mark.slow
def test_demo_resumes_exactly(demo: Demo) -> None:
    out, work = demo.out, demo.work
    digests = re.findall(r"(?:uninterrupted|killed \+ resumed) run\s+sha256 ([0-9a-f]{16})", out)
    assert len(digests) == 3 and digests[0] == digests[1], out  # + the elastic part's
    assert "OK: the resumed run consumed exactly the same samples" in out
    killed = re.search(
        r"SIGKILLed the trainer and its workers at step (\d+); last checkpoint: step (\d+)", out
    )
    assert killed, out
    kill_step, checkpoint = int(killed[1]), int(killed[2])
    assert 35 <= kill_step < 60 and checkpoint == kill_step // 10 * 10  # mid-run, committed
    # the published version and the run's checkpoints live in the server's SQLite file
    assert (work / "server").is_dir()
    # under the location the server chose: shards/<dataset>-<id>/v1
    assert len(list((work / "shards").glob("kjv-*/v1/shard.*.mds"))) > 1
    assert "demo passed" in out


@pytest.mark.slow
def test_demo_resumes_on_another_number_of_ranks(demo: Demo) -> None:
    """The elastic part's evidence file, and its rank logs checked here independently."""
    out, work = demo.out, demo.work
    assert "OK: resumed on 4 ranks instead of 2" in out
    evidence = json.loads((work / "elastic-resume.json").read_text())
    assert evidence["verdict"] == "OK", evidence
    assert (evidence["ranks_before"], evidence["ranks_after"]) == (2, 4)
    steps, batch = evidence["epoch_steps"], evidence["global_batch"]
    assert 0 < evidence["checkpoint"] <= evidence["killed_at"] < steps  # killed mid-epoch
    assert evidence["samples_read"] == evidence["distinct"] == steps * batch
    assert evidence["duplicates"] == evidence["missing"] == evidence["unexpected"] == 0

    reference = ids_by_step(work / "reference-epoch.log")
    assert sorted(reference) == list(range(1, steps + 1))
    trained = ids_by_step(work / "reference.log")  # the epoch log's first steps were trained
    assert all(reference[s] == trained[s] for s in trained)
    epoch = [i for s in range(1, steps + 1) for i in reference[s]]
    # the whole epoch, each sample once; what is left over does not fill a batch
    assert len(set(epoch)) == len(epoch) == steps * batch
    assert 0 <= evidence["dataset_samples"] - len(epoch) < batch
    assert set(epoch) <= set(range(evidence["dataset_samples"]))

    ckpt = evidence["checkpoint"]
    before = [ids_by_step(work / "elastic" / "2-ranks" / f"rank{r}.log") for r in range(2)]
    after = [ids_by_step(work / "elastic" / "4-ranks" / f"rank{r}.log") for r in range(4)]
    assert all(len(rank[s]) == batch // 2 for rank in before for s in range(1, ckpt + 1))
    assert all(sorted(rank) == list(range(ckpt + 1, steps + 1)) for rank in after)
    assert all(len(ids) == batch // 4 for rank in after for ids in rank.values())
    stitched = {s: [i for rank in before for i in rank[s]] for s in range(1, ckpt + 1)}
    stitched |= {s: [i for rank in after for i in rank[s]] for s in range(ckpt + 1, steps + 1)}
    assert [stitched[s] for s in range(1, steps + 1)] == [reference[s] for s in range(1, steps + 1)]


def _split(epoch: dict[int, list[int]], steps: range, ranks: int) -> list[dict[int, list[int]]]:
    """What ``ranks`` ranks log for ``steps``: rank r reads the r-th share of each batch."""
    share = len(epoch[1]) // ranks
    return [{s: epoch[s][r * share : (r + 1) * share] for s in steps} for r in range(ranks)]


def test_elastic_check_passes_only_the_uninterrupted_epoch_read_once() -> None:
    """The demo's verdict on synthetic rank logs: the true stitch passes; a resume that
    rereads a batch, skips one, or reads the right samples in another order fails."""
    from shardstream.demo.elastic_check import check_elastic

    epoch = {s: list(range((s - 1) * 8, s * 8)) for s in range(1, 11)}  # 10 batches of 8

    def check(after: list[dict[int, list[int]]]) -> bool:
        before = _split(epoch, range(1, 7), 2)  # killed after step 7, checkpoint 6
        evidence = check_elastic(
            epoch, before, after, checkpoint=6, killed_at=7, global_batch=8, dataset_samples=85
        )
        return evidence.ok

    assert check(_split(epoch, range(7, 11), 4))
    reread = {**epoch, 7: epoch[6]}  # resumed one batch early: batch 6 twice, batch 10 lost
    reread |= {s: epoch[s - 1] for s in range(8, 11)}
    assert not check(_split(reread, range(7, 11), 4))
    swapped = {**epoch, 7: epoch[8], 8: epoch[7]}  # every sample once, another order
    assert not check(_split(swapped, range(7, 11), 4))
    uneven = _split(epoch, range(7, 11), 4)
    uneven[0][9], uneven[1][9] = uneven[0][9] + uneven[1][9][:1], uneven[1][9][1:]
    assert not check(uneven)  # the right samples, but a rank read another rank's share


def test_a_server_that_cannot_start_is_one_error_line(tmp_path: Path) -> None:
    # The server's data folder is a file: the server exits at once. The demo says so in one
    # line, without a second traceback from stopping a process that is already gone.
    work = tmp_path / "work"
    work.mkdir()
    (work / "server").write_text("not a folder")
    run = subprocess.run(
        [sys.executable, "-m", "shardstream", "demo", "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1
    assert "error: the server exited with 1" in run.stderr
    assert "Traceback" not in run.stderr and "ProcessLookupError" not in run.stderr
