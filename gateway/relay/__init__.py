"""relay."""

from gateway.relay.clients import Upstream
from gateway.relay.relay import Relay, Target

__all__ = ["Relay", "Target", "Upstream"]
