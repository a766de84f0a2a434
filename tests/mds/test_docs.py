"""The runnable example in docs/format.md runs and prints what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def test_format_doc_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = re.findall(r"## Example\n\n```python\n(.*?)```", DOC.read_text(), re.S)
    exec(compile(code, str(DOC), "exec"), {"__name__": "format_example"})
    out = capsys.readouterr().out
    assert out.startswith("100 {'id': 7, 'text': 'doc 7'")
