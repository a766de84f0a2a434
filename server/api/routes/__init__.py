"""One router per resource, all mounted under ``/v1`` (health and metrics at the root)."""
