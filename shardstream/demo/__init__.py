"""``shardstream demo``: the whole system on one machine, in about a minute.

The demo starts the metadata server on SQLite, builds and publishes a tokenized dataset
from the public-domain text in ``data/``, trains a tiny model with two loader workers while
committing checkpoints, kills the training process with SIGKILL, resumes from the server's
state and shows that the sample sequence continued exactly as an uninterrupted run. Then it
shows the same on a different number of nodes: a job of 2 ranks is killed mid-epoch and
resumes on 4 ranks, and together they read every sample of the epoch exactly once, in the
uninterrupted order.
"""
