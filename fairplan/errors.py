"""The one error ``fairgate plan`` reports instead of a plan.

Both the HTTP readers and the command line raise it, so it lives apart from either: the command
line catches it (with the network errors) and prints it as a one-line message, exit status 1.
"""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(Exception):
    """The plan cannot be made: a number is missing, or a server did not answer as expected."""
