"""intake."""

from gateway.intake.bodies import Fields, defer_continue, parsed, read_body
from gateway.intake.classify import classify
from gateway.intake.lanes import lane_of, possible_lanes
from gateway.intake.load_options import apply_load_policy
from gateway.intake.model_errors import checked_name, model_forbidden, model_not_found, no_backend

__all__ = [
    "Fields",
    "apply_load_policy",
    "checked_name",
    "classify",
    "defer_continue",
    "lane_of",
    "model_forbidden",
    "model_not_found",
    "no_backend",
    "parsed",
    "possible_lanes",
    "read_body",
]
