"""One upstream request and its reply passed back as it arrives: the relay's own HTTP/1.1
client and connections, the reply's head and body, the pump, the first-byte deadlines.

May import: ``edge`` (both faces), ``config``, ``wire``, ``core``; aiohttp's private modules.
"""

from gateway.relay.clients import Upstream
from gateway.relay.relay import Preempted, Relay, Target

__all__ = ["Preempted", "Relay", "Target", "Upstream"]
