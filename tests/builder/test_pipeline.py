"""The builder's one pipeline (``shard_builder.pipeline``): a new kind supplies only its source
and its encoder, and gets ordering, the journal's resume and publishing from the pipeline.

The kind here is a toy (units of ten numbered samples, five samples a shard); everything it
runs through is the real pipeline: worker processes, sink, journal, progress, index,
``DraftVersion``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import InputError
from shardstream.mds import make_encoder
from shardstream.shard_builder.config import OutputOptions, content_options
from shardstream.shard_builder.journal import fingerprint
from shardstream.shard_builder.pipeline import BuildKind, BuildRun, run_build
from tests.builder.conftest import dir_bytes, read_with_ours
from tests.fixtures.server import LiveServer

COLUMNS = {"unit": "int", "i": "int"}
PER_UNIT, PER_SHARD = 10, 5


@dataclass(frozen=True)
class Unit:
    number: int
    nbytes: int = 100


def encode_unit(task: tuple[int, int]) -> list[bytes]:
    """The worker's step: unit ``task[0]``'s samples from ``task[1]`` on. Early units are
    slow, so with several workers later units finish first: order is the pipeline's job."""
    unit, skip = task
    time.sleep(0.05 if unit % 3 == 0 else 0)
    encode = make_encoder(COLUMNS)
    return [encode({"unit": unit, "i": i}) for i in range(skip, PER_UNIT)]


class CountKind(BuildKind):
    """The whole of a new kind: a source (numbered units) and an encoder (five a shard).
    ``kill_after`` stops the build after that many stored shards (a killed run)."""

    desc = "build counts"

    def __init__(self, config: OutputOptions, units: int = 7, kill_after: int = 0) -> None:
        super().__init__(config)
        self._units = [Unit(n) for n in range(units)]
        self.kill_after = kill_after
        self.first_task: int | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint({"counts": len(self._units), "options": content_options(self.config)})

    @property
    def units(self) -> Sequence[Unit]:
        return self._units

    def start(self, run: BuildRun) -> int:
        self.next: list[int] = run.resume.get("next", [0, 0])
        self.pending: list[bytes] = []
        return self.next[0]

    def task(self, number: int, unit: Unit) -> tuple[int, int]:
        if self.first_task is None:
            self.first_task = number
        return number, self.next[1] if number == self.next[0] else 0

    work = staticmethod(encode_unit)

    def add(self, run: BuildRun, number: int, result: list[bytes]) -> tuple[int, int]:
        first = PER_UNIT - len(result)
        for i, sample in enumerate(result, start=first):
            self.pending.append(sample)
            if len(self.pending) == PER_SHARD:
                run.store_samples({"next": [number, i + 1]}, COLUMNS, self.pending)
                self.pending = []
                if self.kill_after and len(run.shards) >= self.kill_after:
                    raise KeyboardInterrupt  # killed: not an input error, the output stays
        return len(result), sum(map(len, result))

    def finish(self, run: BuildRun) -> None:
        if self.pending:
            run.store_samples({"next": [len(self._units), 0], "final": True}, COLUMNS, self.pending)

    def empty_error(self) -> InputError:
        return InputError("no units")

    def metadata(self, run: BuildRun) -> dict[str, Any]:
        return {
            "kind": "counts",
            "fingerprint": self.fingerprint,
            "columns": COLUMNS,
            "config": content_options(self.config),
            "lineage": [{"units": len(self._units)}],
        }


def _config(out: Path | str, workers: int = 1) -> OutputOptions:
    return OutputOptions(
        output=str(out), shard_size=4096, allow_small_shards=True, workers=workers, progress=False
    )


def _expected(units: int = 7) -> list[dict[str, object]]:
    return [{"unit": u, "i": i} for u in range(units) for i in range(PER_UNIT)]


def test_results_come_in_unit_order_whatever_the_workers(tmp_path: Path) -> None:
    run_build(CountKind(_config(tmp_path / "one", workers=1)))
    three = run_build(CountKind(_config(tmp_path / "three", workers=3)))
    assert read_with_ours(tmp_path / "three") == _expected()
    assert dir_bytes(tmp_path / "one") == dir_bytes(tmp_path / "three")
    assert len(three.shards) == 7 * PER_UNIT // PER_SHARD
    assert three.summary().startswith("70 samples in 14 shards")
    # A finished build is found as it is.
    again = run_build(CountKind(_config(tmp_path / "three", workers=3)))
    assert again.summary().endswith("(already built: nothing to do)")


def test_a_killed_build_resumes_from_the_journal_to_the_same_bytes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_build(CountKind(_config(out), kill_after=5))
    assert not (out / "index.json").exists()
    assert (out / ".shardstream-build" / "done").is_dir()

    kind = CountKind(_config(out))
    resumed = run_build(kind)
    assert resumed.reused_shards == 5
    assert kind.first_task == 2  # 5 shards = 25 samples: unit 2 from its sample 5 on
    assert not (out / ".shardstream-build").exists()
    run_build(CountKind(_config(tmp_path / "clean")))
    assert dir_bytes(out) == dir_bytes(tmp_path / "clean")
    assert read_with_ours(out) == _expected()


def test_bad_input_leaves_no_partial_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(InputError, match="no units"):
        run_build(CountKind(_config(out), units=0))
    assert not out.exists()  # the build made the folder: it goes with what was in it


def test_a_new_kind_publishes_through_a_draft(tmp_path: Path, live_server: LiveServer) -> None:
    from shardstream.api_client import APIClient
    from shardstream.shard_builder.publish import DraftVersion

    with DraftVersion(live_server.url, "counts", token=live_server.token) as draft:
        draft.add_build(run_build(CountKind(_config(draft.storage_root, workers=2))))
    with APIClient(live_server.url, live_server.token) as api:
        version = api.get_version("counts", draft.number)
        assert version.status == "published"
        assert version.total_samples == 70
        assert len(list(api.iter_shards("counts", draft.number))) == 14
