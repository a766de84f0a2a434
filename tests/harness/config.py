"""The settings of one launch of the harness's training loop, shared by parent and ranks.

The parent writes a :class:`TrainerConfig` as JSON into the attempt directory; every rank
reads it back (``python -m tests.harness.trainer <attempt>/config.json``) and takes its
rank and world size from the environment, as under ``torchrun``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

LoaderKind = Literal["shardstream", "toy"]


@dataclass(frozen=True)
class StateDictResume:
    """Resume from the per-rank checkpoints that an earlier attempt wrote after ``step``.

    New rank ``r`` loads the state old rank ``r % world_size`` saved: the state is a
    global position, so under a different world size any old rank's copy must do.
    """

    attempt_dir: str
    step: int
    world_size: int
    # The step of the model checkpoint the trainer restored, given to the loader as
    # ``load_state_dict(state, step=...)`` so the run's ledger checks the pair (None: not
    # given). Another step than ``step`` is a model restored beside another step's data.
    model_step: int | None = None


@dataclass(frozen=True)
class ServerResume:
    """Resume from the state the run committed to the server (``"latest"`` or a step)."""

    which: str | int = "latest"
    # Ranks that resume elsewhere (rank as text -> "latest" or a step): a stale state on
    # one rank of a start, which the run's ledger must refuse.
    ranks: dict[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True)
class DataSettings:
    """Where the samples come from and how the plan cuts them into batches."""

    source: str  # local dir / index.json URL / dataset name on the server
    global_batch_size: int
    num_partitions: int | None = None  # None: the loader's default (elastic resume needs none)
    seed: int = 0
    shuffle: bool = True
    window: int | None = None  # PlanOptions.window: mixing window, samples per partition
    server: str | None = None  # base URL; the token comes from SHARDSTREAM_TOKEN
    run_id: str | None = None
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    open_shards: int | None = None  # CacheOptions.open_shards (None: its default)
    prefetch_shards: int | None = None  # ReadOptions.prefetch_shards (None: its default)
    read_extra: dict[str, object] = field(default_factory=dict)  # more ReadOptions fields
    # A .npy of every sample's tokens by global id: each batch is checked against it
    # (datasets without the harness's own ``id`` column, e.g. one from the text builder).
    expected_tokens: str | None = None
    # More sources after ``source`` (a mixture), the PlanOptions.epoch_size, a mixture
    # schedule (MixtureSchedule.to_params()) and read-time packing (PackOptions fields):
    # with packing every step's packed rows are logged too (records.rows_log_path).
    more_sources: list[str] = field(default_factory=list)
    epoch_size: int | None = None
    schedule: list[dict[str, object]] | dict[str, object] | None = None
    pack: dict[str, object] | None = None


@dataclass(frozen=True)
class TrainerConfig:
    """One launch: data settings, loop settings, and how (whether) to resume."""

    attempt_dir: str
    data: DataSettings
    num_workers: int = 2
    checkpoint_every: int = 8
    commit: bool = False  # also loader.commit(step) at every checkpoint (needs run_id)
    commit_all_ranks: bool = False  # every rank commits (same state), not only rank 0
    loader: LoaderKind = "shardstream"
    step_sleep_s: float = 0.0  # a stand-in for compute, so a kill lands mid-epoch
    # A backstop for kills: after logging this step every rank stalls until killed, so a
    # parent slowed down by a loaded machine still kills mid-epoch (never set it for a
    # run that must finish).
    hold_after_step: int | None = None
    collective_timeout_s: float = 120.0
    resume_state_dict: StateDictResume | None = None
    resume_server: ServerResume | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Write the config as JSON."""
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> TrainerConfig:
        """Read a config written by :meth:`write`."""
        raw = json.loads(path.read_text())
        sd = raw.pop("resume_state_dict")
        srv = raw.pop("resume_server")
        return cls(
            data=DataSettings(**raw.pop("data")),
            resume_state_dict=StateDictResume(**sd) if sd else None,
            resume_server=ServerResume(**srv) if srv else None,
            **raw,
        )
