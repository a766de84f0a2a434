"""Fixtures shared by every part's tests.

Each fixture module under ``tests/fixtures`` starts one real component: moto's S3 server
on loopback (``s3``), a PostgreSQL test database (``postgres``), a live shardstream
server under uvicorn (``server``), a two-node Ray cluster on loopback (``ray_cluster``).
"""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
    "tests.fixtures.ray_cluster",
]
