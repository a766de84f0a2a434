"""Builder throughput: shardstream's builder (all cores) against ``streaming.MDSWriter``.

One run, one generated input, three workloads:

* text/bpe - a prefix of the synthetic JSONL corpus tokenized with a byte-level BPE
  tokenizer (vocab 8192) trained here, joined with EOS, cut into 2048-token sequences
  (``ndarray:uint16:2048``). HF tokenizers dominate the cost on both sides, so the ratio
  is bounded by the core count;
* text/byte - the whole corpus with the byte-level tokenizer (UTF-8 bytes + EOS 256),
  where the builder's own overhead (reading, packing, writing) is what is measured;
* images - small generated JPEGs in a class-per-folder tree (``{image: jpeg, label: int}``).

The MDSWriter side is run the way its users run it: one process, documents tokenized one
by one (``Tokenizer.encode``) and written sample by sample (as llm-foundry's
``convert_dataset_json`` does); images as in streaming's own ImageNet converter
(``Image.open`` to validate, then the file's bytes). Both sides write the same hashes and
shard size, and the text shards must come out byte-identical (checked).

    python benchmarks/build.py                 # 128 MB of text (12 MB BPE), 3,000 images, best of 2
    python benchmarks/build.py --text-mb 400 --bpe-mb 100 --images 5000
    python benchmarks/build.py --ray local     # and the Ray builder on 1 and 2 Ray CPUs

With ``--ray ADDRESS`` (``local``: a Ray instance started here with ``--workers`` CPUs) the
text workloads also run on the Ray builder with 1 and 2 worker actors, beside the local
builder with 1 and 2 worker processes: documents/s and input MB/s, per CPU, the scaling
efficiency from 1 to 2 CPUs (throughput with 2 / twice the throughput with 1), the Ray
builder's per-CPU throughput relative to the local builder's, and the Ray builder's
overhead per shard (the same input cut into many small shards and into few large ones:
the extra time divided by the extra shards). The Ray outputs must be byte-identical to the
local ones (checked).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SEQ_LEN = 2048
HASHES = ("sha1", "xxh3_64")
SHARD_SIZE = 128 << 20
MB = 1 << 20


def make_text(folder: Path, target_mb: int, seed: int = 0) -> list[Path]:
    """JSONL files of pseudo-English documents (Zipf-distributed words), ~``target_mb`` MB."""
    rng = np.random.default_rng(seed)
    syllables = np.array(
        [
            "ka",
            "ri",
            "to",
            "ne",
            "sa",
            "mu",
            "lo",
            "pe",
            "di",
            "va",
            "shi",
            "ro",
            "te",
            "na",
            "mi",
            "ga",
            "be",
            "zu",
        ]
    )
    vocab = np.array(
        ["".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(6000)], dtype=object
    )
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    per_file = 50 * MB
    written, index = 0, 0
    while written < target_mb * MB:
        path = folder / f"part-{index:03d}.jsonl"
        size = 0
        with open(path, "w") as fh:
            while size < per_file and written + size < target_mb * MB:
                lengths = rng.integers(30, 1500, 2000)
                words = vocab[np.minimum(rng.zipf(1.25, int(lengths.sum())), len(vocab)) - 1]
                ends = np.cumsum(lengths)
                lines = []
                for start, end in zip(ends - lengths, ends, strict=True):
                    doc = " ".join(words[start:end])
                    lines.append(json.dumps({"text": doc}))
                chunk = "\n".join(lines) + "\n"
                fh.write(chunk)
                size += len(chunk)
        files.append(path)
        written += size
        index += 1
    return files


def train_tokenizer(files: list[Path], path: Path) -> Path:
    """A byte-level BPE tokenizer (vocab 8192) trained on the first ~4 MB of the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs: list[str] = []
    with open(files[0]) as fh:
        for line in fh:
            docs.append(json.loads(line)["text"])
            if sum(map(len, docs)) > 4 * MB:
                break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(path))
    return path


def make_images(root: Path, count: int, classes: int = 10, seed: int = 0) -> int:
    """``count`` JPEGs (smooth gradients + noise, 96-192 px) in ``classes`` folders."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    total = 0
    for i in range(count):
        w, h = (int(x) for x in rng.integers(96, 192, 2))
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (w + h)], -1)
        noise = rng.integers(0, 40, (h, w, 3))
        arr = np.clip(base + noise, 0, 255).astype(np.uint8)
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        (folder / f"{i:06d}.jpg").write_bytes(buf.getvalue())
        total += len(buf.getvalue())
    return total


def mds_text(files: list[Path], tokenizer: Path | None, out: Path) -> int:
    """MDSWriter as its users run it: encode doc by doc, write sample by sample."""
    from streaming import MDSWriter
    from tokenizers import Tokenizer

    if tokenizer is None:  # byte-level: UTF-8 bytes, EOS 256

        def encode(text: str) -> list[int]:
            return list(text.encode("utf-8"))

        eos = 256
    else:
        tok = Tokenizer.from_file(str(tokenizer))
        eos = tok.token_to_id("<|endoftext|>")

        def encode(text: str) -> list[int]:
            return list(tok.encode(text).ids)

    columns = {"tokens": f"ndarray:uint16:{SEQ_LEN}"}
    samples = 0
    buffer: list[int] = []
    with MDSWriter(out=str(out), columns=columns, hashes=list(HASHES), size_limit=SHARD_SIZE) as w:
        for path in files:
            with open(path) as fh:
                for line in fh:
                    buffer.extend(encode(json.loads(line)["text"]))
                    buffer.append(eos)
                    while len(buffer) >= SEQ_LEN:
                        w.write({"tokens": np.array(buffer[:SEQ_LEN], dtype=np.uint16)})
                        buffer = buffer[SEQ_LEN:]
                        samples += 1
    return samples


def mds_images(root: Path, out: Path) -> int:
    """streaming's ImageNet converter loop: Image.open to validate, store the file bytes."""
    from PIL import Image
    from streaming import MDSWriter

    classes = sorted(p.name for p in root.iterdir())
    files = [(p, c) for c, name in enumerate(classes) for p in sorted((root / name).iterdir())]
    columns = {"image": "jpeg", "label": "int"}
    with MDSWriter(out=str(out), columns=columns, hashes=list(HASHES), size_limit=SHARD_SIZE) as w:
        for path, label in files:
            Image.open(path)
            w.write({"image": path.read_bytes(), "label": label})
    return len(files)


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the builder's workers)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], int], out: Path) -> tuple[int, float, float]:
    """(samples, wall seconds, CPU seconds) of one call writing to ``out`` (emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    cpu, start = _cpu(), time.perf_counter()
    samples = fn()
    return samples, time.perf_counter() - start, _cpu() - cpu


def _in_private_netns_for_ray() -> None:
    """Run this benchmark again in a private network namespace (loopback only, own HOME).

    Ray's dashboard probes a cloud metadata address at every head start; from the host's
    namespace that request leaves the machine (tests/fixtures/netns.py).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fixtures.netns import in_private_netns, wrapped

    if not in_private_netns():
        print("[build] --ray local: running in a private network namespace (loopback only)")
        sys.stdout.flush()
        os.execv(wrapped([])[0], wrapped([sys.executable, *sys.argv]))


def main() -> None:
    """Generate the input, run both builders on both workloads, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-mb", type=int, default=128, help="MB of JSONL text (128)")
    parser.add_argument(
        "--bpe-mb", type=int, default=12, help="MB of it tokenized with BPE (12; BPE is slow)"
    )
    parser.add_argument("--images", type=int, default=3000, help="number of JPEGs (3000)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=2, help="runs per builder, best kept (2)")
    parser.add_argument("--dir", type=Path, help="work folder (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--ray", metavar="ADDRESS", help="also run the Ray builder (local: start Ray here)"
    )
    parser.add_argument(
        "--ray-only", action="store_true", help="with --ray: skip the MDSWriter comparison"
    )
    args = parser.parse_args()
    if args.ray == "local":
        _in_private_netns_for_ray()
    if args.ray:
        # One CPU means one thread: HF tokenizers' own thread pool (sized here, at its first
        # use) would give the local builder's in-process 1-worker run every core.
        os.environ["RAYON_NUM_THREADS"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    # Imported before any timing: streaming pulls in torch, seconds that neither side should pay.
    import streaming  # noqa: F401
    import tokenizers  # noqa: F401

    from shardstream.shard_builder import (
        ImageBuildConfig,
        TextBuildConfig,
        build_images,
        build_text,
    )

    work = args.dir or Path(tempfile.mkdtemp(prefix="shardstream-bench-build-"))
    try:
        t0 = time.perf_counter()
        files = make_text(work / "text", args.text_mb)
        tokenizer = train_tokenizer(files, work / "tokenizer.json")
        text_bytes = sum(f.stat().st_size for f in files)
        image_bytes = make_images(work / "images", args.images)
        print(
            f"input: {text_bytes / MB:,.0f} MB JSONL in {len(files)} files, {args.images:,} JPEGs "
            f"({image_bytes / MB:,.1f} MB); generated in {time.perf_counter() - t0:.0f}s; "
            f"{os.cpu_count()} cores, ours with {args.workers} workers"
        )
        rows = []
        bpe_files = _first_mb(files, args.bpe_mb)
        bpe_bytes = sum(f.stat().st_size for f in bpe_files)
        if args.ray and args.ray_only:
            from _build_ray import ray_section

            workloads = [("text/bpe", bpe_files, tokenizer), ("text/byte", files, None)]
            ray_section(args.ray, work, workloads, repeat=args.repeat)
            return

        def ours_text(inputs: list[Path], tok: Path | None, out: str) -> int:
            config = TextBuildConfig(
                output=str(work / out),
                inputs=tuple(str(f) for f in inputs),
                tokenizer=tok,
                seq_len=SEQ_LEN,
                hashes=HASHES,
                workers=args.workers,
                progress=False,
            )
            return build_text(config).samples

        def ours_images() -> int:
            config = ImageBuildConfig(
                output=str(work / "ours-images"),
                inputs=(str(work / "images"),),
                hashes=HASHES,
                workers=args.workers,
                progress=False,
            )
            return build_images(config).samples

        workloads = [
            ("text/bpe", lambda: ours_text(bpe_files, tokenizer, "ours-bpe"),
             lambda: mds_text(bpe_files, tokenizer, work / "mds-bpe"), bpe_bytes),
            ("text/byte", lambda: ours_text(files, None, "ours-byte"),
             lambda: mds_text(files, None, work / "mds-byte"), text_bytes),
            ("images", ours_images, lambda: mds_images(work / "images", work / "mds-images"),
             image_bytes),
        ]  # fmt: skip
        for name, ours, theirs, nbytes in workloads:
            # Alternate the two and keep each one's best time: on a shared machine other
            # processes' load comes and goes, and the minimum is what each builder can do.
            ours_s = theirs_s = ours_cpu = theirs_cpu = float("inf")
            kind = name.replace("text/", "")
            for _ in range(args.repeat):
                ours_n, secs, cpu = timed(ours, work / f"ours-{kind}")
                ours_s, ours_cpu = min(ours_s, secs), min(ours_cpu, cpu)
                theirs_n, secs, cpu = timed(theirs, work / f"mds-{kind}")
                theirs_s, theirs_cpu = min(theirs_s, secs), min(theirs_cpu, cpu)
            rows.append((name, "shardstream", ours_n, ours_s, ours_cpu, nbytes))
            rows.append((name, "MDSWriter", theirs_n, theirs_s, theirs_cpu, nbytes))
            print(f"{name}: shardstream {ours_s:.1f}s, MDSWriter {theirs_s:.1f}s", flush=True)
        same = all(
            _same_shards(work / f"ours-{kind}", work / f"mds-{kind}") for kind in ("bpe", "byte")
        )
        _print(rows)
        print(f"text shards byte-identical to MDSWriter's (same hashes, size limit): {same}")
        if args.ray:
            from _build_ray import ray_section

            ray_section(
                args.ray,
                work,
                [("text/bpe", bpe_files, tokenizer), ("text/byte", files, None)],
                repeat=args.repeat,
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _first_mb(files: list[Path], mb: int) -> list[Path]:
    """A prefix of the files holding about ``mb`` MB, split off into a file of its own."""
    out = files[0].parent.parent / "bpe" / "part.jsonl"
    out.parent.mkdir(exist_ok=True)
    with open(files[0], "rb") as src, open(out, "wb") as dst:
        data = src.read(mb * MB)
        dst.write(data[: data.rfind(b"\n") + 1])
    return [out]


def _same_shards(ours: Path, theirs: Path) -> bool:
    names = sorted(p.name for p in theirs.glob("shard.*.mds"))
    return bool(names) and all((ours / n).read_bytes() == (theirs / n).read_bytes() for n in names)


def _print(rows: list[tuple[str, str, int, float, float, int]]) -> None:
    """Rows come in pairs (shardstream, MDSWriter) per workload."""
    print(f"\n{'workload':<9} {'builder':<12} {'samples':>8} {'wall s':>7} {'CPU s':>7} "
          f"{'samples/s':>10} {'input MB/s':>10} {'speed-up':>9}")  # fmt: skip
    for i, (name, who, n, secs, cpu, nbytes) in enumerate(rows):
        ours_s, theirs_s = rows[i - i % 2][3], rows[i - i % 2 + 1][3]
        ratio = f"{theirs_s / ours_s:.2f}x" if who == "shardstream" else "1.00x"
        print(f"{name:<9} {who:<12} {n:>8,} {secs:>7.1f} {cpu:>7.1f} {n / secs:>10,.0f} "
              f"{nbytes / MB / secs:>10.1f} {ratio:>9}")  # fmt: skip
    print("(wall s: best of the runs; CPU s: this process plus its worker processes)")


if __name__ == "__main__":
    main()
