"""The gql-service-auth command, run through main(argv) against the emulator."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from support import run_python

from gql_service_auth.cli import EXIT_CODES, main
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


def test_wrong_secret_is_not_blamed_on_the_2024_rule(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service's reason is shown, and the note says the secret is wrong, not the date."""
    environ = {**emulator.environ(), "SERVICE_CLIENT_SECRET": "wrong-secret-value"}
    _, out, _ = _run(capsys, ["check"], environ)
    assert "server said: 'invalid API key'" in _line(out, "API key")
    assert _line(out, "OAuth2 token").split()[2] == "FAILED"
    (note,) = [line for line in out.splitlines() if "note:" in line]
    assert "Client Id or Client Secret is wrong" in note
    assert "cannot be used as an API key" not in note


def test_legacy_note_follows_what_oauth2_proved(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 2024-05-13 rule is named as the cause once OAuth2 accepted the same credentials."""
    _, out, _ = _run(capsys, ["check"], emulator.environ(emulator.legacy_client))
    assert "server said: 'API key authentication is not available" in _line(out, "API key")
    (note,) = [line for line in out.splitlines() if "note:" in line]
    assert "OAuth2 accepted them" in note
    assert "registered before 2024-05-13 cannot be used as an API key" in note


def test_auto_needs_no_auth_url_when_the_api_key_works(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """check in auto mode runs on SERVICE_BASE_URL and the credentials alone."""
    environ = emulator.environ()
    del environ["SERVICE_AUTH_URL"]
    code, out, err = _run(capsys, ["check"], environ)
    assert code == 0, err
    assert "method that works: api-key" in out
    assert emulator.counters.token_requests == 0


def test_auto_asks_for_the_auth_url_only_when_oauth2_is_reached(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused API key without an auth URL: the API key line, then exit 2 naming the variable."""
    environ = emulator.environ(emulator.legacy_client)
    del environ["SERVICE_AUTH_URL"]
    code, out, err = _run(capsys, ["check"], environ)
    assert code == 2
    assert _line(out, "API key").split()[2] == "FAILED"
    assert "SERVICE_AUTH_URL" in err
    assert "--auth-url" in err
    assert emulator.counters.token_requests == 0


@pytest.mark.parametrize("status", [404, 405])
def test_token_endpoint_404_or_405_exits_3_saying_wrong_token_url(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], status: int
) -> None:
    """No token endpoint at that URL is a wrong URL (exit 3), not refused credentials (1)."""
    environ = emulator.environ()
    if status == 404:
        environ["SERVICE_AUTH_URL"] = emulator.base_url + "/nowhere"
    else:
        emulator.fail_token_requests(1, 405)
    code, out, _ = _run(capsys, ["check", "--method", "oauth2"], environ)
    assert code == 3
    token_line = _line(out, "OAuth2 token")
    assert token_line.split()[2] == "FAILED"
    assert f"HTTP {status}" in token_line
    assert "Wrong token_url?" in token_line
    assert "OAuth2 query" not in out  # no token, so no query: the token line says it all
    # Not retried: the emulator counts the 405 (the 404 never reaches its token route).
    assert emulator.counters.token_requests == (1 if status == 405 else 0)


def test_failed_token_request_is_reported_on_the_token_line(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused token request shows as the token step's failure, with its own latency."""
    environ = {**emulator.environ(), "SERVICE_CLIENT_SECRET": "wrong-secret-value"}
    code, out, _ = _run(capsys, ["check", "--method", "oauth2", "--json"], environ)
    document = json.loads(out)
    assert code == 1
    assert [(step["name"], step["ok"]) for step in document["steps"]] == [("token", False)]
    assert "invalid_client" in document["steps"][0]["detail"]


def test_one_carrier_is_singular(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    """--first 1 reports "1 carrier"."""
    _, out, _ = _run(capsys, ["check", "--method", "api-key", "--first", "1"], emulator.environ())
    assert _line(out, "API key").endswith("  1 carrier")


def test_base_url_ending_in_graphql_is_used_as_it_is(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """SERVICE_BASE_URL=.../graphql works (no /graphql/graphql), and a note says so once."""
    environ = {**emulator.environ(), "SERVICE_BASE_URL": emulator.base_url + "/graphql/"}
    code, out, _ = _run(capsys, ["check"], environ)
    assert code == 0
    assert out.count("note:") == 1
    assert "used as the GraphQL endpoint as it is" in out
    assert [r.path for r in emulator.requests] == ["/graphql"]


def _line(out: str, label: str) -> str:
    """The report line of one step."""
    (line,) = [line for line in out.splitlines() if line.startswith(label + " ")]
    return line


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
    code, _, err = _run(capsys, ["check", "--method", "oauth2"], environ)
    assert code == 2
    assert missing in err
    assert emulator.counters.graphql_requests + emulator.counters.token_requests == 0


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
    assert "could not reach http://127.0.0.1:9/graphql" in _line(out, "API key")


def test_a_wrong_api_url_is_named_with_the_variable_to_fix(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 404 where GraphQL should answer: exit 3, the URL and SERVICE_BASE_URL named."""
    environ = {**emulator.environ(), "SERVICE_BASE_URL": emulator.base_url + "/v2"}
    code, out, _ = _run(capsys, ["check", "--method", "api-key"], environ)
    assert code == 3
    line = _line(out, "API key")
    assert f"nothing answers GraphQL at {emulator.base_url}/v2/graphql (HTTP 404)" in line
    assert "check SERVICE_BASE_URL (the API host, to which from_env() appends /graphql)" in line
    assert "TransportServerError" not in out


def test_an_api_that_never_answers_is_named_with_the_wait(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that accepts and never answers: exit 3 after --timeout, not an empty
    TimeoutError."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        environ = {**emulator.environ(), "SERVICE_BASE_URL": url}
        code, out, _ = _run(capsys, ["check", "--method", "api-key", "--timeout", "0.5"], environ)
    assert code == 3
    line = _line(out, "API key")
    assert f"no answer from {url}/graphql within the 0.5 s of gql's execute_timeout" in line
    assert "check SERVICE_BASE_URL" in line


def test_a_token_endpoint_that_never_answers_is_named_not_the_api(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """--timeout shorter than the token fetch's own bound: the token URL is named, and no
    query was sent, so the API's URL is not blamed."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        auth_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        environ = {**emulator.environ(), "SERVICE_AUTH_URL": auth_url}
        command = ["check", "--method", "oauth2", "--timeout", "0.5"]
        code, out, _ = _run(capsys, command, environ)
    assert code == 3
    line = _line(out, "OAuth2 token")
    assert f"no token from {auth_url}/oauth2/token within 0.5 s" in line
    assert "is SERVICE_AUTH_URL right" in line
    assert "SERVICE_BASE_URL" not in out
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("timeout", ["0", "-1", "601", "nan"])
def test_a_timeout_out_of_bounds_is_a_usage_error(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], timeout: str
) -> None:
    code, _, err = _run(capsys, ["check", "--timeout", timeout], emulator.environ())
    assert code == 2
    assert "--timeout" in err


def test_help_and_docs_tell_the_same_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """--help of the command and of check, and the command line's page, give the same exit
    codes."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    assert EXIT_CODES in " ".join(page.replace("`", "").split())
    for argv in (["--help"], ["check", "--help"]):
        assert main(argv, environ={}) == 0
        assert EXIT_CODES in " ".join(capsys.readouterr().out.split())


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
    # As make demo: its 200 concurrent queries are on an hour's token, which no queue
    # outlives on a loaded machine (2 s tokens did: UnauthenticatedError).
    code = main(["demo", "--token-ttl", "2"], environ={})
    out = capsys.readouterr().out
    assert code == 0
    assert "0 failed" in out
    assert "2024-05-13" in out
    assert "renewed with 1 token request, and sent again" in out
    assert "token renewed before expiry" in out
    # The captions say what was measured: the refusals by step add up to the count, and
    # step 4's words follow its own figure.
    total, *steps = (
        int(n)
        for n in re.findall(
            r"UNAUTHENTICATED answers: (\d+) "
            r"\(steps 1 to 4: (\d+), step 5: (\d+), step 6: (\d+)\)",
            out,
        )[0]
    )
    assert total == sum(steps)
    new = int(re.findall(r"200 answers, (\d+) new token request", out)[0])
    assert ("all shared the token in hand" in out) == (new == 0)


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
            counters_url = lines[0].split("counters: GET ", 1)[1].strip()
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with direct.open(counters_url, timeout=10) as answer:
                counters = json.load(answer)
            assert counters["graphql_requests"] == 1
            assert counters["token_requests"] == 0
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=10) == 0
        summary = process.stdout.read()
        assert "# served 0 token requests (0 tokens issued), 1 GraphQL requests" in summary


def _emulator_exports(*options: str) -> dict[str, str]:
    """Start the emulator command, read its export lines, stop it with SIGINT."""
    with subprocess.Popen(
        [sys.executable, "-m", "gql_service_auth", "emulator", "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        try:
            lines = [process.stdout.readline() for _ in range(8)]
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=10) == 0, process.stderr
    return dict(
        line.removeprefix("export ").strip().split("=", 1)
        for line in lines
        if line.startswith("export ")
    )


def test_keep_clients_serves_the_same_credentials_at_every_start(tmp_path: Path) -> None:
    """The first start writes its generated clients (0600); the next ones serve them."""
    kept = tmp_path / "dev-clients.json"
    first = _emulator_exports("--keep-clients", str(kept))
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert len(json.loads(kept.read_text())) == 2  # a recent and a legacy client
    second = _emulator_exports("--keep-clients", str(kept))
    assert first["SERVICE_CLIENT_ID"] == second["SERVICE_CLIENT_ID"]
    assert first["SERVICE_CLIENT_SECRET"] == second["SERVICE_CLIENT_SECRET"]
    # --port 0: any free port each start, which may happen to be the same one again.
    assert second["SERVICE_BASE_URL"].startswith("http://127.0.0.1:")


def test_clients_and_keep_clients_together_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["emulator", "--port", "0", "--clients", "a.json", "--keep-clients", "b.json"]
    assert main(argv, environ={}) == 2
    assert "--clients and --keep-clients" in capsys.readouterr().err


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


def test_emulator_command_exits_0_on_sigterm() -> None:
    """SIGTERM stops the emulator as Ctrl+C does, with exit code 0, as --help says."""
    with subprocess.Popen(
        [sys.executable, "-m", "gql_service_auth", "emulator", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        try:
            assert "Ctrl+C to stop" in process.stdout.readline()
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0


@pytest.mark.parametrize("verbose", [False, True])
def test_cli_logging_stays_off_the_report(emulator: Emulator, verbose: bool) -> None:
    """The CLI prints no bare log line; -v shows token retries as key=value lines on stderr."""
    emulator.fail_token_requests(1, 503)
    completed = subprocess.run(
        [sys.executable, "-m", "gql_service_auth", "check", "--method", "oauth2"]
        + (["-v"] if verbose else []),
        env={**os.environ, **emulator.environ()},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "gql_service_auth" not in completed.stdout
    if verbose:
        assert completed.stderr.startswith(
            "INFO: gql_service_auth.token_request_retry_scheduled status=503 "
            "error=temporarily_unavailable attempt=1/4 wait="
        )
        assert emulator.recent_client.client_secret not in completed.stderr
    else:
        assert completed.stderr == ""


_CALL_MAIN = """
    import logging, sys
    from gql_service_auth.cli import main

    root, package = logging.getLogger(), logging.getLogger("gql_service_auth")
    {setup}
    before = (list(root.handlers), root.level, list(package.handlers), package.level)
    code = main(["check", "--method", "oauth2", "-v"])
    after = (list(root.handlers), root.level, list(package.handlers), package.level)
    assert code == 0, code
    assert after == before, (before, after)
    {check}
    print("same")
"""


def test_main_leaves_no_handler_or_level_behind(emulator: Emulator) -> None:
    """A program that set up nothing finds logging as it was once main() returned."""
    emulator.fail_token_requests(1, 503)
    completed = run_python(_CALL_MAIN.format(setup="", check=""), emulator.environ())
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().endswith("same")
    # While it ran, -v still showed the retry on stderr.
    assert "INFO: gql_service_auth.token_request_retry_scheduled status=503" in completed.stderr


def test_main_keeps_a_program_s_own_package_logger_setup(emulator: Emulator) -> None:
    """A handler and level the program put on the package's logger stay, and get the records."""
    emulator.fail_token_requests(1, 503)
    setup = """
    seen = []
    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    package.addHandler(Keep())
    package.setLevel(logging.DEBUG)
    """
    check = "assert any('token_fetched' in m for m in seen), seen"
    code = _CALL_MAIN.format(
        setup=textwrap.indent(textwrap.dedent(setup), "    ").strip(), check=check
    )
    completed = run_python(code, emulator.environ())
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().endswith("same")


@pytest.mark.parametrize("base", ["/?key=1", "/graphql?key=1", "/graphql/#top"])
def test_cli_check_with_a_query_in_the_base_url(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], base: str
) -> None:
    """check works with a query or fragment in SERVICE_BASE_URL, and says when it is used as is."""
    environ = {**emulator.environ(), "SERVICE_BASE_URL": emulator.base_url + base}
    code = main(["check", "--method", "api-key"], environ=environ)
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert ("used as the GraphQL endpoint as it is" in out) == ("graphql" in base)


def test_check_reads_the_credentials_files_the_application_reads(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SERVICE_CLIENT_SECRET_FILE, as from_env reads it: check tests what the app will use."""
    client = emulator.legacy_client  # OAuth2 only: both methods are tried
    (tmp_path / "secret").write_text(client.client_secret + "\n")
    environ = emulator.environ(client)
    del environ["SERVICE_CLIENT_SECRET"]
    environ["SERVICE_CLIENT_SECRET_FILE"] = str(tmp_path / "secret")
    code, out, _ = _run(capsys, ["check"], environ)
    assert code == 0
    assert "method that works: oauth2" in out
    assert client.client_secret not in out


def test_check_names_a_credentials_file_it_cannot_read(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    environ = emulator.environ()
    del environ["SERVICE_CLIENT_ID"], environ["SERVICE_CLIENT_SECRET"]
    environ["SERVICE_CREDENTIALS_FILE"] = str(tmp_path / "missing.json")
    code, _, err = _run(capsys, ["check"], environ)
    assert code == 2
    assert "missing.json" in err
    assert "FileNotFoundError" in err


@pytest.mark.parametrize("stack", ["requests", "httpx", "httpx-async"])
def test_check_with_the_applications_stack_sees_its_proxy(
    emulator: Emulator,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stack: str,
) -> None:
    """HTTP_PROXY names a proxy that never answers: --stack requests/httpx fails as such
    an application fails, naming the proxy; aiohttp, which ignores it, passes and says so."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        proxy = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("http_proxy", proxy)
        environ = {**emulator.environ(), "HTTP_PROXY": proxy}
        argv = ["check", "--method", "api-key", "--timeout", "1"]
        code, out, _ = _run(capsys, [*argv, "--stack", stack], environ)
        assert code == 3
        assert f"through the proxy 127.0.0.1:{silent.getsockname()[1]} (HTTP_PROXY)" in _line(
            out, "API key"
        )
        code, out, _ = _run(capsys, argv, environ)
    assert code == 0
    assert "HTTP_PROXY is set: aiohttp ignores the environment's proxies" in out
    assert "--stack requests" in out


def test_check_with_a_sync_stack_passes(
    emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """--stack requests: the check query through the requests transports, OAuth2 too."""
    code, out, _ = _run(
        capsys, ["check", "--method", "oauth2", "--stack", "requests"], emulator.environ()
    )
    assert code == 0, out
    assert "method that works: oauth2" in out
