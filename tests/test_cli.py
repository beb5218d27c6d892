"""The gql-service-auth command, run through main(argv) against the emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gql_service_auth.cli import main
from gql_service_auth.emulator import Emulator


def _run(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str]
) -> tuple[int, str, str]:
    code = main(argv, environ=environ)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_with_the_api_key(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    """check --method api-key reports the working method, latency and carriers."""
    code, out, _ = _run(capsys, ["check", "--method", "api-key"], emulator.environ())
    assert code == 0
    assert "method that works: api-key" in out
    assert "carrier-001" in out
    assert " ms " in out
    assert emulator.recent_client.client_secret not in out
    assert emulator.counters.token_requests == 0


def test_auto_falls_back_to_oauth2_and_explains(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """auto tries the API key, is refused, says why, and succeeds with OAuth2."""
    environ = emulator.environ(emulator.legacy_client)
    code, out, _ = _run(capsys, ["check"], environ)
    assert code == 0
    assert "2024-05-13" in out
    assert "New credentials" in out
    assert "method that works: oauth2" in out
    assert "expires in 3600 s" in out
    assert emulator.legacy_client.client_secret not in out
    assert "emu-token-" not in out


def test_api_key_only_fails_for_legacy_credentials(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """--method api-key does not fall back: exit code 1."""
    code, out, _ = _run(
        capsys, ["check", "--method", "api-key"], emulator.environ(emulator.legacy_client)
    )
    assert code == 1
    assert "FAILED" in out


def test_json_output(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with the method, steps and carriers, and no token."""
    code, out, _ = _run(
        capsys, ["check", "--json", "--method", "oauth2", "--first", "2"], emulator.environ()
    )
    document = json.loads(out)
    assert code == 0
    assert document["ok"] is True
    assert document["method"] == "oauth2"
    assert [step["name"] for step in document["steps"]] == ["token", "oauth2"]
    assert document["token_expires_in"] == 3600
    assert len(document["carriers"]) == 2
    assert "access_token" not in document


def test_show_token_prints_it(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    """The token is printed only when --show-token asks for it."""
    code, out, _ = _run(
        capsys, ["check", "--json", "--method", "oauth2", "--show-token"], emulator.environ()
    )
    assert code == 0
    assert json.loads(out)["access_token"].startswith("emu-token-")


def test_wrong_secret_exits_1(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong secret is refused by both methods: exit code 1, and the secret is not echoed."""
    environ = {**emulator.environ(), "SERVICE_CLIENT_SECRET": "wrong-secret-value"}
    code, out, err = _run(capsys, ["check"], environ)
    assert code == 1
    assert "invalid_client" in out
    assert "wrong-secret-value" not in out + err


def test_flags_override_the_environment(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """--client-id and friends win over SERVICE_* variables."""
    client = emulator.recent_client
    argv = [
        "check",
        "--method",
        "api-key",
        "--base-url",
        emulator.base_url,
        "--client-id",
        client.client_id,
        "--client-secret",
        client.client_secret,
    ]
    code, _, _ = _run(capsys, argv, {"SERVICE_CLIENT_ID": "someone-else"})
    assert code == 0


@pytest.mark.parametrize(
    "missing",
    ["SERVICE_BASE_URL", "SERVICE_AUTH_URL", "SERVICE_CLIENT_ID", "SERVICE_CLIENT_SECRET"],
)
def test_missing_setting_exits_2(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    """A missing setting names the variable and the flag; exit code 2."""
    environ = emulator.environ()
    del environ[missing]
    code, _, err = _run(capsys, ["check"], environ)
    assert code == 2
    assert missing in err


def test_unreachable_service_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """Nobody listening: exit code 3."""
    environ = {
        "SERVICE_BASE_URL": "http://127.0.0.1:9",
        "SERVICE_AUTH_URL": "http://127.0.0.1:9",
        "SERVICE_CLIENT_ID": "id",
        "SERVICE_CLIENT_SECRET": "secret",
    }
    code, out, _ = _run(capsys, ["check", "--method", "api-key"], environ)
    assert code == 3
    assert "TransportConnectionFailed" in out


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown commands and bad values exit 2, --help exits 0."""
    assert main(["nope"], environ={}) == 2
    assert (
        main(
            ["check", "--first", "0"],
            environ={
                "SERVICE_BASE_URL": "http://127.0.0.1:9",
                "SERVICE_CLIENT_ID": "i",
                "SERVICE_CLIENT_SECRET": "s",
                "SERVICE_AUTH_URL": "http://127.0.0.1:9",
            },
        )
        == 2
    )
    assert main(["--help"], environ={}) == 0
    assert "Exit codes" in capsys.readouterr().out


def test_demo_runs_without_a_failed_query(capsys: pytest.CaptureFixture[str]) -> None:
    """gql-service-auth demo (make demo) tells the whole story and exits 0."""
    # 2 s, as make demo: under coverage, with every logger at DEBUG on a loaded machine,
    # 200 queries queued behind aiohttp's 100-connection pool outlived 1 s tokens.
    code = main(["demo", "--token-ttl", "2"], environ={})
    out = capsys.readouterr().out
    assert code == 0
    assert "0 failed" in out
    assert "2024-05-13" in out
    assert "token renewed before expiry" in out


def test_emulator_command_serves_what_it_prints(tmp_path: Path) -> None:
    """The emulator command prints export lines that point check at it; SIGINT stops it."""
    clients = tmp_path / "clients.json"
    clients.write_text(
        json.dumps(
            [
                {"client_id": "team-a", "client_secret": "a-secret", "registered": "2025-03-01"},
                {
                    "client_id": "team-old",
                    "client_secret": "old-secret",
                    "registered": "2022-03-01",
                },
            ]
        )
    )
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gql_service_auth",
            "emulator",
            "--port",
            "0",
            "--token-ttl",
            "30",
            "--clients",
            str(clients),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        try:
            lines = [process.stdout.readline() for _ in range(8)]
            exports = dict(
                line.removeprefix("export ").strip().split("=", 1)
                for line in lines
                if line.startswith("export ")
            )
            assert exports["SERVICE_CLIENT_ID"] == "team-a"
            assert any("team-old" in line for line in lines)
            completed = subprocess.run(
                [sys.executable, "-m", "gql_service_auth", "check", "--json"],
                env={**os.environ, **exports},
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert completed.returncode == 0, completed.stderr
            assert json.loads(completed.stdout)["method"] == "api-key"
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=10) == 0


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '[{"client_secret": "x"}]',
        '[{"client_id": "a", "client_secret": "b", "registered": "soon"}]',
    ],
)
def test_bad_clients_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    """An unreadable clients file is a usage error, named in the message."""
    clients = tmp_path / "clients.json"
    clients.write_text(content)
    assert main(["emulator", "--port", "0", "--clients", str(clients)], environ={}) == 2
    assert "clients.json" in capsys.readouterr().err
