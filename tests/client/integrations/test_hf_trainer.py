"""shardstream inside the Hugging Face ``Trainer``: a run SIGKILLed after a checkpoint and
resumed from the Trainer's own ``checkpoint-N/`` trains on exactly the samples of an
uninterrupted run, on the same and on another number of ranks, with nothing replayed; a
checkpoint whose data state is not that of its model's step is refused before any batch.

The multi-rank runs are real ``torch.distributed`` jobs (gloo, loopback, a private network
namespace), launched like ``torchrun`` by :mod:`tests.client.integrations.launch`; every
rank logs the sample ids of each step (:mod:`tests.client.integrations.hf_job`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.errors import ConfigError, ResumeError
from shardstream.mds import MDSWriter
from tests.client.integrations.launch import RankJob, global_batches, steps_of

JOB = "tests.client.integrations.hf_job"
GLOBAL_BATCH = 12
SAMPLES = 96  # 8 global batches an epoch: 12 steps cross an epoch's end


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 samples of 32 token ids in 6 shards."""
    out = tmp_path_factory.mktemp("hf") / "tokens"
    rng = np.random.default_rng(0)
    with MDSWriter(str(out), {"tokens": "ndarray:uint16:32"}, size_limit=1200) as writer:
        for _ in range(SAMPLES):
            writer.write({"tokens": rng.integers(0, 256, 32, dtype=np.uint16)})
    return str(out)


def _cfg(tmp: Path, name: str, data: str, world: int, **extra: Any) -> dict[str, Any]:
    return {
        "attempt": str(tmp / name),
        "data": data,
        "output_dir": str(tmp / "out"),
        "batch_size": GLOBAL_BATCH // world,
        "max_steps": 12,
        "save_steps": 4,
        **extra,
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_sigkilled_trainer_resumes_exactly_on_2_and_3_ranks(tokens: str, tmp_path: Path) -> None:
    with RankJob(JOB, _cfg(tmp_path / "ref", "run", tokens, 1), 1) as job:
        job.wait()
    reference = global_batches(steps_of(tmp_path / "ref" / "run", 1))
    assert sorted(reference) == list(range(1, 13))

    # 2 ranks, killed while training step 5: checkpoint-4 is the newest complete one.
    first = tmp_path / "first"
    with RankJob(JOB, _cfg(first, "run", tokens, 2, hang_at=5), 2) as job:
        job.wait_for_files("hang")
        job.kill()
    assert global_batches(steps_of(first / "run", 2)) == {s: reference[s] for s in range(1, 5)}
    assert (first / "out" / "checkpoint-4" / "shardstream_data.json").exists()

    for world in (2, 3):  # the same world size, and one the Trainer's data skip cannot do
        again = tmp_path / f"again{world}"
        shutil.copytree(first / "out", again / "out")
        with RankJob(JOB, _cfg(again, "run", tokens, world, resume=True), world) as job:
            job.wait()
        resumed = global_batches(steps_of(again / "run", world))
        assert resumed == {s: reference[s] for s in range(5, 13)}, f"{world} ranks"


# -- in one process: the refusals ----------------------------------------------------------


def _tiny_gpt2() -> Any:
    """A random-init 1-layer GPT-2 of width 16 (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    )


def _train(tokens: str, out: Path, steps: int, resume: Any = None) -> list[int]:
    """Train ``steps`` steps in this process; returns the steps that reached the model."""
    import torch
    from transformers import TrainingArguments

    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    trained: list[int] = []

    class Recording(ShardstreamTrainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
            trained.append(self.state.global_step + 1)
            inputs.pop("sample_id")
            return super().compute_loss(model, inputs, *a, **k)

    def to_inputs(batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["tokens"].long()
        return {"input_ids": ids, "labels": ids, "sample_id": batch["sample_id"]}

    dataset = StreamingDataset(
        tokens, 4, plan=PlanOptions(seed=7), decode=DecodeOptions(sample_ids=True),
        transform=to_inputs,
    )  # fmt: skip
    torch.manual_seed(0)
    model = _tiny_gpt2()
    args = TrainingArguments(
        str(out), max_steps=steps, save_steps=2, use_cpu=True, report_to=[], disable_tqdm=True,
        logging_steps=1000, dataloader_num_workers=0,
    )  # fmt: skip
    Recording(model=model, args=args, train_dataset=dataset).train(resume_from_checkpoint=resume)
    return trained


def test_checkpoint_with_the_data_state_of_another_step_is_refused(
    tokens: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert _train(tokens, out, 4) == [1, 2, 3, 4]
    # checkpoint-4's model beside checkpoint-2's data position (a save that half happened)
    shutil.copy(out / "checkpoint-2" / "shardstream_data.json", out / "checkpoint-4")
    with pytest.raises(ResumeError, match=r"saved at step 4 .* that of step 2") as refused:
        _train(tokens, out, 6, resume=True)
    assert "checkpoint-4" in str(refused.value)
    # ...refused before the first batch; the intact checkpoint-2 still resumes
    assert _train(tokens, out, 3, resume=str(out / "checkpoint-2")) == [3]


def test_checkpoint_without_a_data_state_is_refused(tokens: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train(tokens, out, 2)
    (out / "checkpoint-2" / "shardstream_data.json").unlink()
    with pytest.raises(ResumeError, match="has no shardstream data state"):
        _train(tokens, out, 4, resume=True)


def test_saved_state_is_the_position_after_the_checkpoint_step(tokens: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train(tokens, out, 2)
    saved = json.loads((out / "checkpoint-2" / "shardstream_data.json").read_text())
    assert (saved["step"], saved["loader"]["epoch"], saved["loader"]["batch"]) == (2, 0, 2)


def test_dispatch_batches_true_is_refused_in_one_line(tokens: str, tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from shardstream.client import ShardstreamLoader, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    args = TrainingArguments(
        str(tmp_path), use_cpu=True, report_to=[], max_steps=1,
        accelerator_config={"dispatch_batches": True},
    )  # fmt: skip
    model = _tiny_gpt2()
    loader = ShardstreamLoader(StreamingDataset(tokens, 4), num_workers=0)
    with pytest.raises(ConfigError, match=r"dispatch_batches.*rank 0 read every batch") as refused:
        ShardstreamTrainer(model=model, args=args, train_dataset=loader)
    assert "\n" not in str(refused.value)
