"""Orchestration of ``shardstream demo``: server, tokenizer, build, train, kill, resume, check;
then the same on another number of ranks (:mod:`shardstream.demo.elastic`)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx

from shardstream.demo.console import follow, say
from shardstream.demo.elastic import EVIDENCE, ElasticSetup, report_elastic, run_elastic
from shardstream.errors import ConfigError, ShardstreamError

DATASET = "kjv"
SEQ_LEN = 64
VOCAB = 2048
EOS = "<|endoftext|>"
GLOBAL_BATCH = 32


@dataclass(frozen=True)
class DemoConfig:
    """How long the demo trains and where it interrupts itself."""

    steps: int = 120
    kill_at: int = 75
    commit_every: int = 10

    def __post_init__(self) -> None:
        if not 0 < self.commit_every <= self.kill_at < self.steps:
            raise ConfigError(
                "demo needs 0 < --commit-every <= --kill-at < --steps "
                f"(got {self.commit_every}, {self.kill_at}, {self.steps})"
            )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def _server(work: Path, token: str) -> Iterator[str]:
    """The metadata server on SQLite in ``work/server``, as a child process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, SHARDSTREAM_ADMIN_TOKEN=token, SHARDSTREAM_LOG_JSON="false")
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardstream",
            "server",
            "--port",
            str(port),
            "--data-dir",
            str(work / "server"),
            "--storage-root",  # the server places the dataset under it: work/shards/kjv-<id>/v1
            str((work / "shards").resolve()),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise ShardstreamError(
                    f"the server exited with {proc.returncode}; see {work / 'server.log'}"
                )
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ShardstreamError(f"the server did not get ready; see {work / 'server.log'}")
            time.sleep(0.2)
        yield url
    finally:
        # A server that never started (or died) is gone already: no second error on top.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _corpus(work: Path) -> tuple[Path, list[str]]:
    """The shipped public-domain text as plain JSONL (the builder's input)."""
    packed = resources.files("shardstream.demo").joinpath("data/kjv-chapters.jsonl.gz")
    out = work / "corpus" / "kjv.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = gzip.decompress(packed.read_bytes())
    out.write_bytes(raw)
    texts = [json.loads(line)["text"] for line in raw.decode().splitlines()]
    return out, texts


def _train_tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))


def _build_and_publish(server: str, token: str, corpus: Path, tokenizer: Path) -> tuple[int, int]:
    """Build the shards into a draft the server placed, publish it: (version, samples)."""
    from shardstream.shard_builder.config import TextBuildConfig
    from shardstream.shard_builder.publish import DraftVersion
    from shardstream.shard_builder.text import build_text

    with DraftVersion(server, DATASET, description="KJV, byte-level BPE", token=token) as draft:
        config = TextBuildConfig(
            output=draft.storage_root,  # the server decides where a dataset's bytes live
            inputs=(str(corpus),),
            tokenizer=tokenizer,
            eos_token=EOS,
            seq_len=SEQ_LEN,
            shard_size=512 << 10,  # tiny shards, so the plan has shards to mix
            allow_small_shards=True,
            workers=2,
        )
        result = build_text(config)
        draft.add_build(result)
    say(f"published {DATASET}@{draft.number}: {result.summary()}")
    return draft.number, result.samples


def _create_run(server: str, token: str, version: int, name: str) -> str:
    from shardstream.api_client import APIClient

    with APIClient(server, token) as api:
        run = api.create_run([(DATASET, version)], global_batch_size=GLOBAL_BATCH, seed=7)
    return str(run.id)


def _trainer(
    work: Path,
    run: str,
    version: int,
    config: DemoConfig,
    name: str,
    *,
    resume: bool = False,
    epoch_log: Path | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardstream.demo.trainer",
            "--dataset",
            f"{DATASET}@{version}",
            "--run",
            run,
            "--vocab",
            str(VOCAB),
            "--steps",
            str(config.steps),
            "--commit-every",
            str(config.commit_every),
            "--log",
            str(work / f"{name}.log"),
            "--ckpt-dir",
            str(work / f"{name}-ckpt"),
            "--cache-dir",
            str(work / "cache"),
            *(["--resume"] if resume else []),
            *(["--epoch-log", str(epoch_log)] if epoch_log else []),
        ],
        start_new_session=True,  # its loader workers too, so one killpg stops them all
    )


def _steps(log: Path) -> dict[int, tuple[float, str]]:
    out: dict[int, tuple[float, str]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3:  # a line cut by SIGKILL has fewer
                out[int(parts[0])] = (float(parts[1]), parts[2])
    return out


def _wait(proc: subprocess.Popen[bytes], what: str) -> None:
    if proc.wait(600) != 0:
        raise ShardstreamError(f"{what} exited with status {proc.returncode}")


def _last(log: Path) -> int:
    return max(_steps(log), default=0)


def _digest(steps: dict[int, tuple[float, str]], upto: int) -> str:
    joined = "\n".join(steps[s][1] for s in range(1, upto + 1))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def run_demo(config: DemoConfig, workdir: str | None = None) -> bool:
    """Run the demo; return True when the resumed sequences equal the uninterrupted one,
    resumed on the same number of ranks and on another."""
    started = time.monotonic()
    # The evidence (server database, shards, trainer logs, checkpoints) is kept: a default
    # folder under the temp dir, named at the end.
    work = Path(workdir or tempfile.mkdtemp(prefix="shardstream-demo-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    try:
        with _server(work, token) as server:
            say(f"server on {server} (SQLite in {work / 'server'})")
            os.environ["SHARDSTREAM_SERVER"], os.environ["SHARDSTREAM_TOKEN"] = server, token
            corpus, texts = _corpus(work)
            say(
                f"corpus: {len(texts)} chapters of the King James Bible, "
                f"{corpus.stat().st_size / 1e6:.1f} MB"
            )
            tokenizer = work / "tokenizer.json"
            _train_tokenizer(texts, tokenizer)
            say(f"trained a {VOCAB}-token BPE tokenizer -> {tokenizer}")
            version, samples = _build_and_publish(server, token, corpus, tokenizer)

            reference_run = _create_run(server, token, version, "reference")
            epoch_log = work / "reference-epoch.log"
            proc = _trainer(work, reference_run, version, config, "reference", epoch_log=epoch_log)
            follow(
                lambda: _last(work / "reference.log"),
                "uninterrupted run",
                total=config.steps,
                proc=proc,
                after_total="reading the rest of the epoch (the elastic check's reference)",
            )
            _wait(proc, "the uninterrupted run")

            run = _create_run(server, token, version, "interrupted")
            proc = _trainer(work, run, version, config, "interrupted")
            follow(
                lambda: _last(work / "interrupted.log"),
                "interrupted run",
                total=config.steps,
                stop_at=config.kill_at,
                proc=proc,
            )
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            before = _steps(work / "interrupted.log")
            checkpoint = max(before) // config.commit_every * config.commit_every
            say(
                f"SIGKILLed the trainer and its workers at step {max(before)}; "
                f"last checkpoint: step {checkpoint}"
            )

            # The restarted job: the same run, the model checkpoints the killed job left.
            shutil.copytree(work / "interrupted-ckpt", work / "resumed-ckpt")
            proc = _trainer(work, run, version, config, "resumed", resume=True)
            follow(
                lambda: _last(work / "resumed.log"),
                "resumed run",
                total=config.steps,
                start=checkpoint,
                proc=proc,
            )
            _wait(proc, "the resumed run")

            setup = ElasticSetup(
                work=work,
                dataset=f"{DATASET}@{version}",
                dataset_samples=samples,
                global_batch=GLOBAL_BATCH,
                commit_every=config.commit_every,
                reference_epoch=epoch_log,
            )
            elastic = run_elastic(setup, _create_run(server, token, version, "elastic"))
        reference = _steps(work / "reference.log")
        after = _steps(work / "resumed.log")
    finally:
        say(
            f"evidence kept in {work}: reference.log, interrupted.log, resumed.log (step, "
            "loss, sample ids), reference-epoch.log, elastic/ (the ranks' logs) and "
            f"{EVIDENCE}, the checkpoints, the server's database and the shards; delete it "
            "when done (--workdir DIR picks the folder)"
        )
    exact = _report(reference, before, after, checkpoint=checkpoint, config=config)
    elastic_ok = report_elastic(elastic)
    seconds = time.monotonic() - started
    if exact and elastic_ok:
        say(f"demo passed in {seconds:.0f} s: exact resume and elastic resume")
    else:
        say(f"demo FAILED in {seconds:.0f} s (see above)")
    return exact and elastic_ok


def _report(
    reference: dict[int, tuple[float, str]],
    before: dict[int, tuple[float, str]],
    after: dict[int, tuple[float, str]],
    *,
    checkpoint: int,
    config: DemoConfig,
) -> bool:
    """Print the evidence: the stitched sequence against the uninterrupted one."""
    stitched = {s: v for s, v in before.items() if s <= checkpoint} | after
    complete = sorted(stitched) == list(range(1, config.steps + 1))
    same_ids = complete and all(stitched[s][1] == reference[s][1] for s in stitched)
    same_loss = complete and all(stitched[s][0] == reference[s][0] for s in stitched)
    redone = sorted(s for s in before if s > checkpoint)
    say(
        f"steps {checkpoint + 1}..{max(before)} ran before the kill and again after the "
        f"resume ({len(redone)} steps: the trainer's checkpoint is the source of truth)"
    )
    say(f"consumed sample ids, steps 1..{config.steps}:")
    say(f"  uninterrupted run      sha256 {_digest(reference, config.steps)}")
    if complete:
        say(f"  killed + resumed run   sha256 {_digest(stitched, config.steps)}")
    last = config.steps
    say(
        f"loss at step {last}: uninterrupted {reference[last][0]:.6f}, "
        f"resumed {stitched.get(last, (float('nan'), ''))[0]:.6f}"
    )
    if same_ids:
        say(
            f"OK: the resumed run consumed exactly the same samples in the same order"
            f"{' and reached the same loss' if same_loss else ''}"
        )
    else:
        say("FAILED: the resumed sample sequence differs from the uninterrupted run")
    return same_ids
