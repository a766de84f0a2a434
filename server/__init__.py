"""shardstream.server"""
