"""A simulated Ollama server (and a llama.cpp ``llama-server`` flavour) for tests, demos
and benchmarks.

It speaks the real wire formats: Ollama's native ``/api/*`` NDJSON and its OpenAI-compatible
``/v1/*`` SSE (shapes from ollama/ollama's server/routes.go, api/types.go,
middleware/openai.go and openai/openai.go), or llama-server's ``/health``, ``/props``,
``/slots``, ``/metrics``, ``/v1/chat/completions`` and ``/completion`` (shapes from real
captures). Replies are deterministic words; timing follows SimConfig: ``parallel`` slots
with a FIFO queue behind them (llama-server's, or each loaded Ollama model's), prefill at
``prefill_tokens_per_s`` and decode at ``decode_tokens_per_s`` slowed by each extra stream.
The Ollama flavour loads, keeps and evicts models as Ollama's scheduler does (see
``ollama_sched``): several models within ``memory`` and ``max_loaded_models``, a reload when
a request's ``num_ctx`` differs, and the queue held meanwhile.
``GET /sim/stats`` returns the counters as JSON for benchmarks in another process.

Fault knobs, read from the request body (inside ``options`` for native Ollama requests,
top-level for ``/v1/*`` requests and for llama-server's endpoints; the other place is read
as a fallback):

``sim_first_byte_delay``
    seconds to wait after taking a slot, before prefill and the first chunk.
``sim_stall_after``
    emit this many tokens, then stall until the client goes away (the slot stays taken).
    With 0 not even the headers are sent, as Ollama sends them with the first chunk.
``sim_die_after``
    emit this many tokens, then close the connection without a final chunk, as a crashed
    backend would (counted in ``SimStats.aborted``). A stream always gets its 200 and
    headers first, even for 0; a non-streamed request just loses its connection.
``sim_status``
    answer this HTTP status at once with ``{"error": "simulated failure"}`` in the flavour's
    error shape, without loading a model or taking a slot.

``SimConfig(record_replies=True)`` keeps every request's headers and every reply's exact
body bytes and Content-Type (``Simulator.request_headers``, ``replies``, ``reply_types``) for
byte-for-byte relay tests.

Serve the app with ``web.AppRunner(app, handler_cancellation=True)`` (``run_sim`` does):
a client that disconnects while queued or running then frees its slot at once.
"""

from .cli import add_sim_arguments, sim_config_from_args
from .config import SimConfig, SimStats
from .simulator import Simulator, run_sim

__all__ = [
    "SimConfig",
    "SimStats",
    "Simulator",
    "add_sim_arguments",
    "run_sim",
    "sim_config_from_args",
]
