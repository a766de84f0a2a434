"""The project's import contract: the shared core imports no part, no part reaches into
another package's private modules, and the server never imports the client.

``shardstream/`` holds three kinds of package (docs/architecture.md, ../shared/LAYOUT.md):

* the **core** (:data:`CORE`): what two parts share, one home each (the MDS codec, storage,
  the wire schema, the pure plan, the metadata server's HTTP client, the retry policy,
  errors, hashing);
* the **parts** (:data:`PARTS`): the client, the server, the shard builder;
* the **entry points** (:data:`ENTRY_POINTS`): the ``shardstream`` command, the demo and the
  integrations alias, which put parts together for a user.

Rules, over every import statement (also those inside functions and under
``TYPE_CHECKING``: a lazy import is still a dependency):

1. a core module imports no part and no entry point;
2. an import from one package into another names only public modules: nothing below a
   name with a leading underscore (``shardstream.plan._scheduled``,
   ``shardstream.client._server``); a package's public entry point is its ``__init__``;
3. the server never imports the client (they meet through the wire and the core's plan).

The tests keep one rule of their own: no test module imports another ``test_*`` module; a
helper two of them share lives in a module under ``tests/fixtures/`` named for what it holds.

An exception would be listed in :data:`KNOWN_PRIVATE_IMPORTS` with its reason (there is
none today); one that no longer occurs fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import shardstream

ROOT = Path(shardstream.__file__).parent

# "__init__" is the root package: ``__version__`` and the base error, nothing of a part.
CORE = ("__init__", "api_client", "errors", "hashing", "mds", "plan", "retry", "storage", "wire")
PARTS = ("client", "server", "shard_builder")
ENTRY_POINTS = ("__main__", "cli", "demo", "integrations")

KNOWN_PRIVATE_IMPORTS: dict[tuple[str, str], str] = {
    # (importing module, private module it imports): why it is still allowed, written
    # here beside it. None today: the core packages export what the parts use (issue 32).
}


def package_modules() -> dict[str, Path]:
    """Every module below ``shardstream`` by dotted name, the parts' folders (reached through
    symlinks) included."""
    found: dict[str, Path] = {}
    for entry in sorted(ROOT.iterdir()):
        if entry.suffix == ".py":
            found[f"shardstream.{entry.stem}"] = entry
        elif entry.is_dir() and (entry / "__init__.py").exists():
            for path in sorted(entry.resolve().rglob("*.py")):
                parts = path.relative_to(entry.resolve()).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(("shardstream", entry.name, *parts))] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every ``shardstream`` module ``path`` may import; for
    ``from x import y`` both ``x`` and ``x.y`` (``y`` may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module or ""]).strip(".")
            else:
                target = node.module or ""
            names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] == "shardstream"]
    return found


def area_of(name: str) -> str:
    """The package of ``shardstream`` a dotted name belongs to (``__init__`` for the root)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def private_prefix(name: str) -> str | None:
    """``name`` up to its first private component (``_x``, not a dunder), or None."""
    parts = name.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[: i + 1])
    return None


def violations(
    modules: Mapping[str, Path],
    known: Mapping[tuple[str, str], str] = KNOWN_PRIVATE_IMPORTS,
) -> list[str]:
    """One line per import statement and broken rule, naming file, line, the importing
    module, what it imports and the rule."""
    broken: dict[tuple[str, int, str], str] = {}  # (file, line, rule) -> the import
    used: set[tuple[str, str]] = set()
    for module, path in modules.items():
        own = area_of(module)
        for line, name in imports_of(module, path):
            target = area_of(name)
            rules = []
            if own in CORE and (target in PARTS or target in ENTRY_POINTS) and target != own:
                rules.append(f"the core ({own}) imports no part")
            if own == "server" and target == "client":
                rules.append("the server never imports the client")
            private = private_prefix(name)
            if private is not None and target != own:
                if (module, private) in known:
                    used.add((module, private))
                else:
                    rules.append(f"{private} is private to {target}")
            for rule in rules:  # the statement's module comes first: ``x`` before ``x.y``
                broken.setdefault((str(path), line, rule), f"{module} imports {name}")
    found = [f"{file}:{line}: {what}: {rule}" for (file, line, rule), what in broken.items()]
    found += [
        f"{module} no longer imports {private}: remove it from KNOWN_PRIVATE_IMPORTS"
        for module, private in known
        if (module, private) not in used and module in modules
    ]
    return sorted(found)


def test_every_package_is_core_part_or_entry_point() -> None:
    areas = {area_of(m) for m in package_modules()}
    unknown = areas - set(CORE) - set(PARTS) - set(ENTRY_POINTS)
    assert unknown == set(), f"classify {sorted(unknown)} in {__file__}"
    assert {"plan", "wire", "mds", "storage"} <= areas  # the walk sees the core
    assert set(PARTS) <= areas  # and the parts behind their symlinks


def test_the_project_keeps_its_import_contract() -> None:
    assert violations(package_modules()) == []


def test_the_core_plan_imports_nothing_but_the_core() -> None:
    """The plan is pure (docs/plan.md): it imports only itself and the errors."""
    for module, path in package_modules().items():
        if area_of(module) == "plan":
            outside = {area_of(n) for _, n in imports_of(module, path)} - {"plan", "errors"}
            assert outside == set(), f"{module} imports {outside}"


def _inject(tmp_path: Path, module: str, source: str) -> dict[str, Path]:
    path = tmp_path / ("__init__.py" if module.count(".") == 1 else "m.py")
    path.write_text(source)
    return {module: path}


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        (
            "shardstream.plan._epoch",
            "from shardstream.client.state import ReaderState\n",
            "the core (plan) imports no part",
        ),
        (
            "shardstream.plan._epoch",
            "from ..client import state\n",
            "the core (plan) imports no part",
        ),
        (
            "shardstream.wire._runs",
            "def f():\n    import shardstream.server.models\n",
            "the core (wire) imports no part",
        ),
        (
            "shardstream.mds._reader",
            "from shardstream import demo\n",
            "the core (mds) imports no part",
        ),
        (
            "shardstream.server.data.audit",
            "from shardstream.client.plan import EpochPlan\n",
            "the server never imports the client",
        ),
        (
            "shardstream.server.data.audit",
            "from shardstream.plan._scheduled import split_by_weights\n",
            "shardstream.plan._scheduled is private to plan",
        ),
        (
            "shardstream.shard_builder.publish",
            "from shardstream.client import _server\n",
            "shardstream.client._server is private to client",
        ),
        (
            "shardstream.client.batches.stream",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from shardstream.wire._runs import RunCreate\n",
            "shardstream.wire._runs is private to wire",
        ),
    ],
)
def test_an_injected_violation_is_named(
    tmp_path: Path, module: str, source: str, rule: str
) -> None:
    """The check itself can fail: each rule, in each spelling of an import."""
    found = violations(_inject(tmp_path, module, source), known={})
    assert len(found) == 1 and found[0].endswith(rule), found
    assert f"{module} imports" in found[0] and ":" in found[0]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("shardstream.plan._epoch", "from shardstream.plan._config import PlanConfig\n"),
        ("shardstream.plan._epoch", "from shardstream.errors import PlanError\n"),
        ("shardstream.server.data.audit", "from shardstream.plan import EpochPlan\n"),
        ("shardstream.client.batches.stream", "from shardstream.client._server import x\n"),
        ("shardstream.client.cli", "from shardstream.wire import RunCreate\n"),
        ("shardstream.cli", "import shardstream.server.cli\n"),
    ],
)
def test_what_the_contract_allows(tmp_path: Path, module: str, source: str) -> None:
    """A package's own private modules, the core's public names, entry points over parts."""
    assert violations(_inject(tmp_path, module, source), known={}) == []


def test_a_known_exception_that_no_longer_occurs_is_named(tmp_path: Path) -> None:
    modules = _inject(tmp_path, "shardstream.client.reads.ranges", "import numpy\n")
    known = {("shardstream.client.reads.ranges", "shardstream.mds._blocks"): "a reason"}
    assert violations(modules, known) == [
        "shardstream.client.reads.ranges no longer imports shardstream.mds._blocks: "
        "remove it from KNOWN_PRIVATE_IMPORTS"
    ]


def _names(modules: Iterable[str]) -> set[str]:
    return {area_of(m) for m in modules}


def test_every_known_exception_has_a_reason_and_exists() -> None:
    modules = package_modules()
    for (module, private), reason in KNOWN_PRIVATE_IMPORTS.items():
        assert reason.strip(), (module, private)
        assert module in modules, f"{module} (KNOWN_PRIVATE_IMPORTS) is no module"
        assert private_prefix(private) == private
    assert _names(m for m, _ in KNOWN_PRIVATE_IMPORTS) <= set(CORE) | set(PARTS)


# --- tests: a helper two test modules share lives under tests/fixtures/, not in either -----

TESTS = Path(__file__).parent


def modules_below(root: Path = TESTS) -> dict[str, Path]:
    """Every module below ``root`` (the ``tests`` package) by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("tests", *parts))] = path
    return found


def named_test_module(name: str) -> str | None:
    """The ``tests.….test_x`` module a dotted name below ``tests`` lies in, or None."""
    parts = name.split(".")
    if parts[0] != "tests":
        return None
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[: i + 1])
    return None


def imports_between_tests(modules: Mapping[str, Path]) -> list[str]:
    """One line per import of another ``test_*`` module (by any spelling), naming file, line,
    the importing module and what it imports: the helper belongs in ``tests/fixtures/``."""
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    base = ".".join([*up[: len(up) - (node.level - 1)], base]).strip(".")
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                test_module = named_test_module(name)
                if test_module is not None and test_module != module:
                    found.append(
                        f"{path}:{node.lineno}: {module} imports {test_module}: "
                        "move the helper to tests/fixtures/"
                    )
                    break
    return sorted(found)


def test_no_test_module_imports_another() -> None:
    assert "tests.fixtures.datasets" in modules_below()  # the walk sees the helpers' home
    assert imports_between_tests(modules_below()) == []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.server.test_console import sign_in\n",
        "def f():\n    from tests.client.reads.test_ranged_reads import N\n",
        "import tests.builder.test_resume\n",
        "from tests.builder import test_resume\n",
        "from .test_loader import dataset\n",
    ],
)
def test_an_injected_test_import_is_named(tmp_path: Path, source: str) -> None:
    """The check itself can fail, in each spelling of the import."""
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "test_new.py").write_text(source)
    found = imports_between_tests(modules_below(tmp_path))
    assert len(found) == 1, found
    assert "tests.workers.test_new imports tests." in found[0]
    assert found[0].endswith("move the helper to tests/fixtures/")


@pytest.mark.parametrize(
    "source",
    [
        "from tests.fixtures.datasets import write_tokens\n",
        "from tests.server.conftest import make_published\n",
        "import test_helpers_elsewhere\n",  # not below tests/
    ],
)
def test_what_the_test_check_allows(tmp_path: Path, source: str) -> None:
    (tmp_path / "test_new.py").write_text(source)
    assert imports_between_tests(modules_below(tmp_path)) == []
