"""The inference servers behind the gateway, and which one a request goes to."""

from gateway.backends.pool import Backend, BackendPool

__all__ = ["Backend", "BackendPool"]
