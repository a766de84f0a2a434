"""The Ray builder's part of ``benchmarks/build.py``: scaling from 1 to 2 CPUs, per-CPU
throughput against the local builder, and the overhead per shard.

Each text workload runs four ways on the same input: the local builder with 1 and 2 worker
processes, the Ray builder with 1 and 2 worker actors (one CPU each). The Ray outputs are
compared byte for byte with the local ones.
"""

from __future__ import annotations

import resource
import shutil
import time
from pathlib import Path
from typing import Any

MB = 1 << 20
SEQ_LEN = 2048
HASHES = ("sha1", "xxh3_64")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _dir_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def ray_section(
    address: str,
    work: Path,
    workloads: list[tuple[str, list[Path], Path | None]],
    *,
    repeat: int = 2,
) -> None:
    """Run the Ray builder beside the local one and print the table and the ratios.

    The session is the builder's own (``ray_session``, what ``shardstream build --ray``
    uses): ``local`` is the one-machine instance of ``--ray local`` with 2 CPUs, bound to
    loopback with a token of the run's own; any other address is joined as the CLI joins
    it (with or without token authentication, as the cluster wants).
    """
    from shardstream.shard_builder.cluster import RayOptions
    from shardstream.shard_builder.cluster.connect import ray_session

    if address == "local":
        from tests.fixtures.netns import require_private_netns

        require_private_netns()  # build.py re-runs itself in a private namespace first
    # The builds inside find this session open and use it (workers=2: the Ray CPUs of a
    # local instance; a cluster keeps its own).
    with ray_session(RayOptions(address=address, workers=2)) as ray:
        _ray_runs(ray, address, work, workloads, repeat=repeat)


def _ray_runs(
    ray: Any,
    address: str,
    work: Path,
    workloads: list[tuple[str, list[Path], Path | None]],
    *,
    repeat: int,
) -> None:
    """The runs and the table, in an open Ray session."""
    from shardstream.shard_builder import TextBuildConfig, build_text
    from shardstream.shard_builder.cluster import RayOptions, build_text_on_ray
    from shardstream.shard_builder.inputs import resolve_inputs
    from shardstream.shard_builder.text_source import plan_chunks

    options = RayOptions(address=address)

    def run(builder: str, cpus: int, inputs: list[Path], tok: Path | None, out: Path,
            shard_size: int = 128 * MB) -> tuple[float, float, int, int, float]:  # fmt: skip
        """(wall s, of which starting the actors, documents, shards, actors' CPU s)."""
        shutil.rmtree(out, ignore_errors=True)
        config = TextBuildConfig(
            output=str(out), inputs=tuple(map(str, inputs)), tokenizer=tok, seq_len=SEQ_LEN,
            hashes=HASHES, workers=cpus, progress=False, shard_size=shard_size,
            allow_small_shards=shard_size < 64 * MB,
        )  # fmt: skip
        start = time.perf_counter()
        if builder == "ray":
            result = build_text_on_ray(config, RayOptions(address=address, workers=cpus))
        else:
            result = build_text(config)
        wall = time.perf_counter() - start
        startup = result.timings.get("workers_start_s", 0.0)
        actors_cpu = sum(w.cpu_s for w in result.workers)
        return wall, startup, result.documents, len(result.shards), actors_cpu

    print(f"\nRay builder ({options.address}; {int(ray.cluster_resources()['CPU'])} Ray CPUs)")
    print(f"{'workload':<9} {'builder':<8} {'CPUs':>4} {'wall s':>7} {'start s':>7} "
          f"{'docs/s':>9} {'MB/s':>7} {'MB/s/CPU':>9}")  # fmt: skip
    ratios: list[str] = []
    for name, inputs, tok in workloads:
        nbytes = sum(f.stat().st_size for f in inputs)
        # Best steady-state time (wall less actor start-up) and its start-up.
        best: dict[tuple[str, int], tuple[float, float]] = {}
        actors_cpu: dict[int, float] = {}  # Ray: the actors' CPU seconds, least of the runs
        docs = 0
        for _ in range(repeat):
            for builder in ("local", "ray"):
                for cpus in (1, 2):
                    out = work / f"scale-{builder}-{cpus}"
                    secs, startup, docs, _, cpu = run(builder, cpus, inputs, tok, out)
                    key = (builder, cpus)
                    if secs - startup < best.get(key, (float("inf"), 0.0))[0]:
                        best[key] = (secs - startup, startup)
                    if builder == "ray":
                        actors_cpu[cpus] = min(actors_cpu.get(cpus, float("inf")), cpu)
        same = _dir_bytes(work / "scale-ray-2") == _dir_bytes(work / "scale-local-1")
        same = same and _dir_bytes(work / "scale-ray-1") == _dir_bytes(work / "scale-local-1")
        for (builder, cpus), (secs, startup) in sorted(best.items()):
            mbps = nbytes / MB / secs
            print(f"{name:<9} {builder:<8} {cpus:>4} {secs + startup:>7.1f} {startup:>7.1f} "
                  f"{docs / secs:>9,.0f} {mbps:>7.1f} {mbps / cpus:>9.1f}")  # fmt: skip
        t = {key: secs for key, (secs, _) in best.items()}
        ratios.append(
            f"{name}: Ray 2 CPUs = {t['ray', 1] / t['ray', 2]:.2f}x 1 CPU (scaling "
            f"efficiency {t['ray', 1] / t['ray', 2] / 2:.0%}; local builder "
            f"{t['local', 1] / t['local', 2] / 2:.0%}); Ray per-CPU throughput = "
            f"{t['local', 1] / t['ray', 1]:.0%} of the local builder's on 1 CPU, "
            f"{t['local', 2] / t['ray', 2]:.0%} on 2; byte-identical to the local build: {same}"
        )
        ratios.append(
            f"{name}: the actors' CPU per MB: {actors_cpu[1] / (nbytes / MB):.3f} s with 1, "
            f"{actors_cpu[2] / (nbytes / MB):.3f} s with 2: the work grows "
            f"{actors_cpu[2] / actors_cpu[1] - 1:+.0%} with the second worker, so 2 CPUs "
            f"can do {2 * actors_cpu[1] / actors_cpu[2]:.2f}x 1 CPU's work"
        )
    print("\n".join(ratios))
    print("(docs/s and MB/s: steady state, wall less 'start s', the actors' start-up)")
    # Overhead per shard: the same input, few large shards against many small ones.
    name, inputs, tok = workloads[-1]
    big_s, big_start, _, big_n, _ = run("ray", 2, inputs, tok, work / "shards-big", 128 * MB)
    small_s, small_start, _, small_n, _ = run(
        "ray", 2, inputs, tok, work / "shards-small", 256 << 10
    )
    big_s, small_s = big_s - big_start, small_s - small_start
    per_shard = (small_s - big_s) / max(small_n - big_n, 1)
    # The driver's own CPU per unit of work (this process: the driver and its Ray
    # threads; the actors are other processes).
    cpu = _own_cpu()
    run("ray", 2, inputs, tok, work / "driver-cpu")
    driver_cpu = _own_cpu() - cpu
    chunks = len(plan_chunks(resolve_inputs(map(str, inputs), (".jsonl",)), "text"))
    print(
        f"overhead per shard ({name}, 2 Ray CPUs): {big_n} shards in {big_s:.1f}s, "
        f"{small_n} shards in {small_s:.1f}s: {per_shard * 1000:.0f} ms per extra shard"
    )
    print(
        f"driver CPU ({name}, 2 Ray CPUs, {chunks} chunks of 2 MB): {driver_cpu:.1f}s = "
        f"{driver_cpu / chunks * 1000:.1f} ms per chunk"
    )
    print("(best of the runs)")
