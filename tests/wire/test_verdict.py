"""The input-bound verdict has one home, :class:`shardstream.wire.Verdict`: the client gives
it, the server counts it, and both still write the plain strings they always wrote."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import shardstream
from shardstream.client.batches import input_stats as client_stats
from shardstream.server.data import input_stats as server_stats
from shardstream.wire import INPUT_BOUND, InputFigures, Verdict


def test_the_names_and_their_wire_values() -> None:
    assert [v.value for v in Verdict] == ["unknown", "not_input_bound", "io_bound", "cpu_bound"]
    assert set(INPUT_BOUND) == {Verdict.IO_BOUND, Verdict.CPU_BOUND}


def test_the_client_and_the_server_use_the_wires() -> None:
    assert client_stats.Verdict is Verdict
    assert client_stats.verdict(100, 0.5, 0.9) is Verdict.CPU_BOUND
    assert server_stats.verdict_of({"io_bound": 1, "cpu_bound": 1}) is Verdict.IO_BOUND
    assert server_stats.verdict_of({"not_input_bound": 2}) is Verdict.NOT_INPUT_BOUND
    assert server_stats.verdict_of({}) is Verdict.UNKNOWN


def test_a_verdict_is_written_as_its_plain_string() -> None:
    """Formatting, JSON and the wire model give what the plain strings gave."""
    v = Verdict.IO_BOUND
    assert v == "io_bound" and f"input: {v}" == "input: io_bound" and str(v) == "io_bound"
    assert json.dumps({"verdict": v}) == '{"verdict": "io_bound"}'
    figures: dict[str, object] = {"rank": 0, "world_size": 1, "batches": 9}
    figures.update(data_wait_s=1.0, step_s=2.0, latency_counts=[0] * 10)
    assert InputFigures.model_validate(figures).verdict is Verdict.UNKNOWN
    report = InputFigures.model_validate({**figures, "verdict": "cpu_bound"})
    assert report.verdict is Verdict.CPU_BOUND
    assert json.loads(report.model_dump_json())["verdict"] == "cpu_bound"


def test_no_module_spells_a_verdict_but_the_wire() -> None:
    """A second list of the names (as the client, the wire and the server each had) would
    drift: every other module names a verdict through the enum."""
    root = Path(shardstream.__file__).parent
    home = root / "wire" / "_input_stats.py"
    names = {v.value for v in Verdict} - {"unknown"}  # "unknown" is an ordinary word
    spelled = []
    for entry in sorted(root.iterdir()):
        paths = [entry] if entry.suffix == ".py" else sorted(entry.resolve().rglob("*.py"))
        for path in paths:
            # Migrations are frozen history: they never import today's code.
            if path == home.resolve() or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    spelled.append(f"{path}:{node.lineno}: {node.value!r}")
    assert spelled == []
