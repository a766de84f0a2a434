"""The elastic resume's evidence: rank logs stitched into global batches and checked.

A rank's log holds one ``step ids`` line per step (a line cut by SIGKILL is ignored). Global
batch ``k`` is the ranks' step-``k`` ids in rank order: the ranks of the first job for the
steps up to the checkpoint it resumed from, the ranks of the resumed job after it. The
checks are the design's promise for a resume on another world size (docs/plan.md): every
rank got an equal share of every batch, every sample of the epoch was read exactly once,
and the global order is the uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

Batches = dict[int, list[int]]
"""Step -> the sample ids read at that step."""


def read_ids_log(path: Path) -> Batches:
    """The complete ``step ids`` lines of a log (with or without a loss column between)."""
    out: Batches = {}
    if not path.exists():
        return out
    text = path.read_text()
    lines = text.split("\n")[:-1]  # the part after the last newline is cut or empty
    for line in lines:
        parts = line.split(" ")
        out[int(parts[0])] = [int(i) for i in parts[-1].split(",")]
    return out


def last_step(logs: list[Path]) -> int:
    """The last step every one of ``logs`` has completed (0 before any)."""
    steps = []
    for log in logs:
        batches = read_ids_log(log)
        steps.append(max(batches, default=0))
    return min(steps, default=0)


def digest(batches: Batches, steps: range) -> str:
    """A short fingerprint of the sample ids of ``steps``, in order."""
    joined = "\n".join(",".join(map(str, batches.get(s, []))) for s in steps)
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ElasticEvidence:
    """What the elastic resume read, compared with the uninterrupted epoch.

    ``epoch_steps`` global batches of ``global_batch`` samples make the epoch (of the
    dataset's ``dataset_samples``; the rest do not fill a batch and are dropped).
    ``distinct`` of the ``samples_read`` ids differ; ``missing`` ids of the epoch were not
    read, ``unexpected`` ids were read that the epoch does not hold.
    """

    ranks_before: int
    ranks_after: int
    global_batch: int
    dataset_samples: int
    epoch_steps: int
    killed_at: int
    checkpoint: int
    samples_before: int
    samples_after: int
    samples_read: int
    distinct: int
    missing: int
    unexpected: int
    equal_shares: bool
    same_order: bool
    digest_uninterrupted: str
    digest_resumed: str

    @property
    def duplicates(self) -> int:
        """Samples read more than once."""
        return self.samples_read - self.distinct

    @property
    def ok(self) -> bool:
        """Every sample of the epoch once, each rank its share, the uninterrupted order."""
        return (
            self.samples_read == self.epoch_steps * self.global_batch
            and self.duplicates == 0
            and self.missing == 0
            and self.unexpected == 0
            and self.equal_shares
            and self.same_order
        )

    def write(self, path: Path) -> None:
        """The evidence as JSON, with the derived counts and the verdict."""
        record = {**asdict(self), "duplicates": self.duplicates, "verdict": self._verdict()}
        path.write_text(json.dumps(record, indent=2) + "\n")

    def _verdict(self) -> str:
        return "OK" if self.ok else "FAILED"


def check_elastic(
    reference: Batches,
    before: list[Batches],
    after: list[Batches],
    *,
    checkpoint: int,
    killed_at: int,
    global_batch: int,
    dataset_samples: int,
) -> ElasticEvidence:
    """Stitch the first job's ranks (steps up to ``checkpoint``) and the resumed job's
    ranks (the rest of the epoch) and compare them with the uninterrupted ``reference``."""
    steps = len(reference)
    epoch = range(1, steps + 1)
    stitched: Batches = {}
    equal_shares = True
    spans = ((before, range(1, checkpoint + 1)), (after, range(checkpoint + 1, steps + 1)))
    for ranks, span in spans:
        share = global_batch // len(ranks)
        for step in span:
            parts = [rank.get(step) for rank in ranks]
            if any(p is None or len(p) != share for p in parts):
                equal_shares = False  # a rank missed the step or read another share
            stitched[step] = [i for p in parts for i in p or []]
    read = [i for s in epoch for i in stitched[s]]
    seen, wanted = set(read), {i for s in epoch for i in reference[s]}
    n_before = sum(len(stitched[s]) for s in range(1, checkpoint + 1))
    return ElasticEvidence(
        ranks_before=len(before),
        ranks_after=len(after),
        global_batch=global_batch,
        dataset_samples=dataset_samples,
        epoch_steps=steps,
        killed_at=killed_at,
        checkpoint=checkpoint,
        samples_before=n_before,
        samples_after=len(read) - n_before,
        samples_read=len(read),
        distinct=len(seen),
        missing=len(wanted - seen),
        unexpected=len(seen - wanted),
        equal_shares=equal_shares,
        same_order=all(stitched[s] == reference[s] for s in epoch),
        digest_uninterrupted=digest(reference, epoch),
        digest_resumed=digest(stitched, epoch),
    )
