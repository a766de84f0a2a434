"""Limits on free-form JSON documents (a run's ``plan``, a version's ``builder_config``).

A JSON field is stored as sent and returned by every list that holds it, so one large or
deeply nested document costs memory on every read, and a deep one overflows the recursion
of whatever walks it next (the JSON encoder, the database driver). Each document is
therefore checked once, iteratively (no recursion, so any depth is refused cleanly), for:

* nesting depth (``max_json_depth``, default 32 levels of objects and arrays);
* encoded size (``max_json_bytes``, default 64 KiB of UTF-8 JSON; the walk stops as soon
  as the budget is exceeded);
* what a database cannot store: NaN and infinities, NUL characters and lone UTF-16
  surrogates (``"\\ud800"`` is valid JSON but not valid UTF-8) in keys and strings.

The limits are process-wide: the server sets them once from its settings
(:func:`set_field_limits`); an SDK process checks the defaults before sending.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_JSON_BYTES = 64 * 1024
DEFAULT_MAX_JSON_DEPTH = 32
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class FieldLimits:
    """How large and how deep one free-form JSON document may be."""

    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH


class _InForce:
    limits = FieldLimits()


def field_limits() -> FieldLimits:
    """The limits in force in this process."""
    return _InForce.limits


def set_field_limits(limits: FieldLimits) -> None:
    """Change the limits for this process (the server does so from its settings)."""
    if limits.max_json_bytes < 2 or limits.max_json_depth < 1:
        raise ValueError(f"field limits must be positive, got {limits}")
    _InForce.limits = limits


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (NUL, lone surrogate), or None if it can."""
    if value.isascii() and "\x00" not in value:
        return None
    found = _BAD_CHAR.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "text must not contain NUL characters"
    return (
        f"text must not contain a lone UTF-16 surrogate (U+{ord(found.group()):04X} at "
        f"position {found.start()}); send valid Unicode"
    )


def _scalar_size(value: object, where: str) -> int:
    """Encoded size of a JSON scalar (close to ``json.dumps``), or ValueError."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise ValueError(f"{_short(where)}: {problem}")
        return len(value.encode("utf-8")) + 2
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{_short(where)}: JSON numbers must be finite (no NaN or Infinity)")
        return 24
    if isinstance(value, int):
        return value.bit_length() * 3 // 10 + 2  # about the decimal digits, without str()
    raise ValueError(f"{_short(where)}: {type(value).__name__} is not a JSON value")


def check_json_document(value: Any, *, what: str = "document") -> Any:
    """Return ``value`` if it is within the limits, else raise ValueError naming the spot.

    The message names the path inside the document (``plan.layers[3].name``); pydantic
    adds the field's own location (``body.plan``).
    """
    limits = _InForce.limits
    budget = limits.max_json_bytes
    used = 0
    # (value, depth, path): an explicit stack instead of recursion.
    stack: list[tuple[Any, int, str]] = [(value, 1, what)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list):
            if depth > limits.max_json_depth:
                raise ValueError(
                    f"{_short(where)}: nested more than {limits.max_json_depth} levels deep "
                    "(objects and arrays); flatten the document"
                )
            used += 2
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{_short(where)}: object keys must be strings")
                    used += _scalar_size(key, f"{where} key {key[:40]!r}") + 2
                    _check_budget(used, budget, what, where)
                    stack.append((child, depth + 1, f"{where}.{key[:40]}"))
            else:
                used += len(item)
                _check_budget(used, budget, what, where)
                stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
        else:
            used += _scalar_size(item, where)
            _check_budget(used, budget, what, where)
    return value


PLAN_NUMBER_LIMIT = 2**64
"""Largest magnitude of a number in a plan: counts, weights and uint64 seeds fit."""


def check_plan_numbers(value: Any, *, what: str = "plan") -> Any:
    """Return ``value`` unless a number in it lies beyond ±:data:`PLAN_NUMBER_LIMIT`.

    A plan holds counts, weights, repeats and seeds; a finite but absurd number (``1e308``)
    in one made whatever reads the plan overflow (the console's epoch size became
    infinite). Call after :func:`check_json_document` (which bounds the walk).
    """
    stack: list[tuple[Any, str]] = [(value, what)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, f"{where}.{str(key)[:40]}") for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
        elif (
            isinstance(item, int | float)
            and not isinstance(item, bool)
            and not -PLAN_NUMBER_LIMIT <= item <= PLAN_NUMBER_LIMIT
        ):
            shown = f"{item:.6g}" if isinstance(item, float) or item.bit_length() > 64 else item
            raise ValueError(
                f"{_short(where)}: {shown} is out of range; numbers in a plan must lie "
                "within ±2**64 (counts, weights, repeats and seeds do)"
            )
    return value


def _short(where: str) -> str:
    """A path inside a document, cut to a readable length."""
    return where if len(where) <= 120 else f"{where[:80]}...{where[-30:]}"


def _check_budget(used: int, budget: int, what: str, where: str) -> None:
    if used > budget:
        raise ValueError(
            f"{what}: larger than {budget} bytes of JSON (at {_short(where)}); keep large data in "
            "storage and put a reference here"
        )
