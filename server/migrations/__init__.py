"""Alembic migrations of the server's database (packaged, so they run from a wheel)."""
