"""What a request asks for, read from its body before it runs: the body as every backend will
read it, its class (the prompt it carries), its lane, and the load options the admin's
rules allow; and what is answered about its model.

May import: ``admission``, ``swaps``, ``backends``, ``relay``, ``edge``, ``config``,
``wire``, ``core``.
"""

from gateway.intake.bodies import Fields, parsed
from gateway.intake.classify import Estimate, classify
from gateway.intake.lanes import lane_of, possible_lanes
from gateway.intake.load_options import apply_load_policy
from gateway.intake.model_errors import checked_name, model_forbidden, model_not_found, no_backend
from gateway.intake.prefixes import prefix_of

__all__ = [
    "Estimate",
    "Fields",
    "apply_load_policy",
    "checked_name",
    "classify",
    "lane_of",
    "model_forbidden",
    "model_not_found",
    "no_backend",
    "parsed",
    "possible_lanes",
    "prefix_of",
]
