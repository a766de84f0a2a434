"""Fixtures shared by every part's tests.

Each fixture module under ``tests/fixtures`` starts one real component: moto's S3 server
on loopback (``s3``), a PostgreSQL test database (``postgres``), a live shardstream
server under uvicorn (``server``).
"""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
]
