"""``shardstream.integrations``: the trainers' glue under a short name.

Its home is :mod:`shardstream.client.integrations` (the client runs on training nodes); each
module here re-exports one of its modules, so a class has one identity whichever name
imported it.
"""
