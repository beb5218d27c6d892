"""pytest plugin: run gql's own HTTP transport tests with gql's classes swapped for ours.

Loaded by ``run.py`` with ``-p gql_swap`` (this directory on ``PYTHONPATH``) in gql's
unpacked test suite, never by our own test run. ``--gql-stack`` names the stack
(``aiohttp``, ``requests``, ``httpx``: see :data:`STACKS`), and ``--gql-transport`` picks
what gql's tests get when they import that stack's transport classes:

- ``stock``: gql's own classes, untouched; the run that sets the count to match.
- ``api-key``: our API key transports, with made-up credentials.
- ``oauth2``: our OAuth2 transports, whose tokens come from our emulator, served on
  127.0.0.1 for the whole session.

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
import importlib
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


# Per stack: gql's module, and each of its transport classes with ours for each mode.
STACKS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "aiohttp": (
        "gql.transport.aiohttp",
        {
            "AIOHTTPTransport": (
                "gql_service_auth:ApiKeyTransport",
                "gql_service_auth:OAuth2Transport",
            )
        },
    ),
    "requests": (
        "gql.transport.requests",
        {
            "RequestsHTTPTransport": (
                "gql_service_auth.requests:ApiKeyRequestsTransport",
                "gql_service_auth.requests:OAuth2RequestsTransport",
            )
        },
    ),
    "httpx": (
        "gql.transport.httpx",
        {
            "HTTPXTransport": (
                "gql_service_auth.httpx:ApiKeyHTTPXTransport",
                "gql_service_auth.httpx:OAuth2HTTPXTransport",
            ),
            "HTTPXAsyncTransport": (
                "gql_service_auth.httpx:ApiKeyHTTPXAsyncTransport",
                "gql_service_auth.httpx:OAuth2HTTPXAsyncTransport",
            ),
        },
    ),
}
ENV_STACK = "GQL_SWAP_STACK"


def _class(path: str) -> type[Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def install(
    mode: str, stack: str = "aiohttp", environ: Mapping[str, str] = os.environ
) -> dict[str, type[Any]]:
    """Put the transports of ``mode`` in place of gql's classes of ``stack``.

    Returns gql's classes by name, to put back.
    """
    module_name, classes = STACKS[stack]
    module = importlib.import_module(module_name)
    originals: dict[str, type[Any]] = {name: getattr(module, name) for name in classes}
    if mode not in MODES:
        raise ValueError(f"unknown transport {mode!r}: one of {', '.join(MODES)}")

    def built() -> None:
        log, test = environ.get(ENV_BUILT_LOG), environ.get(ENV_TEST)
        if log and test:
            with open(log, "a", encoding="utf-8") as file:
                file.write(json.dumps(test) + "\n")  # node ids may hold spaces

    if mode == "stock":
        # gql's own classes, noting which tests build one: a test that never does (one
        # that builds another stack's, or forgets to run its code) says nothing of ours.
        for original in originals.values():
            init = original.__dict__.get("__init__", original.__init__)

            def logged(self: Any, *args: Any, _init: Any = init, **kwargs: Any) -> None:
                _init(self, *args, **kwargs)
                built()

            original.__init__ = logged  # type: ignore[misc]
        return originals

    for name, (api_key_path, oauth2_path) in classes.items():
        if mode == "api-key":
            credentials: dict[str, str] = {
                "client_id": API_KEY_ID,
                "client_secret": API_KEY_SECRET,
            }
            ours = _class(api_key_path)
        else:
            credentials = {
                "token_url": environ[ENV_TOKEN_URL],
                "client_id": environ[ENV_CLIENT_ID],
                "client_secret": environ[ENV_CLIENT_SECRET],
            }
            ours = _class(oauth2_path)

        def __init__(
            self: Any,
            url: Any,
            *args: Any,
            _ours: Any = ours,
            _credentials: dict[str, str] = credentials,
            **kwargs: Any,
        ) -> None:
            _ours.__init__(self, url, *args, **_credentials, **kwargs)
            built()

        swapped = type(f"Swapped{ours.__name__}", (ours,), {"__init__": __init__})
        setattr(module, name, swapped)
    return originals


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gql-swap", "gql's tests with our transports")
    group.addoption("--gql-transport", choices=MODES, default="stock")
    group.addoption("--gql-stack", choices=sorted(STACKS), default="aiohttp")
    group.addoption("--gql-swap-report", default=None, metavar="FILE")


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--gql-transport")
    plugin = _Swap(mode, config.getoption("--gql-stack"), config.getoption("--gql-swap-report"))
    config.pluginmanager.register(plugin, "gql-swap-session")


class _Swap:
    def __init__(self, mode: str, stack: str, report: str | None) -> None:
        self.mode = mode
        self.stack = stack
        self.report = report
        self.outcomes: dict[str, str] = {}
        self._stack = contextlib.ExitStack()
        self._built_log = ""
        self._token_requests: Callable[[], int] = lambda: 0

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        env: dict[str, str] = {ENV_MODE: self.mode, ENV_STACK: self.stack}
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
                f"gql_swap.install(os.environ[{ENV_MODE!r}], os.environ[{ENV_STACK!r}])\n"
                "from gql.cli import gql_cli\n"
                "sys.exit(gql_cli())\n",
                encoding="utf-8",
            )
            shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
            env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        saved = {name: os.environ.get(name) for name in (*env, ENV_TEST)}
        self._stack.callback(_restore, saved)
        os.environ.update(env)
        module = importlib.import_module(STACKS[self.stack][0])
        inits = {
            name: getattr(module, name).__dict__.get("__init__") for name in STACKS[self.stack][1]
        }
        for name, original in install(self.mode, self.stack).items():
            self._stack.callback(setattr, module, name, original)
            if inits[name] is not None:
                self._stack.callback(setattr, original, "__init__", inits[name])

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
