"""shardstream inside the Hugging Face ``Trainer``: a run SIGKILLed after a checkpoint and
resumed from the Trainer's own ``checkpoint-N/`` trains on exactly the samples of an
uninterrupted run (the plan's own sequence), on another number of ranks and on the same,
with nothing replayed; a checkpoint whose data state is not that of its model's step is
refused before any batch.

The multi-rank runs are real ``torch.distributed`` jobs (gloo, loopback, a private network
namespace), launched like ``torchrun`` by :mod:`tests.client.integrations.launch`; every
rank logs the sample ids of each step (:mod:`tests.client.integrations.hf_job`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import ConfigError, ResumeError
from tests.client.integrations.launch import (
    RankJob,
    global_batches,
    plan_batches,
    steps_of,
    write_random_tokens,
)
from tests.fixtures.server import LiveServer

JOB = "tests.client.integrations.hf_job"
GLOBAL_BATCH = 12
SAMPLES = 96  # 8 global batches an epoch: STEPS cross an epoch's end
STEPS = 10
SEED = 7


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 samples of 32 token ids in 6 shards."""
    out = tmp_path_factory.mktemp("hf") / "tokens"
    return str(write_random_tokens(out, SAMPLES, 32, size_limit=1200, seed=0))


def _cfg(tmp: Path, name: str, data: str, world: int, **extra: Any) -> dict[str, Any]:
    return {
        "attempt": str(tmp / name),
        "data": data,
        "output_dir": str(tmp / "out"),
        "batch_size": GLOBAL_BATCH // world,
        "max_steps": STEPS,
        "save_steps": 4,
        "seed": SEED,
        **extra,
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(360)
def test_sigkilled_trainer_resumes_exactly_on_3_ranks(tokens: str, tmp_path: Path) -> None:
    """2 ranks, SIGKILLed while training step 6 (checkpoint-4 complete, step 5 trained and
    lost), resumed from checkpoint-4 on 3 ranks: steps 5..10 (across the epoch's end at 8)
    read exactly the plan's global batches. The uninterrupted reference is the plan itself
    (:func:`plan_batches`); the same-world rules are the elastic case's, and a same-size
    resume is checked in one process below."""
    reference = plan_batches(tokens, GLOBAL_BATCH, STEPS, SEED)
    first = tmp_path / "first"
    with RankJob(JOB, _cfg(first, "run", tokens, 2, hang_at=6), 2) as job:
        job.wait_for_files("hang", timeout=300)
        job.kill()
    assert global_batches(steps_of(first / "run", 2)) == {s: reference[s] for s in range(1, 6)}
    assert (first / "out" / "checkpoint-4" / "shardstream_data.json").exists()
    assert not (first / "out" / "checkpoint-8").exists()

    again = tmp_path / "again"
    shutil.copytree(first / "out", again / "out")
    with RankJob(JOB, _cfg(again, "run", tokens, 3, resume=True), 3) as job:
        job.wait(timeout=300)
    resumed = global_batches(steps_of(again / "run", 3))
    assert resumed == {s: reference[s] for s in range(5, STEPS + 1)}


# -- in one process: the refusals ----------------------------------------------------------


def _tiny_gpt2() -> Any:
    """A random-init 1-layer GPT-2 of width 16 (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    )


def _train(
    tokens: str, out: Path, steps: int, resume: Any = None, **dataset: Any
) -> dict[int, list[int]]:
    """Train ``steps`` steps in this process; returns ``{step: its sample ids, sorted}`` for
    the steps that reached the model. ``dataset``: more ``StreamingDataset`` options."""
    import torch
    from transformers import TrainingArguments

    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    trained: dict[int, list[int]] = {}

    class Recording(ShardstreamTrainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
            trained[self.state.global_step + 1] = sorted(inputs.pop("sample_id").tolist())
            return super().compute_loss(model, inputs, *a, **k)

    def to_inputs(batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["tokens"].long()
        return {"input_ids": ids, "labels": ids, "sample_id": batch["sample_id"]}

    options = {"plan": PlanOptions(seed=SEED), **dataset}
    streaming = StreamingDataset(
        tokens, 4, decode=DecodeOptions(sample_ids=True), transform=to_inputs, **options
    )
    torch.manual_seed(0)
    model = _tiny_gpt2()
    args = TrainingArguments(
        str(out), max_steps=steps, save_steps=2, use_cpu=True, report_to=[], disable_tqdm=True,
        logging_steps=1000, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Recording(model=model, args=args, train_dataset=streaming)
    trainer.train(resume_from_checkpoint=resume)
    trainer.shardstream_loader.flush_commits()  # durable on the server, if it has a run
    return trained


def test_checkpoint_with_the_data_state_of_another_step_is_refused(
    tokens: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    reference = plan_batches(tokens, 4, 4, SEED)
    assert _train(tokens, out, 4) == reference
    # checkpoint-4's model beside checkpoint-2's data position (a save that half happened)
    shutil.copy(out / "checkpoint-2" / "shardstream_data.json", out / "checkpoint-4")
    with pytest.raises(ResumeError, match=r"saved at step 4 .* that of step 2") as refused:
        _train(tokens, out, 6, resume=True)
    assert "checkpoint-4" in str(refused.value)
    # ...refused before the first batch; the intact checkpoint-2 still resumes, exactly (the
    # same world size; other sizes: the distributed test above)
    assert _train(tokens, out, 4, resume=str(out / "checkpoint-2")) == {
        s: reference[s] for s in (3, 4)
    }


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


def test_each_save_commits_its_step_to_the_run_and_a_resume_is_checked_there(
    live_server: LiveServer, tmp_path: Path
) -> None:
    """With a run on the metadata server, ``on_save`` commits step N at the position after
    step N (the run's ledger then knows every checkpoint the Trainer wrote), and a resume
    from ``checkpoint-N/`` is checked against the run's checkpoint at N before any batch."""
    from shardstream.api_client import APIClient
    from shardstream.client import CacheOptions, ServerOptions
    from shardstream.shard_builder.publish import register_index
    from tests.fixtures.datasets import write_tokens

    write_tokens(tmp_path / "ds", 48, size_limit=300)  # 12 global batches of 4
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(tmp_path / "ds" / "index.json"), "tokens")
        run = api.create_run([("tokens", 1)], global_batch_size=4).id
        server = ServerOptions(url=live_server.url, token=live_server.token, run=run)
        ds = {"server": server, "cache": CacheOptions(dir=tmp_path / "cache"), "plan": None}
        out = tmp_path / "out"
        first = _train("tokens", out, 4, **ds)
        committed = [(c.step, c.epoch, c.sample_in_epoch) for c in api.list_checkpoints(run)]
        assert committed == [(2, 0, 8), (4, 0, 16)]  # checkpoint-2/ and checkpoint-4/

        resumed = _train("tokens", out, 4, resume=str(out / "checkpoint-2"), **ds)
        assert resumed == {s: first[s] for s in (3, 4)}
        assert [(c.step, c.sample_in_epoch) for c in api.list_checkpoints(run)][-1] == (4, 16)

        # checkpoint-4's data file rewritten to say step 4 with the position of step 2: the
        # folder agrees with itself, the run's ledger (step 4 at sample 16) does not
        state = out / "checkpoint-4" / "shardstream_data.json"
        body = json.loads((out / "checkpoint-2" / "shardstream_data.json").read_text())
        state.write_text(json.dumps({**body, "step": 4}))
        with pytest.raises(ResumeError, match=r"refuses this start.*at step 4, whose check"):
            _train("tokens", out, 6, resume=True, **ds)
