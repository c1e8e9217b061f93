"""``fairgate check-config``, a real process: it passes exactly when the service would start.

docs/install.md's systemd section has the admin run it with ``--env-file`` before starting the
unit, so it must read that file as systemd does, and check the settings as well as the policy.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.settings import settings_from

GPU = "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 2}\n"
ALICE = "users:\n  alice:\n    keys: ['env:ALICE_KEY']\n"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (no .env) holding a valid policy as ``fairgate.yaml``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fairgate.yaml").write_text(
        "users:\n  alice:\n    keys: [alice-key-of-her-own]\n" + GPU, encoding="utf-8"
    )
    return tmp_path


def check(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """``python -m gateway check-config fairgate.yaml ARGS`` with no FAIRGATE_* or
    ALICE_KEY variables but ``environment``."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("FAIRGATE_") and name != "ALICE_KEY"
    }
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "fairgate.yaml", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=inherited | environment,
    )


class TestEnvironmentFile:
    def test_a_key_is_checked_with_the_value_systemd_gives_not_dotenvs(self, workdir: Path) -> None:
        """``ALICE_KEY=s3cret # rotated`` is ``s3cret # rotated`` to systemd (dotenv cuts the
        comment off), which is bob's key: the check fails as the service's start would."""
        (workdir / "fairgate.yaml").write_text(
            ALICE + "  bob:\n    keys: ['s3cret # rotated']\n" + GPU, encoding="utf-8"
        )
        (workdir / "fairgate.env").write_text("ALICE_KEY=s3cret # rotated\n", encoding="utf-8")
        done = check("--env-file", "fairgate.env")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            "fairgate.yaml:5: users.bob.keys[0]: alice has this key too (first at line 3)\n"
        )

    def test_a_setting_with_an_inline_comment_fails_at_its_line(self, workdir: Path) -> None:
        """``FAIRGATE_LISTEN=0.0.0.0:8080 # the LAN`` is not an address to systemd: the check
        names the file, the line, the value systemd passes and what is wrong with it."""
        (workdir / "fairgate.env").write_text(
            "# the LAN\nFAIRGATE_LISTEN=0.0.0.0:8080 # the LAN\n", encoding="utf-8"
        )
        done = check("--env-file", "fairgate.env")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            "fairgate.env:2: FAIRGATE_LISTEN='0.0.0.0:8080 # the LAN': "
            "the port '8080 # the LAN' is not a number\n"
        )

    def test_lines_systemd_ignores_are_warned_about_by_number(self, workdir: Path) -> None:
        """``export ALICE_KEY=...`` is dropped by systemd: a warning at line 2, and the
        env: key that needs it fails the check."""
        (workdir / "fairgate.yaml").write_text(ALICE + GPU, encoding="utf-8")
        (workdir / "fairgate.env").write_text(
            "# keys\nexport ALICE_KEY=s3cret\nBOB_KEY\n", encoding="utf-8"
        )
        done = check("--env-file", "fairgate.env")
        assert done.returncode == 1
        assert done.stderr.splitlines()[:2] == [
            "warning: fairgate.env:2: 'export ALICE_KEY' is not a variable name: systemd "
            "ignores this line (write it without 'export')",
            "warning: fairgate.env:3: no '=' on this line: systemd ignores it",
        ]
        assert done.stderr.splitlines()[2:] == [
            "fairgate.yaml:3: users.alice.keys[0]: 'env:ALICE_KEY' needs ALICE_KEY, set "
            "neither in fairgate.env nor in the environment"
        ]

    def test_the_files_values_win_over_the_environments_as_over_environment_lines(
        self, workdir: Path
    ) -> None:
        """EnvironmentFile= overrides Environment= (systemd.exec(5)): a bad value in the
        environment is overridden by the file's, and a bad value in the file is not rescued."""
        (workdir / "fairgate.env").write_text("FAIRGATE_MAX_BODY_BYTES=1000\n", encoding="utf-8")
        fine = check("--env-file", "fairgate.env", FAIRGATE_MAX_BODY_BYTES="lots")
        assert (fine.returncode, fine.stderr) == (0, "")
        (workdir / "fairgate.env").write_text("FAIRGATE_MAX_BODY_BYTES=lots\n", encoding="utf-8")
        bad = check("--env-file", "fairgate.env", FAIRGATE_MAX_BODY_BYTES="1000")
        assert bad.returncode == 1
        assert bad.stderr.startswith("fairgate.env:1: FAIRGATE_MAX_BODY_BYTES='lots': ")

    def test_the_working_directorys_dot_env_is_not_what_systemd_reads(self, workdir: Path) -> None:
        """The unit runs in /, so a key found only in ./.env is missing under systemd."""
        (workdir / "fairgate.yaml").write_text(ALICE + GPU, encoding="utf-8")
        (workdir / ".env").write_text("ALICE_KEY=s3cret\n", encoding="utf-8")
        (workdir / "fairgate.env").write_text("# nothing yet\n", encoding="utf-8")
        assert check().returncode == 0
        done = check("--env-file", "fairgate.env")
        assert done.returncode == 1
        assert "needs ALICE_KEY, set neither in fairgate.env nor in the environment" in done.stderr

    def test_a_policy_file_the_service_would_not_read_is_warned_about(self, workdir: Path) -> None:
        """FAIRGATE_CONFIG in the env file sends the service elsewhere: checking
        fairgate.yaml then proves nothing, and the check says so (still passing)."""
        (workdir / "fairgate.env").write_text(
            "FAIRGATE_CONFIG=/etc/fairgate/other.yaml\n", encoding="utf-8"
        )
        done = check("--env-file", "fairgate.env")
        assert (done.returncode, done.stderr) == (
            0,
            "warning: the service would read FAIRGATE_CONFIG=/etc/fairgate/other.yaml, "
            "not fairgate.yaml\n",
        )
        here = workdir / "fairgate.yaml"
        (workdir / "fairgate.env").write_text(f"FAIRGATE_CONFIG={here}\n", encoding="utf-8")
        assert check("--env-file", "fairgate.env").stderr == ""

    def test_a_file_systemd_would_not_read_at_all_fails_the_check(self, workdir: Path) -> None:
        """Latin-1 in a value makes systemd skip the whole file: an error, not a warning."""
        (workdir / "fairgate.env").write_bytes(b"FAIRGATE_LOG_LEVEL=info\nALICE_KEY=caf\xe9\n")
        done = check("--env-file", "fairgate.env")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            "fairgate.env: line 2: not UTF-8, so systemd reads none of the file: save it as UTF-8\n"
        )


class TestSettings:
    def test_an_invalid_setting_in_the_environment_fails_the_check(self, workdir: Path) -> None:
        """FAIRGATE_MAX_BODY_BYTES=lots would stop the service at start: the check says so."""
        done = check(FAIRGATE_MAX_BODY_BYTES="lots", FAIRGATE_LISTEN="nonsense")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.splitlines() == [
            "fairgate: FAIRGATE_LISTEN='nonsense': expected HOST:PORT, e.g. 127.0.0.1:8080, "
            "or a bare PORT",
            "fairgate: FAIRGATE_MAX_BODY_BYTES='lots': input should be a valid integer, "
            "unable to parse string as an integer",
        ]

    def test_an_invalid_setting_in_dot_env_fails_the_check(self, workdir: Path) -> None:
        """``fairgate serve`` here would read ./.env, so the check reads it too."""
        (workdir / ".env").write_text("FAIRGATE_LOG_FORMAT=yaml\n", encoding="utf-8")
        done = check()
        assert done.returncode == 1
        assert done.stderr == (
            "fairgate: FAIRGATE_LOG_FORMAT='yaml': must be 'auto', 'json' or 'console'\n"
        )

    def test_settings_and_policy_problems_are_reported_together(self, workdir: Path) -> None:
        """One run names every problem: the setting, then the policy's line."""
        digest = hashlib.sha256(b"x").hexdigest()
        (workdir / "fairgate.yaml").write_text(
            f"users:\n  alice:\n    keys: ['SHA256:{digest}']\n" + GPU, encoding="utf-8"
        )
        done = check(FAIRGATE_DRAIN_TIMEOUT="-1")
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            "fairgate: FAIRGATE_DRAIN_TIMEOUT='-1': input should be greater than or equal to 0",
            "fairgate.yaml:3: users.alice.keys[0]: write the sha256: prefix in lower case",
        ]

    def test_settings_from_variables_ignore_the_process_environment(
        self, workdir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The variables given are the whole environment: neither os.environ nor ./.env
        adds to them, in any letter case."""
        monkeypatch.setenv("FAIRGATE_LISTEN", "nonsense")
        (workdir / ".env").write_text("FAIRGATE_LOG_LEVEL=nonsense\n", encoding="utf-8")
        settings = settings_from({"fairgate_max_body_bytes": "1000"})
        assert (settings.listen, settings.log_level, settings.max_body_bytes) == (
            "127.0.0.1:8080",
            "INFO",
            1000,
        )


class TestUsageFile:
    """What serve would refuse to start with (``cannot keep usage``), check-config says."""

    def test_a_usage_file_in_no_directory_fails_the_check(self, workdir: Path) -> None:
        missing = workdir / "gone" / "usage.db"
        done = check(FAIRGATE_USAGE_DB=str(missing))
        assert done.returncode == 1
        assert f"FAIRGATE_USAGE_DB: {missing}: its directory {missing.parent} does not exist" in (
            done.stderr
        )
        assert not missing.parent.exists()  # the check writes nothing

    def test_a_file_that_is_no_database_fails_at_its_env_file_line(self, workdir: Path) -> None:
        (workdir / "notes.txt").write_text("not a database, but long enough to be read\n" * 40)
        (workdir / "fairgate.env").write_text("FAIRGATE_USAGE_DB=notes.txt\n", encoding="utf-8")
        done = check("--env-file", "fairgate.env")
        assert done.returncode == 1
        assert "fairgate.env:1: FAIRGATE_USAGE_DB: notes.txt: file is not a database" in (
            done.stderr
        )

    def test_a_usage_file_not_made_yet_in_a_writable_directory_passes(self, workdir: Path) -> None:
        done = check(FAIRGATE_USAGE_DB=str(workdir / "usage.db"))
        assert (done.returncode, done.stderr) == (0, "")
        assert not (workdir / "usage.db").exists()


def test_a_key_of_the_shipped_examples_is_warned_of(workdir: Path) -> None:
    """The example's keys (`change-me-alice`) pass, as serve serves them, but the check says
    which users hold one anyone may know, as serve's log does: the admin who checks before
    starting the service reads it there."""
    (workdir / "fairgate.yaml").write_text(
        "users:\n  alice:\n    keys: [change-me-alice]\n" + GPU, encoding="utf-8"
    )
    done = check()
    assert done.returncode == 0
    assert done.stdout == "fairgate.yaml: ok (1 backend(s), but 1 key(s) anyone may know)\n"
    assert "users.alice: the key 'change-me-alice' is one of Fairgate's shipped" in done.stderr


def test_a_short_plain_key_is_warned_of_and_a_long_or_hashed_one_is_not(workdir: Path) -> None:
    """A key such as ``1234`` passes (serve serves it), but the check says it can be found by
    trying keys in turn; a key of 12 characters or more, and a ``sha256:`` digest whose key's
    length is unknown, are not warned of."""
    digest = hashlib.sha256(b"7").hexdigest()
    (workdir / "fairgate.yaml").write_text(
        "users:\n  alice:\n    keys: ['1234']\n  bob:\n    keys: [bobs-own-key]\n"
        f"  carol:\n    keys: ['sha256:{digest}']\n" + GPU,
        encoding="utf-8",
    )
    done = check()
    assert done.returncode == 0
    assert done.stdout == "fairgate.yaml: ok (1 backend(s), but 1 short key(s))\n"
    assert done.stderr == (
        "warning: users.alice: a key of 4 characters can be found by trying keys in turn: "
        "replace it (fairgate keys new alice)\n"
    )


def test_a_dot_env_line_no_reader_can_read_is_named_once_at_its_line(workdir: Path) -> None:
    """python-dotenv skips a line it cannot read with a warning that names neither the file
    nor the fault, once for each reader: the setting on it is lost without a word. The check
    names the line, once."""
    (workdir / ".env").write_text(
        '# settings\nFAIRGATE_LOG_LEVEL = "debug\nFAIRGATE_LISTEN=127.0.0.1:8099\n',
        encoding="utf-8",
    )
    done = check()
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(".env:2: not NAME=value, nor a comment: the line is ignored") == 1
    assert "python-dotenv" not in done.stderr


def test_a_wait_likely_meant_in_milliseconds_is_warned_of(workdir: Path) -> None:
    """`max_wait: 30000` is 8 h 20 min, and a probe every 5000 s is one an hour and a half:
    valid, so ok, but each is said with what was likely meant."""
    (workdir / "fairgate.yaml").write_text(
        "queue: {max_wait: 30000}\nmonitoring: {interval: 5000}\n" + GPU, encoding="utf-8"
    )
    done = check()
    assert done.returncode == 0, done.stderr
    assert "queue.max_wait is 8h20m: a number without a unit is seconds; if 30000 was " in (
        done.stderr
    )
    assert "monitoring.interval is 1h23m" in done.stderr and "write 5s" in done.stderr
    # Written with its unit, a long wait is what was meant: nothing said.
    (workdir / "fairgate.yaml").write_text(
        "lanes: {background: {max_wait: 2h}}\n" + GPU, encoding="utf-8"
    )
    done = check()
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
