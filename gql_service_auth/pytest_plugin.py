"""pytest fixtures for testing code that talks to the service, offline, against the emulator.

Installed as a ``pytest11`` entry point, so the fixtures are there as soon as
gql-service-auth is installed next to pytest::

    def test_my_report(service_variables):
        assert build_report()["carriers"]     # your code, using OAuth2Transport.from_env()

Fixtures:
    service_emulator: A running :class:`~gql_service_auth.emulator.Emulator` (its knobs
        inject faults, its counters tell what happened).
    service_clock: A :class:`~gql_service_auth.emulator.ManualClock`; when a test asks for
        it, the emulator expires tokens by it, so ``advance()`` replaces sleeping.
    service_client: Credentials that work both ways (registered after 2024-05-13).
    service_legacy_client: Credentials registered before 2024-05-13 (OAuth2 only).
    service_env: The ``SERVICE_*`` variables pointing ``from_env()`` at the emulator.
    service_variables: Opt-in: those variables set in ``os.environ`` for the test (and
        any other ``SERVICE_*`` variable removed), as they were afterwards.

Async tests (``async def test_...``) need an async plugin, such as pytest-asyncio; the
fixtures themselves are plain, and serve sync and async tests alike.

Isolation: each test starts with no token shared in the process, so transports built in
one test never use the tokens of another's (transports share tokens within a process;
see ``share_tokens``). A transport a fixture keeps across tests keeps its own.

Options:
    ``--service-token-ttl=SECONDS`` sets the emulator's token lifetime for the run, and
    ``@pytest.mark.service_emulator(token_ttl=2, token_latency=0.1, ...)`` sets any
    emulator knob for one test.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .emulator import ClientRecord, Emulator, ManualClock

# pytest imports this module in every run once the package is installed, whether or not
# a test asks for a fixture: it imports nothing of the package at load time (see
# __init__.py). The fixtures import the emulator, and with it aiohttp and gql, when used.

_MARKER = "service_emulator"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--service-token-ttl``."""
    group = parser.getgroup("gql-service-auth", "service emulator")
    group.addoption(
        "--service-token-ttl",
        type=float,
        default=None,
        metavar="SECONDS",
        help="lifetime of the emulator's access tokens (default 3600)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker, so --strict-markers accepts it."""
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(**knobs): set emulator knobs (token_ttl, token_latency, ...) for one test",
    )


@pytest.fixture(autouse=True)
def _service_tokens_isolated() -> None:
    """Forget the tokens shared in the process before each test (module docstring)."""
    sharing = sys.modules.get("gql_service_auth._core.sharing")
    if sharing is not None:  # never imported: no transport built, nothing to forget
        sharing.SHARED.clear()
    budget = sys.modules.get("gql_service_auth._core.budget")
    if budget is not None:  # nor refusals and token budgets, counted per process
        budget.LEDGERS.clear()


@pytest.fixture
def service_clock() -> ManualClock:
    """A clock that moves only on ``advance()``; the emulator uses it when it is requested."""
    from .emulator import ManualClock

    return ManualClock()


@pytest.fixture
def service_emulator(request: pytest.FixtureRequest) -> Iterator[Emulator]:
    """The service emulator on 127.0.0.1, serving from a thread of its own."""
    from .emulator import Emulator

    clock: Callable[[], float] = time.monotonic
    if "service_clock" in request.fixturenames:
        clock = request.getfixturevalue("service_clock")
    emulator = Emulator(clock=clock)
    ttl = request.config.getoption("--service-token-ttl")
    if ttl is not None:
        emulator.token_ttl = ttl
    marker = request.node.get_closest_marker(_MARKER)
    for name, value in (marker.kwargs if marker else {}).items():
        if not hasattr(emulator, name) or name.startswith("_"):
            raise pytest.UsageError(f"@pytest.mark.{_MARKER}: the emulator has no knob {name!r}")
        setattr(emulator, name, value)
    with emulator.run_in_thread() as running:
        yield running


@pytest.fixture
def service_client(service_emulator: Emulator) -> ClientRecord:
    """Credentials registered after 2024-05-13: the API key and OAuth2 both work."""
    return service_emulator.recent_client


@pytest.fixture
def service_legacy_client(service_emulator: Emulator) -> ClientRecord:
    """Credentials registered before 2024-05-13: only OAuth2 works."""
    return service_emulator.legacy_client


@pytest.fixture
def service_env(service_emulator: Emulator, service_client: ClientRecord) -> dict[str, str]:
    """The ``SERVICE_*`` variables that point ``from_env()`` at the emulator."""
    return service_emulator.environ(service_client)


@pytest.fixture
def service_variables(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """``service_env`` set in ``os.environ`` for the test, and restored after it.

    Any other ``SERVICE_*`` variable of the shell (a store URL, say) is removed for the
    test, so that the code under test reaches the emulator alone.
    """
    import os

    for name in [name for name in os.environ if name.startswith("SERVICE_")]:
        monkeypatch.delenv(name)
    for name, value in service_env.items():
        monkeypatch.setenv(name, value)
    return service_env
