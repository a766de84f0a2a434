"""The loader's state inside a framework's checkpoint folder, and the check that it fits.

A framework checkpoint (``checkpoint-500/`` of the Hugging Face ``Trainer``, a folder of
``accelerate``'s ``save_state``) holds the model at one trainer step. The data position
saved beside it must be the one *of that step*: a model at step 500 trained on from the
data position of step 400 reads 100 steps of samples twice, silently. So the file records
the trainer step it was written at, and a resume compares it with the step of the model
it restored before the first batch is read (the same refusal the server makes for a run's
checkpoints, docs/training.md).

The file is JSON (``shardstream_data.json``), written to a temporary name and renamed, so a
process killed while saving leaves either the whole file or none.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from shardstream.client.loader import ShardstreamLoader
from shardstream.errors import ConfigError, ResumeError

__all__ = ["DATA_STATE_FILE", "read_data_state", "require", "restore_loader", "write_data_state"]

DATA_STATE_FILE = "shardstream_data.json"
"""The loader's state in a framework's checkpoint folder."""


def require(module: str, extra: str) -> ModuleType:
    """Import a framework, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"shardstream's {extra} integration needs {module!r} ({exc}); "
            f"install it with: pip install 'shardstream[{extra}]'"
        ) from exc


def write_data_state(
    folder: str | os.PathLike[str], step: int, loader: ShardstreamLoader, framework: str
) -> Path:
    """Write ``loader``'s state, as of trainer step ``step``, into ``folder`` (atomically)."""
    path = Path(folder) / DATA_STATE_FILE
    body = {
        "framework": framework,
        "step": step,
        "world_size": loader.dataset.topology.world_size,
        "loader": loader.state_dict(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)
    return path


def read_data_state(folder: str | os.PathLike[str], framework: str) -> tuple[int, dict[str, Any]]:
    """``(trainer step, loader state)`` saved in ``folder``; :class:`ResumeError` if none."""
    path = Path(folder) / DATA_STATE_FILE
    try:
        body = json.loads(path.read_text())
        return int(body["step"]), dict(body["loader"])
    except FileNotFoundError:
        raise ResumeError(
            f"{folder} has no shardstream data state ({DATA_STATE_FILE}): it was not saved by "
            f"shardstream's {framework} integration, or the job died while saving it; resume "
            "from an earlier checkpoint that has one"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"{path} is not a shardstream data state: {exc!r}") from None


def restore_loader(
    loader: ShardstreamLoader, folder: str | os.PathLike[str], model_step: int, framework: str
) -> int:
    """Load the data state saved in ``folder`` into ``loader`` if it is that of
    ``model_step`` (the step of the model restored from the same folder); returns the step.

    Refused, before any batch is read: a folder without a state, a state of another step,
    and a state whose order differs from the loader's (:meth:`ShardstreamLoader.load_state_dict`;
    with a run id, the server's check of the step too)."""
    if model_step < 0:
        raise ConfigError(f"the trainer step of {folder} is negative ({model_step})")
    step, state = read_data_state(folder, framework)
    if step != model_step:
        raise ResumeError(
            f"{folder}: the model was saved at step {model_step} but shardstream's data state "
            f"({DATA_STATE_FILE}) is that of step {step}; resuming would read the samples of "
            f"{abs(model_step - step)} steps {'twice' if model_step > step else 'never'}. The "
            "two files come from different saves: resume from a checkpoint whose files were "
            "written together"
        )
    loader.load_state_dict(state, step=step)
    return step
