"""What the backends' wire formats demand of a body: JSON decoded as Go's ``encoding/json``
decodes it, bodies whose meaning depends on the reader refused, Ollama's field types (and
which engine a release runs), the tools a server would run itself, a chat's list of
messages, the token tallies at the end of a reply, and whether a stream reached its end.

May import: ``core`` (never aiohttp).
"""

from gateway.wire.ambiguity import (
    AmbiguousField,
    NotAnObject,
    canonical_keys,
    go_fold,
    load_checked,
)
from gateway.wire.engine_slot import SLOT_PATHS, with_slot
from gateway.wire.json_counts import TooManyValues
from gateway.wire.json_decode import NestedTooDeeply, Pairs, TooManyObjects, parse_object_pairs
from gateway.wire.message_lists import message_list_error
from gateway.wire.ollama_fields import (
    STRUCT_OF_PATH,
    STRUCTS,
    field_type_error,
    go_int64,
    go_type_name,
    option_type_error,
)
from gateway.wire.ollama_releases import runs_own_runner
from gateway.wire.server_tools import openai_refusal, server_tools
from gateway.wire.stream_ends import STREAM_END_BYTES, stream_end
from gateway.wire.tallies import TALLY_WINDOW, FinalCounts, TokenEvents, final_counts, token_events

__all__ = [
    "SLOT_PATHS",
    "STREAM_END_BYTES",
    "STRUCTS",
    "STRUCT_OF_PATH",
    "TALLY_WINDOW",
    "AmbiguousField",
    "FinalCounts",
    "NestedTooDeeply",
    "NotAnObject",
    "Pairs",
    "TokenEvents",
    "TooManyObjects",
    "TooManyValues",
    "canonical_keys",
    "field_type_error",
    "final_counts",
    "go_fold",
    "go_int64",
    "go_type_name",
    "load_checked",
    "message_list_error",
    "openai_refusal",
    "option_type_error",
    "parse_object_pairs",
    "runs_own_runner",
    "server_tools",
    "stream_end",
    "token_events",
    "with_slot",
]
