"""Draw docs/house.png: the house page during a busy evening, from a simulated household.

Run from the repository root with ``.venv/bin/python docs/house_screenshot.py`` (needs
Debian's chromium). A simulated Ollama with two slots runs bob's chat and the agent's long
summary; carol and alice wait; a few quick replies and refusals fill the last hour.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
from playwright.async_api import async_playwright

from fairsim import SimConfig, Simulator
from gateway.app import bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import IN_MEMORY, Settings
from gateway.core.logs import configure_logging

OUT = Path(__file__).resolve().parent / "house.png"
MODEL = "llama3.2:3b"
POLICY = """\
classes: {{heavy: {{min_prompt_tokens: 2000}}}}
users:
  alice: {{keys: [alice-key], admin: true}}
  bob: {{keys: [bob-key]}}
  carol: {{keys: [carol-key]}}
  agent: {{keys: [agent-key], max_queued: 0, weight: 0.5}}
backends:
  - {{name: gpu, url: {url}, kind: ollama, slots: 2}}
"""


async def ask(url: str, key: str, prompt: str, stall: bool = False) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    if stall:
        body["options"] = {"sim_stall_after": 3}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/api/chat", json=body, headers=headers) as reply,
    ):
        async for _ in reply.content:
            pass


async def main() -> None:
    configure_logging("console", "WARNING")
    sim = Simulator(SimConfig(parallel=2, decode_tokens_per_s=40.0, default_output_tokens=8))
    backend = await start_server(sim.make_app(), "127.0.0.1", 0)
    app = create_app(
        Settings(log_level="WARNING", usage_db=IN_MEMORY),
        parse_policy(POLICY.format(url=bound_url(backend))),
    )
    gateway = await start_server(app, "127.0.0.1", 0)
    url = bound_url(gateway)
    for n in range(6):  # the last hour: a few quick replies
        await ask(url, ("bob-key", "carol-key", "alice-key")[n % 3], "what time is it?")
    held = [
        asyncio.create_task(ask(url, "bob-key", "help me with this email", stall=True)),
        asyncio.create_task(ask(url, "agent-key", "summarise: " + "minutes " * 3000, True)),
    ]
    await asyncio.sleep(1.0)
    held += [
        asyncio.create_task(ask(url, "carol-key", "a recipe for tonight", stall=True)),
        asyncio.create_task(ask(url, "alice-key", "translate this", stall=True)),
    ]
    await asyncio.sleep(0.5)
    await ask(url, "agent-key", "summarise the next file")  # refused: its queue bound is 0
    await asyncio.sleep(2.5)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium)
        page = await browser.new_page(viewport={"width": 1000, "height": 800})
        await page.goto(url + "/ui")
        await page.wait_for_selector(".slot.busy")
        await page.wait_for_timeout(1200)
        await page.screenshot(path=OUT, full_page=True)
        await browser.close()
    for task in held:
        task.cancel()
    await gateway.cleanup()
    await backend.cleanup()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
