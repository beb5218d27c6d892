"""pytest plugin: run gql's own aiohttp tests with ``AIOHTTPTransport`` swapped for ours.

Loaded by ``run.py`` with ``-p gql_swap`` (this directory on ``PYTHONPATH``) in gql's
unpacked test suite, never by our own test run. ``--gql-transport`` picks what gql's tests
get when they import ``gql.transport.aiohttp.AIOHTTPTransport``:

- ``stock``: gql's own class, untouched; the run that sets the count to match.
- ``api-key``: an :class:`~gql_service_auth.ApiKeyTransport` with made-up credentials.
- ``oauth2``: an :class:`~gql_service_auth.OAuth2Transport` whose tokens come from our
  emulator, served on 127.0.0.1 for the whole session.

gql's test servers ignore the ``Authorization`` header, so each test checks that our
transport behaves as gql's does everywhere else. gql's tests import the class inside each
test, and ``gql.cli`` inside its functions, so replacing the module attribute reaches
them all; the tests that run ``gql-cli`` in a subprocess get a ``gql-cli`` of ours, first
on ``PATH``, that makes the same swap.

``--gql-swap-report=FILE`` writes each test's outcome, and the tests during which one of
our transports was built, as JSON for ``run.py`` to check.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import pytest

MODES = ("stock", "api-key", "oauth2")

# What a gql-cli subprocess needs to make the same swap; inherited through the environment.
ENV_MODE = "GQL_SWAP_MODE"
ENV_TOKEN_URL = "GQL_SWAP_TOKEN_URL"
ENV_CLIENT_ID = "GQL_SWAP_CLIENT_ID"
ENV_CLIENT_SECRET = "GQL_SWAP_CLIENT_SECRET"
# The test running now, and the file each swapped constructor appends it to: subprocesses
# write there too, so a test counts as exercising our transport wherever it built one.
ENV_TEST = "GQL_SWAP_TEST"
ENV_BUILT_LOG = "GQL_SWAP_BUILT_LOG"

# Made up: gql's test servers check no credentials.
API_KEY_ID = "gql-suite-client"
API_KEY_SECRET = "gql-suite-secret"


def install(mode: str, environ: Mapping[str, str] = os.environ) -> type[Any]:
    """Put the transport of ``mode`` in place of ``gql.transport.aiohttp.AIOHTTPTransport``.

    Returns gql's class, to put back.
    """
    import gql.transport.aiohttp as gql_aiohttp

    from gql_service_auth import ApiKeyTransport, OAuth2Transport

    original: type[Any] = gql_aiohttp.AIOHTTPTransport
    if mode == "stock":
        return original

    def built() -> None:
        log, test = environ.get(ENV_BUILT_LOG), environ.get(ENV_TEST)
        if log and test:
            with open(log, "a", encoding="utf-8") as file:
                file.write(json.dumps(test) + "\n")  # node ids may hold spaces

    swapped: type[Any]
    if mode == "api-key":

        class SwappedApiKeyTransport(ApiKeyTransport):
            def __init__(self, url: Any, *args: Any, **kwargs: Any) -> None:
                super().__init__(
                    url, *args, client_id=API_KEY_ID, client_secret=API_KEY_SECRET, **kwargs
                )
                built()

        swapped = SwappedApiKeyTransport
    elif mode == "oauth2":
        token_url = environ[ENV_TOKEN_URL]
        client_id, client_secret = environ[ENV_CLIENT_ID], environ[ENV_CLIENT_SECRET]

        class SwappedOAuth2Transport(OAuth2Transport):
            def __init__(self, url: Any, *args: Any, **kwargs: Any) -> None:
                super().__init__(
                    url,
                    *args,
                    token_url=token_url,
                    client_id=client_id,
                    client_secret=client_secret,
                    **kwargs,
                )
                built()

        swapped = SwappedOAuth2Transport
    else:
        raise ValueError(f"unknown transport {mode!r}: one of {', '.join(MODES)}")
    gql_aiohttp.AIOHTTPTransport = swapped  # type: ignore[misc]
    return original


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gql-swap", "gql's tests with our transports")
    group.addoption("--gql-transport", choices=MODES, default="stock")
    group.addoption("--gql-swap-report", default=None, metavar="FILE")


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--gql-transport")
    plugin = _Swap(mode, config.getoption("--gql-swap-report"))
    config.pluginmanager.register(plugin, "gql-swap-session")


class _Swap:
    def __init__(self, mode: str, report: str | None) -> None:
        self.mode = mode
        self.report = report
        self.outcomes: dict[str, str] = {}
        self._stack = contextlib.ExitStack()
        self._built_log = ""
        self._token_requests: Callable[[], int] = lambda: 0

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        env: dict[str, str] = {ENV_MODE: self.mode}
        work = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="gql-swap-")))
        self._built_log = str(work / "built.log")
        Path(self._built_log).touch()
        env[ENV_BUILT_LOG] = self._built_log
        if self.mode == "oauth2":
            from gql_service_auth.emulator import Emulator

            emulator = self._stack.enter_context(Emulator().run_in_thread())
            self._token_requests = lambda: emulator.counters.token_requests
            env[ENV_TOKEN_URL] = emulator.token_url
            env[ENV_CLIENT_ID] = emulator.recent_client.client_id
            env[ENV_CLIENT_SECRET] = emulator.recent_client.client_secret
        if self.mode != "stock":
            # shutil.which finds this gql-cli first: pytest-console-scripts looks it up on PATH.
            bin_dir = work / "bin"
            bin_dir.mkdir()
            shim = bin_dir / "gql-cli"
            shim.write_text(
                f"#!{sys.executable}\n"
                "import os, sys\n"
                f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                "import gql_swap\n"
                f"gql_swap.install(os.environ[{ENV_MODE!r}])\n"
                "from gql.cli import gql_cli\n"
                "sys.exit(gql_cli())\n",
                encoding="utf-8",
            )
            shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
            env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        saved = {name: os.environ.get(name) for name in (*env, ENV_TEST)}
        self._stack.callback(_restore, saved)
        os.environ.update(env)
        import gql.transport.aiohttp as gql_aiohttp

        self._stack.callback(setattr, gql_aiohttp, "AIOHTTPTransport", install(self.mode))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        lines = Path(self._built_log).read_text(encoding="utf-8").splitlines()
        built = sorted({json.loads(line) for line in lines})
        token_requests = self._token_requests()
        self._stack.close()
        if self.report:
            summary = {
                "mode": self.mode,
                "outcomes": self.outcomes,
                "built": built,
                "token_requests": token_requests,
            }
            Path(self.report).write_text(json.dumps(summary, indent=1), encoding="utf-8")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        os.environ[ENV_TEST] = item.nodeid
        try:
            return (yield)
        finally:
            os.environ.pop(ENV_TEST, None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A test passed when its call passed and no phase failed; a failed teardown
        # after a passing call is a failure, as pytest counts it an error.
        previous = self.outcomes.get(report.nodeid)
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif previous == "failed":
            pass
        elif report.skipped:
            self.outcomes[report.nodeid] = "skipped"
        elif report.when == "call":
            self.outcomes[report.nodeid] = "passed"
        else:
            self.outcomes.setdefault(report.nodeid, "pending")


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
