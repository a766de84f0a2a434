"""``shardstream import FORMAT SOURCE... --output DST`` (or ``--server/--dataset`` to publish).

Shares the output, worker and publishing options of ``shardstream build``.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.shard_builder.cli import _add_output_options, _output_options, _run

_FORMATS = ("webdataset", "tfrecord", "lmdb", "hf", "litdata")


def register(subparsers: Any) -> None:
    """Add the ``import`` command."""
    parser = subparsers.add_parser(
        "import",
        help="import a WebDataset, TFRecord, LMDB, Hugging Face or LitData dataset as MDS shards",
        description="Convert a dataset in another tool's format into MDS shards, losslessly: "
        "every sample is checked against the schema of the first one.",
    )
    parser.add_argument("format", choices=_FORMATS, help="the source format")
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="SOURCE",
        help="files, folders or globs; WebDataset brace ranges (shard-{000000..000099}.tar)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out samples whose columns differ from the schema (listed in the summary)",
    )
    parser.add_argument(
        "--split", default="", help="hf: the split of a DatasetDict folder (default: train)"
    )
    parser.add_argument(
        "--no-key",
        dest="keep_key",
        action="store_false",
        help="webdataset: leave out each sample's key (kept by default as the column __key__)",
    )
    parser.add_argument(
        "--value-format",
        choices=["raw", "json", "npy", "pickle"],
        default="raw",
        help="lmdb: how values are stored (default raw bytes); pickle needs --allow-pickle",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="lmdb: unpickle values (--value-format pickle). Loading a pickle runs whatever "
        "code it holds, with your permissions: use it only for a database you wrote "
        "yourself or trust as you trust your own code",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="litdata token datasets (TokensLoader): the block_size your training reads them "
        "with; each block becomes one sample",
    )
    parser.add_argument(
        "--documents",
        action="store_true",
        help="litdata token datasets: keep each item (a document's tokens) as one sample of "
        "variable length; hf: each row's input_ids (loss_mask or labels, attention_mask "
        "padding left out) as one document; the layout `build text --documents` writes, "
        "packed at read time",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="hf and litdata --documents: ids must be below it (uint16 storage when <= "
        "65536; default: hf any uint32 id, litdata the ids as they are)",
    )
    _add_output_options(parser)
    parser.set_defaults(handler=_run_import)


def _run_import(args: argparse.Namespace) -> int:
    from shardstream.errors import ConfigError
    from shardstream.shard_builder.importers.build import ImportConfig, build_import

    if args.ray:
        # Accepted by the shared output options, so refused here rather than ignored: an
        # import that quietly ran on one machine would look like a cluster import.
        raise ConfigError(
            "--ray: imports run on this machine's cores (--workers N, default all); "
            "Ray clusters build `shardstream build text|images --ray` only"
        )

    def build(output: str) -> Any:
        config = ImportConfig(
            format=args.format,
            inputs=tuple(args.inputs),
            skip_bad=args.skip_bad,
            value_format=args.value_format,
            allow_pickle=args.allow_pickle,
            split=args.split,
            seq_len=args.seq_len,
            documents=args.documents,
            vocab_size=args.vocab_size,
            keep_key=args.keep_key,
            **_output_options(args, output),
        )
        return build_import(config)

    return _run(args, build)
