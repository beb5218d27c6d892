"""The CLI inside an app, the lazy package, URLs with queries, and credentials echoed back."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import typing
from collections.abc import Callable

import pytest
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from support import CARRIERS

import gql_service_auth
from gql_service_auth import ApiKeyTransport, OAuth2Transport
from gql_service_auth.cli import main
from gql_service_auth.emulator import Emulator


def _python(code: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (no logging set up, nothing imported)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- A: main(argv) inside a program -----------------------------------------------------

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
    completed = _python(_CALL_MAIN.format(setup="", check=""), emulator.environ())
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
    completed = _python(code, emulator.environ())
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().endswith("same")


# -- C: a service that quotes the credentials in an error that is not a refusal ----------


@pytest.fixture
def quiet_gql(caplog: pytest.LogCaptureFixture) -> None:
    """gql's own transport logs every raw answer at DEBUG: that record is gql's, out of
    this package's reach, and would trip the leak scanner; the scan here is of the rest."""
    caplog.set_level(logging.INFO, logger="gql.transport.aiohttp")


def _forbidden(text: str) -> dict[str, object]:
    return {
        "data": None,
        "errors": [{"message": f"not allowed for {text}", "extensions": {"code": "FORBIDDEN"}}],
    }


@pytest.mark.usefixtures("quiet_gql")
@pytest.mark.parametrize("as_json", [False, True])
def test_cli_never_prints_a_key_quoted_in_another_error(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """An error other than UNAUTHENTICATED that quotes the key: exit 3, no secret shown."""
    client = emulator.recent_client
    emulator.fail_graphql_requests(
        1, body=_forbidden(f"SERVICE-API-KEY {client.client_id}:{client.client_secret}")
    )
    code = main(
        ["check", "--method", "api-key", *(["--json"] if as_json else [])],
        environ=emulator.environ(),
    )
    out, err = capsys.readouterr()
    assert code == 3
    assert "FORBIDDEN" in out
    assert client.client_secret not in out + err
    if as_json:
        assert json.loads(out)["ok"] is False


@pytest.mark.usefixtures("quiet_gql")
async def test_api_key_error_quoting_the_key_is_scrubbed(
    emulator: Emulator, make_api_key: Callable[..., ApiKeyTransport]
) -> None:
    """gql raises TransportQueryError from the answer: its message, errors and data are clean."""
    client = emulator.recent_client
    emulator.fail_graphql_requests(
        1, body=_forbidden(f"SERVICE-API-KEY {client.client_id}:{client.client_secret}")
    )
    async with Client(transport=make_api_key()) as session:
        with pytest.raises(TransportQueryError) as caught:
            await session.execute(CARRIERS)
    assert "***" in str(caught.value)  # the scanner in conftest.py checks every text of it


@pytest.mark.usefixtures("quiet_gql")
async def test_oauth2_error_quoting_the_token_is_scrubbed(
    emulator: Emulator, make_oauth2: Callable[..., OAuth2Transport]
) -> None:
    """The same for a Bearer token quoted back, to a request and to a batch."""
    transport = make_oauth2()
    async with Client(transport=transport) as session:
        await session.execute(CARRIERS)
        assert transport.token is not None
        token = transport.token.value
        emulator.fail_graphql_requests(1, body=_forbidden(f"Bearer {token}"))
        with pytest.raises(TransportQueryError) as caught:
            await session.execute(CARRIERS)
        assert token not in str(caught.value)
        assert "***" in str(caught.value)
        # A batch goes the way of re-sendable requests (_send_with_renewal).
        emulator.fail_graphql_requests(1, body=[_forbidden(f"Bearer {token}")])
        with pytest.raises(TransportQueryError) as caught:
            await session.execute_batch([GraphQLRequest(CARRIERS)])
        assert token not in repr(vars(caught.value))
        assert "***" in str(caught.value)


# -- C: base URLs with a query -------------------------------------------------------------


def test_a_query_in_the_base_url_stays_after_the_path(emulator: Emulator) -> None:
    """?key=1 must not become ?key=1/graphql, whose path is / (the service answers 404)."""
    environ = {
        **emulator.environ(),
        "SERVICE_BASE_URL": emulator.base_url + "/?key=1",
        "SERVICE_AUTH_URL": emulator.auth_url + "?key=2",
    }
    transport = OAuth2Transport.from_env(environ)
    assert str(transport.url) == emulator.base_url + "/graphql?key=1"
    assert str(transport.token_url) == emulator.auth_url + "/oauth2/token?key=2"
    api_key = ApiKeyTransport.from_env(
        {**environ, "SERVICE_BASE_URL": emulator.base_url + "/graphql/?key=1"}
    )
    assert str(api_key.url) == emulator.base_url + "/graphql?key=1"


@pytest.mark.parametrize("base", ["/?key=1", "/graphql?key=1", "/graphql/#top"])
def test_cli_check_with_a_query_in_the_base_url(
    emulator: Emulator, capsys: pytest.CaptureFixture[str], base: str
) -> None:
    environ = {**emulator.environ(), "SERVICE_BASE_URL": emulator.base_url + base}
    code = main(["check", "--method", "api-key"], environ=environ)
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert ("used as the GraphQL endpoint as it is" in out) == ("graphql" in base)


# -- B: the lazy package -------------------------------------------------------------------


def test_options_and_constructors_have_resolvable_type_hints() -> None:
    """aiohttp's cookie types are forward references: they must resolve (pydantic, IDEs)."""
    for name in ("AIOHTTPTransportOptions", "ApiKeyOptions", "OAuth2Options", "TokenSessionArgs"):
        typing.get_type_hints(getattr(gql_service_auth, name))
    for cls in (ApiKeyTransport, OAuth2Transport):
        typing.get_type_hints(cls.__init__)


def test_errors_unpickle_in_a_process_that_imported_nothing() -> None:
    """Pickle finds gql_service_auth.X in a fresh process: the lazy names resolve there."""
    values = [
        gql_service_auth.TokenRequestError("refused", status=401, error="invalid_client"),
        gql_service_auth.ApiKeyRejectedHTTPError("refused"),
        gql_service_auth.UnauthenticatedError("refused", errors=[{"message": "x"}]),
        gql_service_auth.ConfigurationError("bad"),
        gql_service_auth.AuthEvent("token_fetched"),
    ]
    completed = _python(
        f"""
        import pickle
        values = pickle.loads({pickle.dumps(values)!r})
        print([type(v).__name__ for v in values], values[1].code, values[2].errors)
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == (
        "['TokenRequestError', 'ApiKeyRejectedHTTPError', 'UnauthenticatedError', "
        "'ConfigurationError', 'AuthEvent'] 401 [{'message': 'x'}]"
    )


def test_first_use_from_many_threads_and_after_a_submodule() -> None:
    """Threads racing for the first lazy name all get it; star import; a submodule first."""
    completed = _python(
        """
        import threading
        import gql_service_auth.emulator
        import gql_service_auth as package
        names = list(package.__all__)
        barrier = threading.Barrier(len(names))
        got = {}
        def use(name):
            barrier.wait(timeout=30)
            got[name] = getattr(package, name)
        threads = [threading.Thread(target=use, args=(n,)) for n in names]
        for t in threads: t.start()
        for t in threads: t.join(timeout=30)
        assert sorted(got) == sorted(names), set(names) - set(got)
        namespace = {}
        exec("from gql_service_auth import *", namespace)
        assert set(package.__all__) <= set(namespace)
        print("ok")
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"
