"""Cluster mode: the log replicated by an existing engine (NATS JetStream).

See `sepp/cluster/replog.py` for the interfaces every backend implements.
"""
