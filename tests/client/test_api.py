"""The public API of shardstream.client changes only on purpose."""

from __future__ import annotations

import subprocess
import sys

import shardstream.client as client

EXPORTED = [
    "CacheOptions",
    "DecodeOptions",
    "MixtureSchedule",
    "PackOptions",
    "Phase",
    "PlanOptions",
    "RandomResizedCropFlip",
    "ReadOptions",  # added on purpose: the read knobs split out of CacheOptions (issue 23)
    "ReaderState",
    "ServerOptions",
    "ShardstreamLoader",
    "Source",
    "StreamingDataset",
    "Topology",
    "WorkerError",
]


def test_exported_names_are_exactly_these_and_sorted() -> None:
    assert client.__all__ == EXPORTED
    assert sorted(client.__all__) == client.__all__
    for name in EXPORTED:
        value = getattr(client, name)
        assert value.__name__ == name and value.__doc__, name


def test_importing_the_plan_does_not_import_torch() -> None:
    """The plan is pure numpy: planning tools must not pay for torch."""
    code = "import sys, shardstream.plan, shardstream.client.plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
