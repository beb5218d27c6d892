"""One token per set of credentials in a process, whatever the code around it does.

Transports built per call, per thread or on two stacks share one token when their token
requests would be the same, against the emulator on 127.0.0.1 (real clock, real
threads). Tokens never cross credentials, settings that change the token request, or
``share_tokens=False``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from gql import Client
from support import (
    COUNT,
    NO_WAIT,
    blocking_execute,
    collect_garbage,
    in_child,
    poll,
    running_gateway,
    running_proxy,
    set_http_proxy,
    via_proxy,
)

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth._core.sharing import SHARED
from gql_service_auth.emulator import Emulator, ManualClock
from gql_service_auth.httpx import OAuth2Auth as OAuth2HTTPXAuth
from gql_service_auth.httpx import OAuth2HTTPXAsyncTransport, OAuth2HTTPXTransport
from gql_service_auth.requests import OAuth2Auth as OAuth2RequestsAuth
from gql_service_auth.requests import OAuth2RequestsTransport


def _per_call(environ: dict[str, str], **kwargs: Any) -> object:
    """What a helper that makes a client per query does: gql's blocking execute."""
    kwargs.setdefault("retry", NO_WAIT)
    outcome = blocking_execute(OAuth2Transport.from_env(environ, **kwargs))
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def test_a_transport_per_call_costs_one_token_request(live_emulator: Emulator) -> None:
    """Ten transports built one after another, collected in between, share one token."""
    environ = live_emulator.environ()
    for _ in range(10):
        _per_call(environ)
        collect_garbage()  # gql's Client cycles: a weak registry alone would lose the token
    assert live_emulator.counters.token_requests == 1
    assert live_emulator.counters.graphql_requests == 10


def test_a_transport_per_thread_costs_one_token_request(live_emulator: Emulator) -> None:
    """Eight threads, each with a transport of its own, start together on a cold token."""
    live_emulator.token_latency = 0.2  # so that all eight ask while the fetch runs
    environ, errors = live_emulator.environ(), []
    start = threading.Barrier(8, timeout=10)

    def worker() -> None:
        try:
            start.wait()
            _per_call(environ)
        except BaseException as exc:  # reported below, with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert live_emulator.counters.token_requests == 1
    assert live_emulator.counters.graphql_requests == 8


async def test_every_stack_side_by_side_costs_one_token_request(live_emulator: Emulator) -> None:
    """aiohttp, requests and httpx (sync and async) transports of the same credentials and
    API share one token; auth objects, which sign requests to any path, share one per
    origin among themselves."""
    environ = live_emulator.environ()
    async with Client(transport=OAuth2Transport.from_env(environ)) as session:
        await session.execute(COUNT)
    with Client(transport=OAuth2RequestsTransport.from_env(environ)) as sync_session:
        sync_session.execute(COUNT)
    with Client(transport=OAuth2HTTPXTransport.from_env(environ)) as sync_session:
        sync_session.execute(COUNT)
    async with Client(transport=OAuth2HTTPXAsyncTransport.from_env(environ)) as session:
        await session.execute(COUNT)
    assert live_emulator.counters.token_requests == 1
    for _ in range(2):
        async with httpx.AsyncClient(auth=OAuth2HTTPXAuth.from_env(environ)) as plain:
            answer = await plain.post(live_emulator.graphql_url, json={"query": "{ __typename }"})
        assert answer.status_code == 200
    assert live_emulator.counters.token_requests == 2
    assert live_emulator.counters.graphql_requests == 6


def test_another_secret_never_gets_the_token(live_emulator: Emulator) -> None:
    """Same client id, another secret: its own token request, refused as it should be."""
    environ = live_emulator.environ()
    _per_call(environ)
    wrong = {**environ, "SERVICE_CLIENT_SECRET": "not-the-secret"}
    with pytest.raises(TokenRequestError) as refused:
        _per_call(wrong)
    assert refused.value.error == "invalid_client"
    assert live_emulator.counters.token_requests == 2


@pytest.mark.parametrize(
    "other",
    [
        {"scope": "carriers:read"},
        {"token_params": {"audience": "reports"}},
        {"token_auth_method": "client_secret_basic"},
        {"refresh_margin": 30.0},
        {"share_tokens": False},
    ],
    ids=["scope", "token_params", "auth_method", "refresh_margin", "share_tokens=False"],
)
def test_transports_whose_token_requests_differ_get_their_own(
    live_emulator: Emulator, other: dict[str, Any]
) -> None:
    """Anything that changes the token request, or an opt-out, gives a token of its own."""
    environ = live_emulator.environ()
    _per_call(environ)
    _per_call(environ, **other)
    _per_call(environ)
    assert live_emulator.counters.token_requests == 2


@pytest.mark.parametrize("placed", ["on another origin", "behind one gateway"])
def test_one_api_refusing_the_tokens_fails_no_call_to_another(
    live_emulator: Emulator, placed: str
) -> None:
    """Two APIs behind one authorization server: tokens are shared per API (its path
    included), so one that refuses them (another environment's) neither drops nor pauses
    the other's token."""
    environ = live_emulator.environ()
    with (
        Emulator().run_in_thread() as other_api,
        running_gateway(
            {"/a/graphql": live_emulator.graphql_url, "/b/graphql": other_api.graphql_url}
        ) as gateway,
    ):
        here, elsewhere = live_emulator.graphql_url, other_api.graphql_url
        if placed == "behind one gateway":
            here, elsewhere = f"{gateway}/a/graphql", f"{gateway}/b/graphql"
        pausing = RetryPolicy()  # fresh tokens refused 3 times in a row: renewals pause
        for api in "abbbaab":
            if api == "a":
                _per_call(environ, url=here, retry=pausing)
            else:
                with pytest.raises(UnauthenticatedError):
                    _per_call(environ, url=elsewhere, retry=pausing)
    assert live_emulator.counters.graphql_requests == 3


def test_an_auth_object_keeps_each_apis_token_apart(live_emulator: Emulator) -> None:
    """One plain requests auth, two APIs (origins), one refusing every token: the other's
    requests all succeed, on one token."""
    environ = live_emulator.environ()
    auth = OAuth2RequestsAuth.from_env(environ, retry=NO_WAIT, sign_any_origin=True)
    with Emulator().run_in_thread() as other_api, requests.Session() as session:
        session.auth = auth
        statuses: dict[str, list[tuple[int, bool]]] = {"a": [], "b": []}
        for _ in range(3):
            for api, url in (("a", live_emulator.graphql_url), ("b", other_api.graphql_url)):
                answer = session.post(url, json={"query": "{ __typename }"})
                statuses[api].append((answer.status_code, "UNAUTHENTICATED" in answer.text))
        assert auth.token is None  # API b's, the last it signed for: refused, dropped
        session.post(live_emulator.graphql_url, json={"query": "{ __typename }"})
        assert auth.token is not None  # API a's
    assert statuses["a"] == [(200, False)] * 3
    assert all(refused for _, refused in statuses["b"])
    assert live_emulator.counters.graphql_requests == 4
    # API a's token, once; API b's, one after each of its refusals.
    refusals = other_api.counters.unauthenticated_responses
    assert live_emulator.counters.token_requests == 1 + refusals


def test_an_auth_object_on_many_paths_of_one_host_costs_one_token(
    live_emulator: Emulator,
) -> None:
    """Plain code that calls many resources of one host (REST) with one auth: one token."""
    environ = live_emulator.environ()
    with requests.Session() as session:
        session.auth = OAuth2RequestsAuth.from_env(environ, retry=NO_WAIT)
        for number in range(20):
            session.post(f"{live_emulator.base_url}/items/{number}", json={})
        session.post(live_emulator.graphql_url, json={"query": "{ __typename }"})
    assert live_emulator.counters.token_requests == 1
    assert live_emulator.counters.graphql_requests == 1


def test_requests_an_auth_object_refuses_to_sign_push_out_no_token(
    live_emulator: Emulator,
) -> None:
    """Plain http to hosts that are not loopback, refused before the auth keeps anything:
    however many, the token of the API it serves stays (its own, not shared here)."""
    environ = live_emulator.environ()
    auth = OAuth2RequestsAuth.from_env(
        environ, retry=NO_WAIT, share_tokens=False, sign_any_origin=True
    )
    with requests.Session() as session:
        session.auth = auth
        session.post(live_emulator.graphql_url, json={"query": "{ __typename }"})
        for number in range(20):
            with pytest.raises(ConfigurationError, match="refusing to send credentials"):
                session.post(f"http://api{number}.example.com/graphql", json={})
        session.post(live_emulator.graphql_url, json={"query": "{ __typename }"})
    assert live_emulator.counters.token_requests == 1
    assert live_emulator.counters.graphql_requests == 2


def test_an_empty_list_of_token_parameters_is_no_parameter(live_emulator: Emulator) -> None:
    """{"resource": []} sends what {} sends: one token between them."""
    environ = live_emulator.environ()
    _per_call(environ, token_params={"resource": []})
    _per_call(environ)
    assert live_emulator.counters.token_requests == 1


def test_token_parameters_that_are_no_text_are_refused(live_emulator: Emulator) -> None:
    """True and 1 would be sent as "True" and "1", a set in no order: refused, by name."""
    environ = live_emulator.environ()
    for value in (True, 1, {"x"}, {"x": "y"}, ["ok", 2]):
        with pytest.raises(ConfigurationError, match=r"token_params\['flag'\] must be a str"):
            OAuth2Transport.from_env(environ, token_params={"flag": value})
        with pytest.raises(ConfigurationError, match=r"token_params\['flag'\] must be a str"):
            OAuth2RequestsAuth.from_env(environ, token_params={"flag": value})


def test_a_clock_given_as_a_bound_method_still_shares(live_emulator: Emulator) -> None:
    """``clock=clocks.now`` is a new object at each access, and the same clock."""
    environ, clock = live_emulator.environ(), ManualClock()
    for _ in range(3):
        _per_call(environ, clock=clock.__call__)
    assert live_emulator.counters.token_requests == 1


def test_repeated_token_parameters_are_shared_too(live_emulator: Emulator) -> None:
    """A field sent more than once (RFC 8707 resources) is given as a list."""
    environ = live_emulator.environ()
    for _ in range(3):
        _per_call(environ, token_params={"resource": ["https://a.example", "https://b.example"]})
    assert live_emulator.counters.token_requests == 1


def test_a_clock_that_fails_later_breaks_no_other_transport(live_emulator: Emulator) -> None:
    """A test's clock torn down after use does not stop other transports being built."""
    environ, broken = live_emulator.environ(), threading.Event()

    def clock() -> float:
        if broken.is_set():
            raise RuntimeError("this clock is gone")
        return time.monotonic()

    _per_call(environ, clock=clock)
    broken.set()
    _per_call(environ)
    assert live_emulator.counters.token_requests == 2


def test_a_proxy_set_after_a_transport_is_built_carries_no_other_transports_secret(
    live_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests follows HTTP_PROXY, aiohttp does not by default: a proxy named after a
    requests transport was built never receives an aiohttp transport's token request, and
    both share the token the environment did not concern when they were built."""
    environ = live_emulator.environ()
    with running_proxy(tmp_path / "proxy") as proxy:
        requests_transport = OAuth2RequestsTransport.from_env(environ, retry=NO_WAIT)
        set_http_proxy(monkeypatch, proxy.url)
        _per_call(environ)
        with Client(transport=requests_transport) as session:
            session.execute(COUNT)
    assert via_proxy(live_emulator, "/oauth2/token") == [False]


def test_a_token_request_that_goes_elsewhere_is_not_shared(
    live_emulator: Emulator, tmp_path: Path
) -> None:
    """A transport whose token request goes through a proxy does not take the direct one's
    token, nor the other way round: where the request goes is part of what is shared."""
    environ = live_emulator.environ()
    with running_proxy(tmp_path / "proxy") as proxy:
        _per_call(environ)
        _per_call(environ, token_proxy=proxy.url)
        _per_call(environ, token_proxy=proxy.url)
    assert via_proxy(live_emulator, "/oauth2/token") == [False, True]


def _netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine {host} login netrc-user password netrc-password\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))


def test_a_netrc_entry_for_the_token_host_is_part_of_what_is_shared(
    live_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With trust_env, aiohttp sends the .netrc entry for the token host, a proxy given or
    not: a requests transport (trust_env on) does not take the token of an aiohttp one
    (off) through the same proxy; its own request carries the entry, which the server
    refuses beside the form's secret."""
    environ = live_emulator.environ()
    _netrc(tmp_path, monkeypatch, "127.0.0.1")
    with running_proxy(tmp_path / "proxy") as proxy:
        _per_call(environ, token_proxy=proxy.url)
        transport = OAuth2RequestsTransport.from_env(
            environ, retry=NO_WAIT, proxies={"http": proxy.url}
        )
        with (
            pytest.raises(TokenRequestError, match="invalid_request"),
            Client(transport=transport) as session,
        ):
            session.execute(COUNT)
    assert live_emulator.counters.token_requests == 2


def test_a_netrc_for_other_hosts_does_not_stop_sharing(
    live_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .netrc with no entry for the token host changes nothing aiohttp sends there."""
    environ = live_emulator.environ()
    _netrc(tmp_path, monkeypatch, "elsewhere.example")
    _per_call(environ)
    with Client(transport=OAuth2RequestsTransport.from_env(environ, retry=NO_WAIT)) as session:
        session.execute(COUNT)
    assert live_emulator.counters.token_requests == 1


def test_a_netrc_that_cannot_be_decoded_is_none_and_builds_a_transport(
    live_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .netrc of bytes no text encoding reads holds no entry: the transport is built and
    its token request goes directly; building one raised UnicodeDecodeError."""
    netrc = tmp_path / "netrc"
    netrc.write_bytes(b"\xff\xfe machine 127.0.0.1 login x password y\n")
    monkeypatch.setenv("NETRC", str(netrc))
    transport = OAuth2RequestsTransport.from_env(live_emulator.environ(), retry=NO_WAIT)
    with Client(transport=transport) as session:
        session.execute(COUNT)
    assert live_emulator.counters.token_requests == 1


def test_every_transport_sharing_a_token_hears_its_events_once(
    live_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Each transport's on_event hears the fetches it waited on; the log has each once."""
    environ = live_emulator.environ()
    first: list[AuthEvent] = []
    second: list[AuthEvent] = []
    live_emulator.fail_token_requests(1, 503)  # one retry: an event of the grant's own
    caplog.set_level(logging.DEBUG, logger="gql_service_auth")
    one = OAuth2Transport.from_env(environ, retry=NO_WAIT, on_event=first.append)
    two = OAuth2RequestsTransport.from_env(environ, retry=NO_WAIT, on_event=second.append)
    blocking_execute(one)
    with Client(transport=two) as session:
        session.execute(COUNT)
    expected = ["token_request_retry_scheduled", "token_fetched"]
    assert [event.name for event in first] == expected
    assert [event.name for event in second] == expected
    logged = [r.getMessage().split()[0] for r in caplog.records if r.name == "gql_service_auth"]
    assert logged == ["gql_service_auth." + name for name in expected]
    assert live_emulator.counters.token_requests == 2


def test_a_transport_that_is_gone_hears_nothing_and_is_not_kept(live_emulator: Emulator) -> None:
    """The shared token holds no transport: a dropped one is collected, its hook silent."""
    environ = live_emulator.environ()
    gone: list[AuthEvent] = []
    _per_call(environ, on_event=gone.append)
    collect_garbage()
    kept: list[AuthEvent] = []
    transport = OAuth2Transport.from_env(environ, retry=NO_WAIT, on_event=kept.append)
    live_emulator.revoke_tokens()
    blocking_execute(transport)
    assert [event.name for event in gone] == ["token_fetched"]
    assert "token_rejected" in [event.name for event in kept]


def test_the_process_keeps_no_more_than_a_bound_of_tokens(live_emulator: Emulator) -> None:
    """Transports of 200 sets of credentials come and go; what the process holds is bounded."""
    for number in range(200):
        OAuth2Transport(
            live_emulator.graphql_url,
            token_url=live_emulator.token_url,
            client_id=f"client-{number}",
            client_secret="secret",
        )
    collect_garbage()
    assert len(SHARED) <= 64


def test_a_forked_child_does_not_wait_on_the_parents_fetch(live_emulator: Emulator) -> None:
    """Forked while the parent's fetch hangs, the child fetches for itself, and shares that
    token between its own transports."""
    environ = live_emulator.environ()
    live_emulator.freeze_token_endpoint(3.0)
    parent = threading.Thread(target=_per_call, args=(environ,), daemon=True)
    parent.start()
    assert poll(lambda: live_emulator.counters.token_requests == 1)

    def child() -> None:
        for _ in range(3):
            _per_call(environ)

    code, how = in_child(child, timeout=20)
    assert (code, how) == (0, "ok")
    parent.join(timeout=20)
    # The parent's frozen fetch, and one of the child's for its three transports.
    assert live_emulator.counters.token_requests == 2
    assert live_emulator.counters.graphql_requests == 4


def test_a_forked_child_uses_the_token_it_inherited(live_emulator: Emulator) -> None:
    """A token is a value: a child built by fork (gunicorn --preload) uses the parent's."""
    environ = live_emulator.environ()
    _per_call(environ)
    code, how = in_child(lambda: _per_call(environ), timeout=20)
    assert (code, how) == (0, "ok")
    assert live_emulator.counters.token_requests == 1
    assert live_emulator.counters.graphql_requests == 2
