"""``slots: 2`` in front of an Ollama that runs 1 request at a time (OLLAMA_NUM_PARALLEL
unset), against ``slots: 1``, both through the gateway, side by side in one process.

With the wrong number the gateway sends a second request that waits inside Ollama's own
queue, where no fair scheduler sees it: a quick question behind a long summary. The gateway
finds it from what it sees (``admission/parallelism.py``: a request sent beside another whose
first byte came only once that other was done), says so, and sends one at a time from
then on. Prints when it was found, and the light chats' TTFT both ways.

    .venv/bin/python -m benchmarks.parallelism
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from benchmarks.household import p95
from benchmarks.models import LLAMA, SIM, Run, Scenario, User, run
from gateway.core.logs import configure_logging

__all__ = ["SCENARIO", "main"]

SCENARIO = Scenario(
    "one model, an Ollama that runs 1 at a time: three people chatting, one summarising",
    replace(SIM, models=[LLAMA], parallel=1),
    (
        User("ann", LLAMA, 12),
        User("bea", LLAMA, 12),
        User("cal", LLAMA, 12),
        User("sum", LLAMA, 6, output=120, think=(0.2, 0.5), family=False),
    ),
    "",
)


def _line(name: str, result: Run) -> str:
    light = result.light_ttft()
    found = result.runs_fewer_after
    said = "not found" if found is None else f"found after {found:.1f} s"
    return (
        f"  {name:10} light TTFT p95 {p95(light) * 1000:6.0f} ms ({len(light)} replies); "
        f"runs-fewer {said}"
    )


async def compare() -> str:
    wrong = await run(replace(SCENARIO, slots=2), through_gateway=True)
    right = await run(replace(SCENARIO, slots=1), through_gateway=True)
    ratio = p95(wrong.light_ttft()) / p95(right.light_ttft())
    return "\n".join(
        [
            SCENARIO.name,
            _line("slots: 2", wrong),
            _line("slots: 1", right),
            f"  => light p95 with the wrong slots {ratio:.2f}x the right one's",
        ]
    )


def main() -> None:
    configure_logging("json", "ERROR")
    print(__doc__.split("\n\n")[0])
    print(asyncio.run(compare()))


if __name__ == "__main__":
    main()
