"""The builder on a real two-node Ray cluster (``ray_cluster``: two raylets on loopback).

Every Ray build is compared byte for byte with the local builder's output for the same
inputs and options: shards, ``index.json`` and ``shardstream.json``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.shard_builder import ImageBuildConfig, TextBuildConfig, build_images, build_text
from shardstream.shard_builder.cluster import RayOptions, build_images_on_ray, build_text_on_ray
from shardstream.storage import open_store
from tests.builder.conftest import (
    dir_bytes,
    jpeg_bytes,
    make_docs,
    read_with_ours,
    write_jsonl,
    write_parquet,
)
from tests.fixtures.build_runs import stored_objects
from tests.fixtures.ray_cluster import TEST_RAY_ENV, RayCluster, token_auth_head
from tests.fixtures.s3 import S3Bucket

# Starts Ray: runs only in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.ray

SMALL = {"shard_size": 8192, "allow_small_shards": True, "progress": False}


def test_text_on_two_nodes_is_byte_identical_to_the_local_build(
    tmp_path: Path, tokenizer_file: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    docs = make_docs(3000, seed=31, max_words=120)
    write_jsonl(tmp_path / "a.jsonl", docs[:1800])
    write_parquet(tmp_path / "b.parquet", docs[1800:], row_group_size=300)
    options = {
        "inputs": (str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")),
        "tokenizer": tokenizer_file,
        "seq_len": 64,
        "chunk_bytes": 32 << 10,
        **SMALL,
    }
    local = build_text(TextBuildConfig(output=str(tmp_path / "local"), workers=1, **options))
    url = f"{s3_bucket.url}/corpus"
    result = build_text_on_ray(
        TextBuildConfig(output=url, **options), RayOptions(address=ray_cluster.address)
    )
    assert stored_objects(url) == dir_bytes(
        tmp_path / "local"
    )  # shards, index.json, shardstream.json
    assert len(result.shards) == len(local.shards) > 20
    assert (result.samples, result.tokens, result.documents) == (
        local.samples,
        local.tokens,
        local.documents,
    )
    # Both nodes worked: one actor per CPU, each tokenizing and writing.
    nodes = {w.name.split(" pid ")[0] for w in result.workers}
    assert len(nodes) == 2
    assert all(w.chunks > 0 and w.shards > 0 for w in result.workers)
    assert sum(w.items for w in result.workers) == len(docs)
    assert sum(w.shards for w in result.workers) == len(result.shards)


def test_one_ray_worker_writes_the_same_bytes_as_two(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(1500, seed=32))
    options = {"inputs": (str(tmp_path / "d.jsonl"),), "seq_len": 32, "chunk_bytes": 16 << 10}
    for workers in (1, 2):
        build_text_on_ray(
            TextBuildConfig(output=str(tmp_path / f"w{workers}"), **options, **SMALL),
            RayOptions(address=ray_cluster.address, workers=workers),
        )
    build_text(TextBuildConfig(output=str(tmp_path / "local"), workers=2, **options, **SMALL))
    assert dir_bytes(tmp_path / "w1") == dir_bytes(tmp_path / "w2") == dir_bytes(tmp_path / "local")


def test_images_on_two_nodes_are_byte_identical_to_the_local_build(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    root = tmp_path / "images"
    for label in range(3):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(90):
            size = (64 + 8 * (i % 5), 48)
            (root / f"class{label}" / f"{i:04d}.jpg").write_bytes(
                jpeg_bytes(label * 1000 + i, size)
            )
    (root / "class1" / "0007.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    options = {"inputs": (str(root),), "on_bad_image": "skip", **SMALL, "shard_size": 16 << 10}
    build_images(ImageBuildConfig(output=str(tmp_path / "local"), workers=1, **options))
    result = build_images_on_ray(
        ImageBuildConfig(output=str(tmp_path / "ray"), **options),
        RayOptions(address=ray_cluster.address),
    )
    assert dir_bytes(tmp_path / "ray") == dir_bytes(tmp_path / "local")
    assert [b.source for b in result.skipped] == [str(root / "class1" / "0007.jpg")]
    labels = [s["label"] for s in read_with_ours(tmp_path / "ray")]
    assert labels == sorted(labels) and len(labels) == 269
    assert len({w.name.split(" pid ")[0] for w in result.workers}) == 2


def test_bad_input_found_by_a_worker_is_the_local_builders_error(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    from shardstream.errors import InputError

    write_jsonl(tmp_path / "d.jsonl", make_docs(400, seed=33))
    with (tmp_path / "d.jsonl").open("a") as fh:
        fh.write('{"text": "fine"}\n{broken\n')
    with pytest.raises(InputError, match=r"d\.jsonl:402: invalid JSON"):
        build_text_on_ray(
            TextBuildConfig(
                output=str(tmp_path / "out"),
                inputs=(str(tmp_path / "d.jsonl"),),
                seq_len=16,
                chunk_bytes=4096,
                **SMALL,
            ),
            RayOptions(address=ray_cluster.address),
        )
    assert not (tmp_path / "out" / "index.json").exists()
    assert not list((tmp_path / "out").glob("shard.*"))  # an input error discards the output


def test_cli_ray_flag_builds_on_the_cluster_and_reports_each_worker(
    tmp_path: Path, ray_cluster: RayCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstream.cli import main

    write_jsonl(tmp_path / "d.jsonl", make_docs(800, seed=34))
    common = ["build", "text", str(tmp_path / "d.jsonl"), "--seq-len", "32", "--no-progress"]
    common += ["--shard-size", "4KB", "--allow-small-shards", "--chunk-bytes", "8KB"]
    common += ["--compression", "zstd", "--spread-prefixes"]  # written as the workers write
    assert main([*common, "-o", str(tmp_path / "local"), "--workers", "1"]) == 0
    capsys.readouterr()
    assert main([*common, "-o", str(tmp_path / "ray"), "--ray", ray_cluster.address]) == 0
    err = capsys.readouterr().err
    assert dir_bytes(tmp_path / "ray") == dir_bytes(tmp_path / "local")
    assert list((tmp_path / "ray").glob("*/shard.*.mds.zstd"))  # hashed folders, compressed
    workers = [line for line in err.splitlines() if line.startswith("worker 127.0.0.2 node")]
    assert len(workers) == 2, err  # one line per actor: documents/s, MB/s in, shards, busy %
    assert all("documents/s" in line and "shards" in line for line in workers)


def _cli_subprocess(args: list[str], *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}\nimport sys\nfrom shardstream.cli import main\nsys.exit(main({args!r}))"
    env = {**os.environ, **TEST_RAY_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
        check=False,
    )  # fmt: skip


def test_cli_ray_without_ray_installed_says_what_to_install(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(50, seed=35))
    args = ["build", "text", str(tmp_path / "d.jsonl"), "-o", str(tmp_path / "o"), "--ray", "auto"]
    # As on a machine without the extra: ``import ray`` fails.
    done = _cli_subprocess(args, prelude="import sys; sys.modules['ray'] = None")
    assert done.returncode == 1
    assert "shardstream: error: building on Ray needs Ray installed" in done.stderr
    assert "pip install 'shardstream[ray]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_ray_local_starts_ray_on_this_machine(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(300, seed=36))
    common = ["build", "text", str(tmp_path / "d.jsonl"), "--seq-len", "16", "--no-progress"]
    common += ["--shard-size", "2KB", "--allow-small-shards", "--chunk-bytes", "4KB"]
    done = _cli_subprocess(
        [*common, "-o", str(tmp_path / "ray"), "--ray", "local", "--workers", "1"]
    )
    assert done.returncode == 0, done.stderr
    assert "worker 127.0.0.1 node" in done.stderr  # a node on loopback
    build_text(
        TextBuildConfig(
            output=str(tmp_path / "local"),
            inputs=(str(tmp_path / "d.jsonl"),),
            seq_len=16,
            shard_size=2048,
            allow_small_shards=True,
            chunk_bytes=4096,
            progress=False,
        )
    )
    assert dir_bytes(tmp_path / "ray") == dir_bytes(tmp_path / "local")


def _shards_and_index(files: dict[str, bytes]) -> dict[str, bytes]:
    """The shards and index.json (shardstream.json names the inputs, which differ here)."""
    return {k: v for k, v in files.items() if k != "shardstream.json"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Use 'expr':UserWarning")
def test_text_from_s3_inputs_and_from_a_ray_dataset_matches_the_local_build(
    tmp_path: Path, tokenizer_file: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    import ray

    docs = make_docs(2500, seed=37, max_words=100)
    write_jsonl(tmp_path / "part-0.jsonl", docs[:1200])
    write_jsonl(tmp_path / "part-1.jsonl", docs[1200:])
    raw = open_store(f"{s3_bucket.url}/raw")
    for name in ("part-0.jsonl", "part-1.jsonl"):
        raw.upload(tmp_path / name, name)
    options = {"tokenizer": tokenizer_file, "seq_len": 64, **SMALL}
    local_inputs = (str(tmp_path / "part-0.jsonl"), str(tmp_path / "part-1.jsonl"))
    build_text(TextBuildConfig(output=str(tmp_path / "local"), inputs=local_inputs, **options))
    reference = _shards_and_index(dir_bytes(tmp_path / "local"))

    # s3:// inputs: listed by the driver, read by Ray Data on the workers.
    url = f"{s3_bucket.url}/from-s3"
    result = build_text_on_ray(
        TextBuildConfig(output=url, inputs=(f"{s3_bucket.url}/raw/",), **options),
        RayOptions(address=ray_cluster.address),
    )
    assert _shards_and_index(stored_objects(url)) == reference
    assert [entry["url"] for entry in result.lineage[:2]] == [
        f"{s3_bucket.url}/raw/part-0.jsonl",
        f"{s3_bucket.url}/raw/part-1.jsonl",
    ]

    # A dataset the user prepared with Ray Data (here: filtered rows of a bigger table).
    ray.init(address=ray_cluster.address, _node_ip_address="127.0.0.2", logging_level="ERROR")
    try:
        rows = [{"text": doc, "keep": True} for doc in docs]
        rows.insert(700, {"text": "a row the user drops", "keep": False})
        dataset = ray.data.from_items(rows, override_num_blocks=7).filter(lambda r: r["keep"])
        build_text_on_ray(
            TextBuildConfig(output=str(tmp_path / "from-ds"), inputs=("my-corpus",), **options),
            dataset=dataset,
            lineage=[{"name": "my-corpus", "rows": len(docs)}],
        )
    finally:
        ray.shutdown()
    assert _shards_and_index(dir_bytes(tmp_path / "from-ds")) == reference


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_images_from_a_ray_dataset_and_from_s3_match_the_local_parquet_build(
    tmp_path: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    rows = [{"img": jpeg_bytes(i, (48 + i % 7, 40)), "cls": i % 4} for i in range(150)]
    rows[33]["img"] = b"\xff\xd8\xff truncated"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pets.parquet", row_group_size=40)
    options = {
        "image_field": "img",
        "label_field": "cls",
        "on_bad_image": "skip",
        **SMALL,
        "shard_size": 16 << 10,
    }
    build_images(
        ImageBuildConfig(output=str(tmp_path / "local"), inputs=(str(tmp_path / "pets.parquet"),),
                         workers=1, **options)
    )  # fmt: skip
    ray.init(address=ray_cluster.address, _node_ip_address="127.0.0.2", logging_level="ERROR")
    try:
        dataset = ray.data.from_items(rows, override_num_blocks=5)
        result = build_images_on_ray(
            ImageBuildConfig(output=str(tmp_path / "ray"), inputs=("pets",), **options),
            dataset=dataset,
        )
    finally:
        ray.shutdown()
    assert _shards_and_index(dir_bytes(tmp_path / "ray")) == _shards_and_index(
        dir_bytes(tmp_path / "local")
    )
    assert result.columns == {"image": "jpeg", "label": "int"}  # sniffed by a worker
    assert [b.source for b in result.skipped] == ["dataset block 1 row 3"]

    # Image Parquet in object storage: listed by the driver, read by Ray Data.
    open_store(f"{s3_bucket.url}/raw").upload(tmp_path / "pets.parquet", "pets.parquet")
    url = f"{s3_bucket.url}/from-s3"
    build_images_on_ray(
        ImageBuildConfig(output=url, inputs=(f"{s3_bucket.url}/raw/",), **options),
        RayOptions(address=ray_cluster.address),
    )
    assert _shards_and_index(stored_objects(url)) == _shards_and_index(
        dir_bytes(tmp_path / "local")
    )


def test_ray_is_imported_only_when_a_build_asks_for_it() -> None:
    # The client install stays light: the CLI and the builder's modules load without Ray.
    code = (
        "import sys\n"
        "import shardstream.shard_builder, shardstream.shard_builder.cluster\n"
        "from shardstream.cli import build_parser\n"
        "build_parser().parse_args(['build', 'text', 'x.jsonl', '--ray', 'auto'])\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_ray_runs_in_a_private_namespace_and_dials_only_loopback(ray_cluster: RayCluster) -> None:
    # Where these tests run, loopback is the only interface (tools/in-private-netns), and
    # every TCP connection the cluster has open (ss: this namespace's sockets) is on it.
    from tests.fixtures.netns import in_private_netns

    assert in_private_netns()
    peers = subprocess.run(["ss", "-tnH"], capture_output=True, text=True, check=True).stdout
    addresses = [line.split()[4].rsplit(":", 1)[0] for line in peers.splitlines() if line]
    assert addresses, "the cluster holds connections"
    plain = [a.strip("[]").removeprefix("::ffff:") for a in addresses]  # IPv4-mapped too
    assert [a for a in plain if not (a.startswith("127.") or a == "::1")] == []


# ``--ray local`` beside a network interface: a veth pair whose two ends are both in a
# nested namespace of their own (nothing it sends can leave it), so Ray sees a machine
# address (10.99.0.1, with a default route) as it would on a real host.
_WITH_AN_INTERFACE = """
set -e
ip link set lo up
ip link add v0 type veth peer name v1
ip addr add 10.99.0.1/24 dev v0
ip link set v0 up
ip link set v1 up
ip route add default via 10.99.0.2 dev v0 onlink
exec "$0" -c "$1"
"""
_LISTENERS_DURING_A_LOCAL_SESSION = """
import subprocess
from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
with ray_session(RayOptions(address="local", workers=1)) as ray:
    print("node", ray.get(ray.remote(ray.util.get_node_ip_address).remote()))
    print(subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout)
"""


def test_ray_local_listens_only_on_loopback_even_beside_a_network_interface(
    tmp_path: Path,
) -> None:
    # connect.py's rule: a try-out instance does not listen on the network. Every server
    # Ray starts for it (GCS, raylet, workers, the autoscaler monitor, its agents) is bound
    # to loopback, though Ray would otherwise pick the interface's address or all of them.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("RAY_AUTH_MODE", None)  # as a user runs it
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        ["unshare", "--net", "bash", "-c", _WITH_AN_INTERFACE, sys.executable,
         _LISTENERS_DURING_A_LOCAL_SESSION],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "node 127.0.0.1" in lines, done.stdout
    listeners = [line.split() for line in lines if line.startswith("LISTEN")]
    assert len(listeners) >= 4, done.stdout  # GCS, raylet (2), the driver, a worker, ...
    wide = [" ".join(fields) for fields in listeners if not _on_loopback(fields[3])]
    assert wide == [], "\n".join(wide)


def _on_loopback(local: str) -> bool:
    """Whether an ``ss`` local address (``127.0.0.1:80``, ``[::ffff:127.0.0.1]:80``, ``*:80``,
    ``[::1]:80``) is a loopback one."""
    host = local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
    return host.startswith("127.") or host == "::1"


def _build_as_a_user(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """``shardstream build ARGS`` with ``home`` as HOME and no Ray authentication settings
    (as a user runs it: not the tests' ``RAY_AUTH_MODE=disabled``)."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[2])}
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "shardstream", "build", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def _small_text_build(tmp_path: Path, output: str) -> list[str]:
    corpus = tmp_path / "d.jsonl"
    if not corpus.exists():
        write_jsonl(corpus, make_docs(200, seed=38))
    return [
        *("text", str(corpus), "-o", str(tmp_path / output), "--seq-len", "16"),
        *("--shard-size", "2KB", "--allow-small-shards", "--chunk-bytes", "4KB", "--no-progress"),
    ]


def _home(tmp_path: Path, name: str, token: str | None = None) -> Path:
    """A HOME folder, with ``~/.ray/auth_token`` holding ``token`` if given."""
    home = tmp_path / name
    (home / ".ray").mkdir(parents=True)
    if token is not None:
        (home / ".ray" / "auth_token").write_text(token)
    return home


def test_ray_local_leaves_no_token_that_would_switch_later_clusters_to_tokens(
    tmp_path: Path,
) -> None:
    # Ray writes ~/.ray/auth_token at a local start, and from then on every `ray start
    # --head` on the machine turns token authentication on. The try-out runs with a token
    # of its own, passed through the environment: nothing is left in ~/.ray.
    home = _home(tmp_path, "home")
    done = _build_as_a_user([*_small_text_build(tmp_path, "o"), "--ray", "local"], home)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "o" / "index.json").exists()
    assert list((home / ".ray").iterdir()) == []


def test_cli_ray_joins_a_token_authenticated_cluster_or_names_the_missing_token(
    tmp_path: Path,
) -> None:
    token = secrets.token_hex(32)
    with token_auth_head(_home(tmp_path, "head", token)) as address:
        # The driver has the cluster's token (~/.ray/auth_token): it sends it.
        done = _build_as_a_user(
            [*_small_text_build(tmp_path, "with-token"), "--ray", address],
            _home(tmp_path, "driver", token),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert (tmp_path / "with-token" / "index.json").exists()
        # The probe's first, tokenless ask is refused, as expected: Ray's warning about it
        # is not shown (it read as a failure of a build that worked).
        assert "InvalidAuthToken" not in done.stderr, done.stderr[-3000:]
        assert "Failed to get cluster ID" not in done.stderr, done.stderr[-3000:]

        # No token here: one error that names token authentication and the fix.
        done = _build_as_a_user(
            [*_small_text_build(tmp_path, "no-token"), "--ray", address], _home(tmp_path, "bare")
        )
        assert done.returncode == 1
        assert f"the Ray cluster at '{address}' uses token authentication" in done.stderr
        assert "this machine has no token" in done.stderr
        assert "RAY_AUTH_TOKEN" in done.stderr and "auth_token" in done.stderr
        assert "ray start --head" not in done.stderr  # not the "start a cluster" advice
        assert "Traceback" not in done.stderr

        # Another cluster's token: refused, said so.
        done = _build_as_a_user(
            [*_small_text_build(tmp_path, "bad-token"), "--ray", address],
            _home(tmp_path, "other", secrets.token_hex(32)),
        )
        assert done.returncode == 1
        assert "refuses this machine's token (from " in done.stderr
        assert "Traceback" not in done.stderr


def test_cli_ray_joins_a_cluster_without_tokens_from_a_machine_that_has_one(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    # The fixture's cluster runs without token authentication; this driver has a token
    # (left by an earlier local Ray start) and sends none where none is wanted.
    done = _build_as_a_user(
        [*_small_text_build(tmp_path, "o"), "--ray", ray_cluster.address],
        _home(tmp_path, "driver", secrets.token_hex(32)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "o" / "index.json").exists()
