"""A real multi-process training job for resume tests: launch, record, SIGKILL, resume, compare.

* :mod:`tests.harness.job` starts ``W`` ranks as separate processes, like ``torchrun``
  (gloo, ``env://``), in one process group so one ``killpg`` stops ranks and workers.
* :mod:`tests.harness.trainer` is the loop each rank runs: build the loader, iterate,
  all-gather each step, log every consumed sample id, checkpoint ``state_dict()``.
* :mod:`tests.harness.records` reads and writes the per-rank logs and checkpoints.
* :mod:`tests.harness.compare` holds the assertions (same world size / elastic).
* :mod:`tests.harness.scenario` runs whole attempts (to the end, or until a kill).
* :mod:`tests.harness.datasets` writes an MDS dataset whose samples carry their global id.
"""
