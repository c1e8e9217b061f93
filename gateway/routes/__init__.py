"""The HTTP handlers: a generation request top to bottom, the reads that never queue, token
counting, ``/status``, and the house page (its files in ``routes/ui``).

May import: ``services`` and every package below it.
"""

from gateway.routes.generation import Generation
from gateway.routes.house import House
from gateway.routes.reads import Reads
from gateway.routes.status import Status

__all__ = ["Generation", "House", "Reads", "Status"]
