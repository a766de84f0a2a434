"""Print the server image's requirements from pyproject.toml (one source of truth).

The server needs the base dependencies minus torch (only training nodes read shards
into tensors) plus the ``server`` extra. Used by deploy/Dockerfile.
"""

import sys

import tomllib

path = sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"
with open(path, "rb") as fh:
    project = tomllib.load(fh)["project"]
base = [dep for dep in project["dependencies"] if not dep.startswith("torch")]
print("\n".join(base + project["optional-dependencies"]["server"]))
