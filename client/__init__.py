"""shardstream.client"""
