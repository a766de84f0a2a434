"""The client's layers: every import points down, never up or across.

The client is read from the top (the torch front ends) down to the node cache::

    integrations/                                the trainers' glue (HF Trainer, accelerate...)
    dataset, loader, cli, _server, committer     front ends and the calls to the server
    resume, state                                the one resume state and position rules
    workers/                                     the fast loader's processes and ring
    batches/                                     plan positions -> tensors in one process
    reads/                                       shard bytes into this process (calls storage)
    sources/                                     a source pinned to a version, its index
    cache/                                       the node-local disk cache
    options, distributed                         plain settings, used by every layer
    plan/                                        re-exports shardstream.plan (the core's pure plan)

A module may import its own layer and any layer below it. The test walks every import
statement (also those inside functions and under ``TYPE_CHECKING``: a type that points up is
still a dependency that points up), so a change that breaks the layering fails here with the
edge named. docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardstream.client

CLIENT = Path(shardstream.client.__file__).parent
PREFIX = "shardstream.client"

# Highest first. A module's layer is the first entry that its dotted name starts with.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("integrations", ("integrations",)),  # the trainers' glue, over the front ends
    ("front ends", ("__init__", "dataset", "loader", "cli", "_server", "committer")),
    ("resume", ("resume", "state")),  # the one resume state; the stream below never sees one
    ("workers", ("workers",)),
    ("batches", ("batches",)),
    ("reads", ("reads",)),
    ("sources", ("sources",)),
    ("cache", ("cache",)),
    ("settings", ("options", "distributed")),
    ("plan", ("plan",)),
]


def layer_of(module: str) -> int:
    """The rank of ``module`` (a name below ``shardstream.client``; 0 is the top)."""
    head = module.split(".", maxsplit=1)[0]
    for rank, (_, heads) in enumerate(LAYERS):
        if head in heads:
            return rank
    raise AssertionError(
        f"shardstream.client.{module} belongs to no layer: add it to LAYERS in {__file__}"
    )


def client_modules() -> dict[str, Path]:
    """Every module of the client, by its name below ``shardstream.client``."""
    found = {}
    for path in sorted(CLIENT.rglob("*.py")):
        parts = path.relative_to(CLIENT).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, module below ``shardstream.client``) for each client import in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module or ""]).strip(".")
                names = [f"{PREFIX}.{target}" if target else PREFIX]
            else:
                names = [node.module or ""]
            if node.module is None or names == [PREFIX]:
                # from . import x, from shardstream.client import x: x may be a module
                names = [f"{names[0]}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(PREFIX + "."):
                edges.append((node.lineno, name[len(PREFIX) + 1 :]))
    return edges


def violations() -> list[str]:
    found = []
    for module, path in client_modules().items():
        if module == "__init__":  # the public namespace re-exports from every layer
            continue
        own = layer_of(module)
        for line, target in imports_of(module, path):
            if layer_of(target) < own:
                found.append(
                    f"{path.relative_to(CLIENT.parent)}:{line}: {module} ({LAYERS[own][0]}) "
                    f"imports {target} ({LAYERS[layer_of(target)][0]}), a layer above it"
                )
    return found


def test_every_client_import_points_down() -> None:
    assert violations() == []


def test_client_plan_only_re_exports_the_core_plan() -> None:
    """The plan's home is ``shardstream.plan`` (the core; its purity is the project-wide
    contract's, tests/test_import_contract.py): ``client/plan`` is one module that imports
    the core plan's public names and nothing else, so it can never grow a second plan."""
    found = [m for m in client_modules() if m.split(".")[0] == "plan"]
    assert found == ["plan"]
    tree = ast.parse(client_modules()["plan"].read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [getattr(n, "module", None) for n in imported] == ["shardstream.plan"]
    import shardstream.client.plan as alias
    import shardstream.plan as core

    assert set(alias.__all__) <= set(core.__all__)
    assert all(getattr(alias, name) is getattr(core, name) for name in alias.__all__)


def test_only_reads_and_sources_reach_storage() -> None:
    """Object storage (``shardstream.storage``) is reached from reads/ and sources/ only; the
    input figures (batches/input_stats.py) read its request counters, nothing else."""
    seen = set()
    for module, path in client_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "shardstream.storage"
            ):
                names = {alias.name for alias in node.names}
                seen.add(module.split(".")[0])
                if module.split(".")[0] not in ("reads", "sources"):
                    assert names <= {"storage_counters"}, f"{module} imports {names} from storage"
    assert {"reads", "sources"} <= seen  # the check sees the imports it is about


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("cache.keys", "from shardstream.client.reads.io import x\n", ["reads.io"]),
        ("reads.io", "from ..cache.keys import x\n", ["cache.keys"]),
        ("reads.io", "from .. import options\n", ["options"]),
        ("reads.io", "from . import ranges\n", ["reads.ranges"]),
        ("plan._epoch", "from shardstream.client import options\n", ["options"]),
    ],
)
def test_the_walk_sees_every_spelling_of_an_import(
    tmp_path: Path, module: str, source: str, expected: list[str]
) -> None:
    """The check itself can fail: absolute, relative and package imports are all seen."""
    path = tmp_path / "m.py"
    path.write_text(source)
    assert [t for _, t in imports_of(module, path)] == expected


def test_an_upward_import_is_named() -> None:
    assert layer_of("batches.stream") > layer_of("resume") == layer_of("state")
    assert layer_of("reads.io") > layer_of("batches.stream")
    assert layer_of("cache.keys") > layer_of("reads.io")
    assert layer_of("plan") == len(LAYERS) - 1
