"""Start a job's ranks by forking one process that has imported the framework once:
``python -m tests.client.integrations.fork_ranks MODULE CONFIG.json WORLD_SIZE``.

Importing torch and transformers costs each rank 5-10 CPU-seconds, most of a tiny test
job's work; on a shared 2-core CI machine that is minutes per test. So this launcher imports
``MODULE`` and calls its ``preload()`` (the heavy imports), then forks one process per rank,
as a ``DataLoader`` forks its workers after torch is imported. Each rank is still its own
process: its own ``RANK``/``LOCAL_RANK``, its own place in the gloo group, its own output
file (``rank{R}.out`` in the config's ``attempt`` folder), and it runs ``MODULE.main(CONFIG)``
from the start, with nothing initialised before the fork but imports.

The launcher exits 0 once every rank exited 0, and 1 as soon as one fails (naming it);
the ranks stay in the launcher's process group, so the test's ``killpg`` ends them all.
A rank ends with its ``atexit`` handlers and ``os._exit`` (see :func:`_exit`).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType


def _become_rank(rank: int, attempt: Path) -> None:
    """In the forked child: this rank's environment and output file."""
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(attempt / f"rank{rank}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)


def main(module_name: str, config: str, world_size: int) -> int:
    module = importlib.import_module(module_name)
    preload = getattr(module, "preload", None)
    if preload is not None:
        preload()
    gc.freeze()  # what was imported stays out of the ranks' collections (and shared)
    attempt = Path(json.loads(Path(config).read_text())["attempt"])
    ranks: dict[int, int] = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _become_rank(rank, attempt)
            _exit(_run(module, config))
        ranks[pid] = rank
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"rank {rank} exited {code}", file=sys.stderr, flush=True)
            return 1
    return 0


def _run(module: ModuleType, config: str) -> int:
    """``module.main(config)``'s exit status, as ``sys.exit`` would make it."""
    try:
        code = module.main(config)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        return 1
    return code if isinstance(code, int) else 0 if code is None else 1


def _exit(code: int) -> None:
    """Exit as the interpreter would, minus its final teardown: the job's ``atexit``
    handlers run, output is flushed, and then no garbage collection of the whole heap
    (torch, sympy, transformers: 15-20 s of wall time per rank on a loaded 2-core machine,
    with nothing observable to show for it)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
