"""``shardstream demo``: the whole system on one machine, in about a minute.

The demo starts the metadata server on SQLite, builds and publishes a tokenized dataset
from the public-domain text in ``data/``, trains a tiny model with two loader workers while
committing checkpoints, kills the training process with SIGKILL, resumes from the server's
state and shows that the sample sequence continued exactly as an uninterrupted run.
"""
