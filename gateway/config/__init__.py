"""How the gateway is configured: the environment (``settings``) and the admin's policy file,
one schema module per section, read without surprises and explained as
``file:line: field: sentence``. Schemas only: what acts on a section lives where it acts.

May import: ``wire``, ``core`` (never aiohttp).
"""

from gateway.config.backends import MANY_MODEL_KINDS, BackendConfig, BackendKind
from gateway.config.base import model_key
from gateway.config.budgets import Budget
from gateway.config.cors import CorsPolicy
from gateway.config.environment_file import EnvironmentFileError, read_environment_file
from gateway.config.lanes import AWAITED_TASKS, PRESET_CHATS, PRESETS, Lanes
from gateway.config.models import MIN_NUM_CTX, NumCtxPolicy
from gateway.config.network import ANY_HOST, ForwardedHeader, is_host_name
from gateway.config.policy import Policy, load_policy
from gateway.config.problems import dotenv_problems, environment
from gateway.config.settings import (
    IN_MEMORY,
    Settings,
    describe_settings,
    parse_listen,
    settings_errors,
    settings_from,
    unknown_variables,
    variable,
)
from gateway.config.tuning import KeepAlivePolicy, Monitoring, Timeouts, Warmth
from gateway.config.users import (
    ANONYMOUS,
    BACKGROUND_ACCOUNT,
    PERSON_SEPARATOR,
    TOGETHER_ACCOUNT,
    UNKNOWN,
    KeyVariables,
    Limits,
    Together,
    background_account,
    hashed_key,
    is_background_account,
    is_together_account,
    key_of,
    together_account,
)
from gateway.config.yaml_reader import PolicyError

__all__ = [
    "ANONYMOUS",
    "ANY_HOST",
    "AWAITED_TASKS",
    "BACKGROUND_ACCOUNT",
    "IN_MEMORY",
    "MANY_MODEL_KINDS",
    "MIN_NUM_CTX",
    "PERSON_SEPARATOR",
    "PRESETS",
    "PRESET_CHATS",
    "TOGETHER_ACCOUNT",
    "UNKNOWN",
    "BackendConfig",
    "BackendKind",
    "Budget",
    "CorsPolicy",
    "EnvironmentFileError",
    "ForwardedHeader",
    "KeepAlivePolicy",
    "KeyVariables",
    "Lanes",
    "Limits",
    "Monitoring",
    "NumCtxPolicy",
    "Policy",
    "PolicyError",
    "Settings",
    "Timeouts",
    "Together",
    "Warmth",
    "background_account",
    "describe_settings",
    "dotenv_problems",
    "environment",
    "hashed_key",
    "is_background_account",
    "is_host_name",
    "is_together_account",
    "key_of",
    "load_policy",
    "model_key",
    "parse_listen",
    "read_environment_file",
    "settings_errors",
    "settings_from",
    "together_account",
    "unknown_variables",
    "variable",
]
