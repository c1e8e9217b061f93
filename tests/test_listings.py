"""Per-user views and aliases: each listing shows a user what they may use, under every name
they may use it by; a request for an alias runs its model, checked and routed as that model;
the openai SDK's models.retrieve answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import Gateway, StartGateway, StartSim, one_backend

MODEL, OTHER = "llama3.2:3b", "qwen2.5:7b"
SLASHED = "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"  # ids may hold slashes


def household(sim_url: str, aliases: str = "{family: llama3.2:3b, smart: qwen2.5:7b}") -> str:
    users = f"""\
aliases: {aliases}
users:
  alice: {{keys: [alice-key]}}
  kids: {{keys: [kids-key], models: [family]}}
  guest: {{keys: [guest-key], models: [{MODEL}]}}
"""
    return one_backend(sim_url, slots=2, extra=users)


async def read(gateway: Gateway, key: str, path: str, body: object = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.request("POST" if body else "GET", gateway.url + path, json=body) as reply,
    ):
        return reply.status, await reply.json(content_type=None)


async def listed(gateway: Gateway, key: str) -> dict[str, list[str]]:
    """The names in each listing the user sees."""
    _, tags = await read(gateway, key, "/api/tags")
    _, running = await read(gateway, key, "/api/ps")
    _, models = await read(gateway, key, "/v1/models")
    return {
        "tags": sorted(entry["name"] for entry in tags["models"]),
        "ps": sorted(entry["name"] for entry in running["models"]),
        "v1": sorted(entry["id"] for entry in models["data"]),
    }


async def chat(gateway: Gateway, key: str, model: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    return await read(gateway, key, "/api/chat", body)


class TestViews:
    async def test_each_user_sees_only_their_models_and_their_aliases(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """alice sees both models and both aliases; kids, allowed the family alias, see its
        model under both names and nothing of qwen; loaded models are listed by name only."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        for model in (MODEL, OTHER):  # both loaded, so that /api/ps lists both
            assert (await chat(gateway, "alice-key", model))[0] == 200
        everything = sorted([MODEL, OTHER, "family", "smart"])
        assert await listed(gateway, "alice-key") == {
            "tags": everything,
            "ps": [MODEL, OTHER],
            "v1": everything,
        }
        kids = sorted([MODEL, "family"])
        assert await listed(gateway, "kids-key") == {"tags": kids, "ps": [MODEL], "v1": kids}

    async def test_a_users_listing_and_the_admins_status_are_never_cached(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Each user's listings are their own and /status is the admin's: every reply says
        no-store, so no cache on the way hands kids' list to alice or /status to anyone."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        headers = {"Authorization": "Bearer kids-key"}
        async with aiohttp.ClientSession(headers=headers) as session:
            for path in ("/api/tags", "/api/ps", "/v1/models", "/v1/models/family", "/status"):
                async with session.get(gateway.url + path) as reply:
                    assert reply.headers.get("Cache-Control") == "no-store", path

    async def test_an_alias_entry_is_its_models_entry_under_the_alias(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Size, digest and details say what the alias runs; only the names differ."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        _, tags = await read(gateway, "alice-key", "/api/tags")
        by_name = {entry["name"]: entry for entry in tags["models"]}
        assert by_name["family"] == by_name[MODEL] | {"name": "family", "model": "family"}


class TestAliases:
    async def test_a_request_for_an_alias_runs_its_model_and_the_backend_is_sent_that_model(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The backend (which knows no 'family') answers as llama3.2:3b; the log says so."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        status, reply = await chat(gateway, "kids-key", "family")
        assert (status, reply["model"]) == (200, MODEL)

    @pytest.mark.parametrize(
        ("key", "model", "status"),
        [
            ("kids-key", "family", 200),  # their alias
            ("kids-key", MODEL, 200),  # the model their alias names, by its own name
            ("kids-key", "smart", 403),  # an alias of a model they may not use
            ("kids-key", OTHER, 403),
            ("guest-key", "family", 200),  # allowed the model: its alias too
            ("guest-key", "smart", 403),
        ],
    )
    async def test_the_allow_list_is_checked_on_the_model_an_alias_names(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        key: str,
        model: str,
        status: int,
    ) -> None:
        """models: and the request are compared as the models the backend would be sent."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        assert (await chat(gateway, key, model))[0] == status

    async def test_show_of_an_alias_shows_its_model(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/api/show of family is llama3.2:3b's (the backend is sent the model's name); of
        smart, for kids, 403."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        family = await read(gateway, "kids-key", "/api/show", {"model": "family"})
        model = await read(gateway, "kids-key", "/api/show", {"name": MODEL})
        smart = await read(gateway, "kids-key", "/api/show", {"model": "smart"})
        assert (family[0], model[0], smart[0]) == (200, 200, 403)
        assert family[1] == model[1]

    async def test_repointing_an_alias_in_the_file_changes_what_the_next_request_runs(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """The admin edits family to qwen2.5:7b; after the reload, family runs qwen (and
        kids, allowed family, may run it)."""
        _, sim_url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(household(sim_url))
        gateway = await start_gateway(path)
        assert (await chat(gateway, "kids-key", "family"))[1]["model"] == MODEL
        path.write_text(household(sim_url, aliases=f"{{family: {OTHER}}}"))
        assert gateway.services.policy.reload()
        assert (await chat(gateway, "kids-key", "family"))[1]["model"] == OTHER


class TestModelsRetrieve:
    async def test_the_openai_sdk_retrieves_a_model_an_alias_and_an_id_with_slashes(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """models.retrieve answers each id the caller's /v1/models lists."""
        _, sim_url = await start_sim(models=[MODEL, OTHER, SLASHED])
        gateway = await start_gateway(household(sim_url))
        base_url = gateway.url + "/v1"
        async with openai.AsyncOpenAI(
            base_url=base_url, api_key="alice-key", max_retries=0
        ) as client:
            retrieved = [(await client.models.retrieve(m)).id for m in (MODEL, "family", SLASHED)]
            with pytest.raises(openai.NotFoundError) as missing:
                await client.models.retrieve("nope")
        assert retrieved == [MODEL, "family", SLASHED]
        assert missing.value.code == "model_not_found"

    async def test_a_model_the_user_may_not_use_is_refused_as_in_a_request(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """kids retrieving qwen (or its alias) get 403 model_forbidden."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        async with openai.AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="kids-key", max_retries=0
        ) as client:
            for model in (OTHER, "smart"):
                with pytest.raises(openai.PermissionDeniedError) as refused:
                    await client.models.retrieve(model)
                assert refused.value.code == "model_forbidden"
            assert (await client.models.retrieve("family")).id == "family"


class TestAliasesInThePolicy:
    def test_an_alias_of_an_alias_is_refused_at_its_line(self) -> None:
        """One step only: family: smart, smart: qwen is an error naming family's line."""
        from gateway.config.policy import parse_policy
        from gateway.config.yaml_reader import PolicyError

        text = one_backend(
            "http://127.0.0.1:1", extra="aliases:\n  family: smart\n  smart: qwen2.5:7b\n"
        )
        with pytest.raises(PolicyError) as refused:
            parse_policy(text, source="house.yaml")
        assert str(refused.value) == (
            "house.yaml:4: aliases.family: names another alias, 'smart': name the model itself"
        )

    def test_an_alias_kept_warm_is_refused_with_its_model_named(self) -> None:
        """keep_warm pings go to the backend as written, so they must name the model."""
        from gateway.config.policy import parse_policy
        from gateway.config.yaml_reader import PolicyError

        text = (
            "aliases: {family: llama3.2:3b}\nbackends:\n"
            "  - {name: gpu, url: http://127.0.0.1:1, slots: 1, keep_warm: [family]}\n"
        )
        with pytest.raises(PolicyError) as refused:
            parse_policy(text, source="house.yaml")
        assert str(refused.value) == (
            "house.yaml:3: backends[0].keep_warm[0]: 'family' is an alias: name the model, "
            "'llama3.2:3b'"
        )

    def test_a_misspelt_aliases_section_gets_a_suggestion(self) -> None:
        """alias: is an unknown field; did you mean 'aliases'?"""
        from gateway.config.policy import parse_policy
        from gateway.config.yaml_reader import PolicyError

        with pytest.raises(PolicyError) as refused:
            parse_policy(one_backend("http://127.0.0.1:1", extra="alias: {a: b}\n"))
        assert "did you mean 'aliases'?" in str(refused.value)
