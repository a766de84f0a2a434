"""shardstream.shard_builder"""
