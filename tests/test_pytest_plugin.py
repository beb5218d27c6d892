"""The pytest plugin, seen from a user's test suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"

USER_TESTS = """
import asyncio
import pytest
from gql import Client, gql
from gql_service_auth import ApiKeyRejectedError, ApiKeyTransport, OAuth2Transport

QUERY = gql("query { carriers(first: 2) { edges { node { name } } } }")

def run(transport):
    async def go():
        async with Client(transport=transport) as session:
            return await session.execute(QUERY)
    return asyncio.run(go())

def test_env_points_from_env_at_the_emulator(service_env, service_emulator):
    assert len(run(OAuth2Transport.from_env(service_env))["carriers"]["edges"]) == 2
    assert service_emulator.counters.token_requests == 1

def test_legacy_client_is_refused_as_api_key(service_emulator, service_legacy_client):
    transport = ApiKeyTransport(
        service_emulator.graphql_url,
        client_id=service_legacy_client.client_id,
        client_secret=service_legacy_client.client_secret,
    )
    with pytest.raises(ApiKeyRejectedError):
        run(transport)

def test_ttl_option(service_emulator):
    assert service_emulator.token_ttl == 7

@pytest.mark.service_emulator(token_latency=0.01, unauthenticated_status=401)
def test_marker_sets_knobs(service_emulator):
    assert (service_emulator.token_latency, service_emulator.unauthenticated_status) == (0.01, 401)

def test_clock_drives_expiry(service_emulator, service_clock, service_client):
    transport = OAuth2Transport(
        service_emulator.graphql_url,
        token_url=service_emulator.token_url,
        client_id=service_client.client_id,
        client_secret=service_client.client_secret,
        clock=service_clock,
    )
    run(transport)
    service_clock.advance(8)
    run(transport)
    assert service_emulator.counters.token_requests == 2
"""


def test_fixtures_work_in_a_user_suite(pytester: pytest.Pytester) -> None:
    """A user's tests get a running emulator, credentials, env, the TTL option and the marker."""
    pytester.makeini(INI)
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess(
        "--service-token-ttl=7", "--strict-markers", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=5)


def test_service_variables_sets_the_environment_for_one_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opt-in fixture points os.environ (and so from_env() with no argument) at the
    emulator for its test alone: a shell's SERVICE_* variables are back after it, and a
    test that does not ask for it sees them."""
    monkeypatch.setenv("SERVICE_BASE_URL", "https://shell.example")
    monkeypatch.setenv("SERVICE_TOKEN_STORE_URL", "redis://shell.example:6379/0")
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
import asyncio
import os
from gql import Client, gql
from gql_service_auth import OAuth2Transport

async def query():
    async with Client(transport=OAuth2Transport.from_env()) as session:
        return await session.execute(gql("query { carriers(first: 1) { totalCount } }"))

def test_a_uses_the_emulator(service_variables, service_emulator):
    assert os.environ["SERVICE_BASE_URL"] == service_emulator.base_url
    assert "SERVICE_TOKEN_STORE_URL" not in os.environ
    assert asyncio.run(query())
    assert service_emulator.counters.token_requests == 1

def test_b_sees_the_shell_again():
    assert os.environ["SERVICE_BASE_URL"] == "https://shell.example"
    assert os.environ["SERVICE_TOKEN_STORE_URL"] == "redis://shell.example:6379/0"
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_unknown_knob_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """A marker naming a knob the emulator lacks fails clearly instead of being ignored."""
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
import pytest

@pytest.mark.service_emulator(token_tll=2)
def test_typo(service_emulator):
    pass
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no knob 'token_tll'*"])


HEAVY = ("aiohttp", "gql", "graphql", "gql_service_auth.emulator", "gql_service_auth.transports")
"""Modules a run that never asks for a fixture must not import (about 400 ms)."""


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    """pytest imports the plugin in every run: that alone imports no emulator, aiohttp or gql."""
    probe = (
        "import json, sys; import gql_service_auth.pytest_plugin; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert not set(HEAVY) & set(json.loads(completed.stdout))


def test_a_run_that_uses_no_fixture_imports_nothing_heavy(pytester: pytest.Pytester) -> None:
    """In a suite that never asks for the fixtures, the plugin is loaded and costs no import."""
    pytester.makeini(INI)
    pytester.makepyfile(
        test_plain=f"""
import sys

def test_plain(request):
    assert request.config.pluginmanager.has_plugin("gql_service_auth")
    assert not set({HEAVY!r}) & set(sys.modules)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_each_test_starts_with_no_shared_token(pytester: pytest.Pytester) -> None:
    """Transports share tokens in a process, but not across the tests of a user's suite,
    even on one emulator kept for the whole module."""
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
import asyncio
import pytest
from gql import Client, gql
from gql_service_auth import OAuth2Transport
from gql_service_auth.emulator import Emulator

QUERY = gql("query { carriers(first: 1) { totalCount } }")

async def query(environ):
    async with Client(transport=OAuth2Transport.from_env(environ)) as session:
        await session.execute(QUERY)

@pytest.fixture(scope="module")
def emulator():
    with Emulator().run_in_thread() as running:
        yield running

@pytest.mark.parametrize("test", range(3))
def test_costs_its_own_token(emulator, test):
    before = emulator.counters.token_requests
    for _ in range(2):
        asyncio.run(query(emulator.environ()))
    assert emulator.counters.token_requests == before + 1
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
