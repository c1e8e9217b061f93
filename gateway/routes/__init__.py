"""routes."""

from gateway.routes.generation import Generation
from gateway.routes.house import House
from gateway.routes.reads import Reads
from gateway.routes.status import Status

__all__ = ["Generation", "House", "Reads", "Status"]
