"""The shape of the gateway: the import contracts hold and catch a wrong import, only the edge's
server side and the relay touch aiohttp's private modules, no module grows past its bound, and
docs/architecture.md names the tree as it is."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GATEWAY = REPO / "gateway"
PAGE = REPO / "docs" / "architecture.md"
PACKAGES = ("gateway", "fairsim", "fairplan")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_LINES = 350
# aiohttp's public faces; every other submodule is its own business, free to change.
AIOHTTP_PUBLIC = {"aiohttp", "aiohttp.web", "aiohttp.abc", "aiohttp.typedefs", "aiohttp.hdrs"}
MAY_TOUCH_AIOHTTP_INTERNALS = ("gateway/edge/http/", "gateway/relay/")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's verdict on the packages under ``root``, with this project's contracts."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def python_files(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (REPO / package).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


class TestContracts:
    def test_the_import_contracts_hold_on_the_tree(self) -> None:
        """The layers, the forbidden imports and the acyclic files all hold today."""
        result = lint_imports(REPO)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 broken" in result.stdout

    @pytest.mark.parametrize(
        ("file", "line", "broken"),
        [
            # An upward import: the core reaching for the composition root.
            ("gateway/core/units.py", "import gateway.services", "gateway.core is not allowed"),
            # The web framework in a package that decides without it.
            ("gateway/swaps/victims.py", "import aiohttp", "gateway.swaps is not allowed"),
            # A cycle between two files of one package, even under TYPE_CHECKING.
            (
                "gateway/admission/room_state.py",
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from gateway.admission.room import WaitingRoom",
                "No cycles are allowed in gateway.admission",
            ),
            # The simulator leaning on the app rather than the shared core.
            ("fairsim/engine.py", "import gateway.admission", "fairsim is not allowed"),
        ],
    )
    def test_a_wrong_import_breaks_a_contract(
        self, tmp_path: Path, file: str, line: str, broken: str
    ) -> None:
        """A copy of the tree with one wrong import added fails the check, naming it."""
        for package in PACKAGES:
            shutil.copytree(REPO / package, tmp_path / package, ignore=_no_caches)
        shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
        target = tmp_path / file
        target.write_text(target.read_text() + "\n" + line + "\n")
        result = lint_imports(tmp_path)
        assert result.returncode == 1, result.stdout
        assert broken in result.stdout


def _no_caches(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if name == "__pycache__"]


def private_aiohttp_imports(source: str) -> list[str]:
    """The aiohttp submodules beyond its public faces that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [n for n in names if n.startswith("aiohttp.") and n not in AIOHTTP_PUBLIC]
    return found


class TestAiohttpInternals:
    def test_the_check_sees_a_private_module(self) -> None:
        """The scan below finds a private module however it is imported (its negative control)."""
        source = "import aiohttp.web_protocol\nfrom aiohttp.http_writer import StreamWriter\n"
        assert private_aiohttp_imports(source) == ["aiohttp.web_protocol", "aiohttp.http_writer"]
        assert private_aiohttp_imports("from aiohttp import web, hdrs\n") == []

    def test_only_the_edge_server_and_the_relay_import_aiohttp_internals(self) -> None:
        """aiohttp's private modules change in minor releases: two packages may know them."""
        touching = {
            relative(path): private_aiohttp_imports(path.read_text())
            for path in python_files(*PACKAGES)
        }
        outside = {
            name: modules
            for name, modules in touching.items()
            if modules and not name.startswith(MAY_TOUCH_AIOHTTP_INTERNALS)
        }
        assert outside == {}

    def test_the_aiohttp_pin_names_each_internal_module_used(self) -> None:
        """Whoever raises the pin reads, beside it, which internals to test first."""
        used = {
            module
            for path in python_files("gateway")
            for module in private_aiohttp_imports(path.read_text())
        }
        pin = re.search(r"dependencies = \[(.*?)\n\]", (REPO / "pyproject.toml").read_text(), re.S)
        assert pin is not None
        aiohttp_lines = pin.group(1).split('"aiohttp')[0]
        unnamed = {m for m in used if m.removeprefix("aiohttp.") not in aiohttp_lines}
        assert unnamed == set()


class TestSizes:
    def test_no_module_is_over_its_bound(self) -> None:
        """Every module of the gateway, the simulator and the planner stays readable."""
        lines = {relative(p): len(p.read_text().splitlines()) for p in python_files(*PACKAGES)}
        assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}


def documented_packages() -> dict[str, set[str]]:
    """Each package the page describes ("### `admission/`"), with the files it lists."""
    listed: dict[str, set[str]] = {}
    heading = None
    for line in PAGE.read_text().splitlines():
        if match := re.fullmatch(r"### `([\w/]+)/`(?: \(top level\))?", line):
            heading = match.group(1)
            heading = "" if heading == "gateway" else heading
        elif line.startswith("Files: ") and heading is not None:
            listed[heading] = set(re.findall(r"`(\w+)`", line))
            heading = None
    return listed


def packages_on_disk() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for init in GATEWAY.rglob("__init__.py"):
        folder = init.parent
        name = folder.relative_to(GATEWAY).as_posix()
        modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        found["" if name == "." else name] = modules
    return found


def documented_layers() -> list[str]:
    block = re.search(r"## The layers, top to bottom\n.*?```\n(.*?)```", PAGE.read_text(), re.S)
    assert block is not None
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


class TestThePage:
    def test_it_lists_every_package_and_file(self) -> None:
        """A file added, moved or renamed without docs/architecture.md fails here."""
        assert documented_packages() == packages_on_disk()

    def test_its_layers_are_the_contract(self) -> None:
        """The page's layers are the order import-linter enforces."""
        config = tomllib.loads((REPO / "pyproject.toml").read_text())
        contracts = config["tool"]["importlinter"]["contracts"]
        layers = next(c for c in contracts if c["type"] == "layers")
        assert layers["containers"] == ["gateway"]
        assert documented_layers() == layers["layers"]

    def test_gateway_shows_only_its_layers_and_entry_points(self) -> None:
        """`ls gateway/` is the page's list: the packages, the composition root, the entry
        points, and nothing else."""
        entries = {p.name for p in GATEWAY.iterdir() if p.name != "__pycache__"}
        top = documented_packages()[""]
        expected = {f"{m}.py" for m in top} | {"__init__.py"}
        expected |= {name for name in documented_packages() if name and "/" not in name}
        assert entries == expected

    def test_each_package_says_what_it_holds_and_may_import(self) -> None:
        """Each package's face opens with a docstring naming what it may import."""
        for init in GATEWAY.rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc is not None and "May import" in doc, relative(init)
