"""``shardstream build text`` and ``shardstream build images``.

Only :mod:`argparse` is imported at module level, so ``shardstream --help`` works without
the ``[builder]`` extra; the handlers import the builder (pyarrow, tokenizers, Pillow).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``build`` command and its ``text`` / ``images`` sub-commands."""
    build = subparsers.add_parser(
        "build",
        help="turn raw data into MDS shards",
        description="Turn raw data (text, images) into MDS shards in a directory or s3:// URL.",
    )
    kinds = build.add_subparsers(dest="build_kind", metavar="KIND", required=True)

    text = kinds.add_parser(
        "text",
        help="tokenize JSONL/Parquet documents into fixed-length sequences",
        description="Tokenize documents, join them with EOS and cut fixed-length sequences.",
    )
    text.add_argument("inputs", nargs="+", help="JSONL/Parquet files, directories or globs")
    text.add_argument("--field", default="text", help="field holding the text (default: text)")
    text.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json (default: byte-level)")
    text.add_argument("--eos-token", help="EOS token of the tokenizer (default: guessed)")
    text.add_argument("--seq-len", type=int, default=2048, help="tokens per sample (2048)")
    # Input bytes per unit of parallel work: a tuning knob (tests use small ones).
    text.add_argument("--chunk-bytes", help=argparse.SUPPRESS)
    text.add_argument(
        "--documents",
        action="store_true",
        help="store each document as one variable-length token array, for packing at "
        "read time (PackOptions); --seq-len is then unused",
    )
    text.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out bad lines (not a JSON object, no text field, not a string; null "
        "Parquet rows) and report them: counted, the first named with file:line (default: "
        "stop at the first, naming it)",
    )
    text.add_argument(
        "--prompt-field",
        metavar="FIELD",
        help="with --documents: chat/SFT records; a document is this field's prompt then "
        "--field's response, with a loss_mask column (1 on the response)",
    )
    _add_output_options(text)
    text.set_defaults(handler=_run_text)

    images = kinds.add_parser(
        "images",
        help="shard an image folder (one sub-folder per class) or Parquet image files",
        description="Store images (original JPEG/PNG bytes) with integer labels.",
    )
    images.add_argument("inputs", nargs="+", help="an image folder, or Parquet files/globs")
    images.add_argument("--image-field", default="image", help="Parquet image column (image)")
    images.add_argument("--label-field", default="label", help="Parquet label column (label)")
    images.add_argument(
        "--image-format",
        choices=["auto", "jpeg", "png", "bytes"],
        default="auto",
        help="column encoding of the images (default: from the files)",
    )
    images.add_argument("--resize", type=int, metavar="PX", help="shorter side at most PX")
    images.add_argument("--jpeg-quality", type=int, default=90, help="when re-encoding (90)")
    images.add_argument(
        "--on-bad-image",
        choices=["fail", "skip"],
        default="fail",
        help="stop at an undecodable image, or leave it out and report it (default: fail)",
    )
    images.add_argument(
        "--skip-bad-images",
        dest="on_bad_image",
        action="store_const",
        const="skip",
        help="the same as --on-bad-image skip",
    )
    images.add_argument(
        "--verify-images",
        choices=["quick", "full"],
        default="quick",
        help="quick: JPEG/PNG structure (truncation), decoding only files that fail it; "
        "full: decode every image (slower). Default: quick",
    )
    _add_output_options(images)
    images.set_defaults(handler=_run_images)


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        help="output directory or s3://bucket/prefix (with --dataset: default is the "
        "storage root the server assigns to the new version)",
    )
    parser.add_argument(
        "--shard-size", default="128MB", help="target shard size, 64MB-256MB (default 128MB)"
    )
    parser.add_argument("--compression", default="none", help="none (default) or zstd[:level]")
    parser.add_argument(
        "--block-size",
        default="4MiB",
        help="bytes per block digest, 64KiB-64MiB (default 4MiB): readers streaming from object "
        "storage fetch and verify whole blocks, so smaller blocks give a faster cold first "
        "batch and a longer index",
    )
    parser.add_argument(
        "--piece-size",
        default="64KiB",
        help="bytes per piece digest in each shard's header, or 'none' (default 64KiB): a "
        "cold reader verifies its first samples piece by piece instead of whole blocks",
    )
    parser.add_argument(
        "--hashes", default="sha1,xxh3_64", help="shard hashes, comma-separated (sha1,xxh3_64)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="worker processes (default: all cores); with --ray, worker actors (default: "
        "every CPU of the cluster)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="build on a Ray cluster: HOST:PORT or ray://HOST:PORT, 'auto' (the cluster this "
        "machine is in) or 'local' (start Ray on this machine); needs shardstream[ray]",
    )
    parser.add_argument(
        "--ray-retries",
        type=int,
        default=2,
        metavar="N",
        help="with --ray: when a worker or node is lost, resume from the journal on the "
        "nodes left up to N times before failing (default 2)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a dataset already in the output"
    )
    parser.add_argument(
        "--spread-prefixes",
        action="store_true",
        help="write shards under hashed folders (1f0c/shard.00003.mds) so reads spread over "
        "many S3 key prefixes; MosaicML Streaming reads such datasets too",
    )
    # Tests build tiny datasets: shards below the 64 MB floor only on request.
    parser.add_argument("--allow-small-shards", action="store_true", help=argparse.SUPPRESS)
    publish = parser.add_argument_group("publishing to a shardstream server")
    publish.add_argument(
        "--server",
        default=os.environ.get("SHARDSTREAM_SERVER"),
        help="server URL (default: $SHARDSTREAM_SERVER); with --dataset, publish a version",
    )
    publish.add_argument("--dataset", help="dataset name to publish the build as a new version")
    publish.add_argument("--token", help="API token (default: $SHARDSTREAM_TOKEN)")
    publish.add_argument("--description", default="", help="description of a new dataset")


def _output_options(args: argparse.Namespace, output: str) -> dict[str, Any]:
    from shardstream.shard_builder.config import parse_size

    compression = None if args.compression.lower() in ("", "none") else args.compression
    return {
        "output": output,
        "shard_size": parse_size(args.shard_size),
        "block_size": parse_size(args.block_size),
        "piece_size": None if args.piece_size.lower() == "none" else parse_size(args.piece_size),
        "compression": compression,
        "hashes": tuple(h.strip() for h in args.hashes.split(",") if h.strip()),
        "workers": args.workers or os.cpu_count() or 1,
        "progress": not args.no_progress,
        "overwrite": args.overwrite,
        "allow_small_shards": args.allow_small_shards,
        "spread_prefixes": args.spread_prefixes,
    }


def _run_text(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shardstream.shard_builder.config import DEFAULT_CHUNK_BYTES, TextBuildConfig, parse_size
    from shardstream.shard_builder.text import build_text

    def build(output: str) -> Any:
        config = TextBuildConfig(
            inputs=tuple(args.inputs),
            field=args.field,
            tokenizer=Path(args.tokenizer) if args.tokenizer else None,
            eos_token=args.eos_token,
            seq_len=args.seq_len,
            documents=args.documents,
            prompt_field=args.prompt_field,
            skip_bad=args.skip_bad,
            chunk_bytes=parse_size(args.chunk_bytes) if args.chunk_bytes else DEFAULT_CHUNK_BYTES,
            **_output_options(args, output),
        )
        if args.ray:
            from shardstream.shard_builder.cluster import build_text_on_ray

            return build_text_on_ray(config, _ray_options(args))
        return build_text(config)

    return _run(args, build)


def _run_images(args: argparse.Namespace) -> int:
    from shardstream.shard_builder.config import ImageBuildConfig
    from shardstream.shard_builder.images import build_images

    def build(output: str) -> Any:
        config = ImageBuildConfig(
            inputs=tuple(args.inputs),
            image_field=args.image_field,
            label_field=args.label_field,
            image_format=args.image_format,
            resize=args.resize,
            jpeg_quality=args.jpeg_quality,
            on_bad_image=args.on_bad_image,
            verify_images=args.verify_images,
            **_output_options(args, output),
        )
        if args.ray:
            from shardstream.shard_builder.cluster import build_images_on_ray

            return build_images_on_ray(config, _ray_options(args))
        return build_images(config)

    return _run(args, build)


def _ray_options(args: argparse.Namespace) -> Any:
    from shardstream.shard_builder.cluster import RayOptions

    return RayOptions(address=args.ray, workers=args.workers, retries=args.ray_retries)


# Options that do not change what a build writes: a re-run may change them and still
# continue the draft (and journal) of the run it repeats.
_RUN_ONLY_OPTIONS = frozenset(
    {
        *("handler", "token", "no_progress", "workers", "ray", "ray_retries", "verbose"),
        *("server", "description"),
    }
)


def _resume_key(args: argparse.Namespace) -> str:
    """The same command (from the same folder) gives the same key: see ``DraftVersion``."""
    import hashlib
    import json

    command = {k: v for k, v in vars(args).items() if k not in _RUN_ONLY_OPTIONS}
    command["cwd"] = os.getcwd()
    digest = hashlib.sha256(json.dumps(command, sort_keys=True, default=str).encode())
    return f"shardstream-build-{digest.hexdigest()}"


def _run(args: argparse.Namespace, build: Callable[[str], Any]) -> int:
    """Run ``build(output)``; with ``--dataset``, inside a server draft that it publishes."""
    import sys

    from shardstream.errors import ConfigError

    if args.dataset and not args.server:
        raise ConfigError("--dataset needs --server URL (or SHARDSTREAM_SERVER) to publish to")
    if not args.dataset and not args.output:
        raise ConfigError("--output is required (a directory or s3://bucket/prefix)")
    if args.dataset:
        import importlib

        # Written by the server side; imported only when publishing is asked for.
        publish: Any = importlib.import_module("shardstream.shard_builder.publish")
        # The server places the version; --output elsewhere registers the build in place,
        # which the server allows admins only: asked at open, so it refuses before building.
        with publish.DraftVersion(
            args.server,
            args.dataset,
            description=args.description,
            token=args.token,
            storage_root=publish.storage_url(args.output) if args.output else None,
            resume_key=_resume_key(args),
        ) as draft:
            # A draft aborts if the build raises, so a failed build is never published.
            result = build(args.output or draft.storage_root)
            draft.add_build(result)
        print(
            f"published {args.dataset} version {draft.number}: {result.summary()}",
            file=sys.stderr,
        )
    else:
        result = build(args.output)
        print(result.summary(), file=sys.stderr)
    for worker in result.workers:
        print(worker.line(result.kind, result.timings.get("total_s", 0.0)), file=sys.stderr)
    for bad in result.skipped:
        print(f"skipped {bad.source}: {bad.reason}", file=sys.stderr)
    return 0
