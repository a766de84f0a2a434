"""Responses that belong to no one entity: list pages, errors, health."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_cursor`` back as ``cursor`` for the next page."""

    items: list[T]
    next_cursor: str | None = None


class ErrorResponse(BaseModel):
    """Every error response: one message, plus the failing fields for a 422."""

    detail: str
    errors: list[dict[str, Any]] | None = None


class Health(BaseModel):
    """Liveness / readiness answer."""

    status: Literal["ok", "unavailable"]
    detail: str = ""
