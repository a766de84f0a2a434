"""Migration scripts, applied in order by ``shardstream server migrate``."""
