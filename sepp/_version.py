"""The version of sepp (server, protocol implementation and client)."""

__version__ = "0.1.0"
