"""Redirects: a request the server answered with a redirect has run, and never goes again.

On every stack, through gql's client: a server on 127.0.0.1 answers each POST to its
``/graphql`` with a redirect (and counts it: it ran), and the request the redirect led to
asks the emulator with the token it carried, so a revoked token is refused there. A refusal
is re-sent only as the request that was refused (where the stack can send that one alone),
and only when it cannot have run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests
from gql import GraphQLRequest
from support import NO_WAIT, Redirector, bare_401s, running_redirector
from ways import EVERY_WAY, WAYS, Call, Way

from gql_service_auth import AuthEvent, UnauthenticatedError
from gql_service_auth import httpx as service_httpx
from gql_service_auth import requests as service_requests
from gql_service_auth.emulator import Emulator, ManualClock

RENAME = GraphQLRequest('mutation { renameCarrier(id: "carrier-001", name: "Renamed") { id } }')
COUNTED = {"carriers": {"totalCount": 25}}  # what the request the redirect led to answers
STATUSES = [301, 302, 303, 307, 308]
HOPS_ALONE = {way.name for way in WAYS}
"""The stacks whose signer sees each request of a redirect, and can send one alone."""


@pytest.fixture(params=EVERY_WAY, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=STATUSES, ids=str)
def redirector(emulator: Emulator, request: pytest.FixtureRequest) -> Iterator[Redirector]:
    with running_redirector(emulator.graphql_url, request.param) as running:
        yield running


@pytest.fixture(params=["unauthenticated", "bare 401"])
def refusal(emulator: Emulator, request: pytest.FixtureRequest) -> str:
    """How the emulator refuses a token: in the body, or as an HTTP 401 without one."""
    if request.param == "bare 401":
        bare_401s(emulator)
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def oauth2(
    emulator: Emulator, clock: ManualClock, events: list[AuthEvent], way: Way
) -> Callable[[str], Any]:
    def make(url: str) -> Any:
        client = emulator.recent_client
        # httpx follows no redirect unless told to; aiohttp and requests do by default.
        follow = {"follow_redirects": True} if way.name.startswith("httpx") else {}
        return way.oauth2(
            url,
            token_url=emulator.token_url,
            client_id=client.client_id,
            client_secret=client.client_secret,
            retry=NO_WAIT,
            clock=clock,
            on_event=events.append,
            max_renewals=3,
            **follow,
        )

    return make


def test_a_post_answered_with_a_redirect_runs_once_when_its_redirect_is_refused(
    way: Way,
    oauth2: Callable[[str], Any],
    emulator: Emulator,
    redirector: Redirector,
    refusal: str,
) -> None:
    """A refused answer after a redirect never sends the POST again (before: 4 times with
    max_renewals=3 on httpx and aiohttp); where the stack can, the refused request goes
    again alone, with a renewed token."""
    transport = oauth2(redirector.graphql_url)
    assert way.run(transport, [Call(RENAME)]) == [COUNTED]  # the token is accepted
    emulator.revoke_tokens()
    (outcome,) = way.run(transport, [Call(RENAME)])
    assert redirector.ran == 2  # once per call
    if way.name in HOPS_ALONE:
        assert outcome == COUNTED  # the refused request, sent again alone
        assert len(redirector.hops) == 1 + 2
    else:  # gql's aiohttp transport sends only the request it built: the POST
        assert isinstance(outcome, UnauthenticatedError), outcome
        assert "answered it with a redirect, so it ran" in str(outcome)
        assert len(redirector.hops) == 1 + 1
        # The refused token was dropped: the next call renews it.
        assert way.run(transport, [Call(RENAME)]) == [COUNTED]
        assert redirector.ran == 3
    assert emulator.counters.token_requests == 2


@pytest.mark.parametrize("status", [303, 307])
def test_a_redirect_whose_own_body_says_unauthenticated_refuses_nothing(
    way: Way, oauth2: Callable[[str], Any], emulator: Emulator, status: int
) -> None:
    """The redirect answered the POST, whatever its body says: the POST runs once, and the
    request it led to answers (before, on requests: the POST sent 4 times)."""
    refusal = {
        "data": None,
        "errors": [{"message": "no", "extensions": {"code": "UNAUTHENTICATED"}}],
    }
    with running_redirector(emulator.graphql_url, status, body=refusal) as redirector:
        assert way.run(oauth2(redirector.graphql_url), [Call(RENAME)]) == [COUNTED]
    assert redirector.ran == 1
    assert emulator.counters.token_requests == 1


@pytest.mark.parametrize("way", WAYS, ids=lambda way: way.name)  # those that send it alone
def test_the_request_a_redirect_led_to_keeps_its_method_when_sent_again(
    way: Way, oauth2: Callable[[str], Any], emulator: Emulator
) -> None:
    """307 keeps the POST: the refused POST the redirect led to is the one sent again."""
    with running_redirector(emulator.graphql_url, 307) as redirector:
        transport = oauth2(redirector.graphql_url)
        assert way.run(transport, [Call(RENAME)]) == [COUNTED]
        emulator.revoke_tokens()
        assert way.run(transport, [Call(RENAME)]) == [COUNTED]
    assert redirector.ran == 2
    assert redirector.hops == ["POST"] * 3  # the second refused, and sent again


@pytest.mark.parametrize("status", [303, 307])
def test_a_requests_session_never_sends_a_redirected_post_twice(
    emulator: Emulator, status: int
) -> None:
    """The auth object on a plain requests session follows the same rule."""
    with running_redirector(emulator.graphql_url, status) as redirector:
        auth = service_requests.OAuth2Auth.from_env(
            emulator.environ(), url=redirector.graphql_url, retry=NO_WAIT
        )
        with requests.Session() as session:
            session.auth = auth
            session.post(redirector.graphql_url, json=RENAME.payload)
            emulator.revoke_tokens()
            answer = session.post(redirector.graphql_url, json=RENAME.payload)
    assert answer.json() == {"data": COUNTED}
    assert redirector.ran == 2
    assert len(redirector.hops) == 3


@pytest.mark.parametrize("status", [303, 307])
def test_an_httpx_client_never_sends_a_redirected_post_twice(
    emulator: Emulator, status: int
) -> None:
    """The auth object on a plain httpx client follows the same rule."""
    with running_redirector(emulator.graphql_url, status) as redirector:
        auth = service_httpx.OAuth2Auth.from_env(
            emulator.environ(), url=redirector.graphql_url, retry=NO_WAIT
        )
        with httpx.Client(auth=auth, follow_redirects=True) as client:
            client.post(redirector.graphql_url, json=RENAME.payload)
            emulator.revoke_tokens()
            answer = client.post(redirector.graphql_url, json=RENAME.payload)
    assert answer.json() == {"data": COUNTED}
    assert redirector.ran == 2
    assert len(redirector.hops) == 3


@pytest.mark.parametrize("status", [303, 307])
async def test_an_async_httpx_client_never_sends_a_redirected_post_twice(
    emulator: Emulator, status: int
) -> None:
    """The auth object on a plain httpx AsyncClient follows the same rule."""
    with running_redirector(emulator.graphql_url, status) as redirector:
        auth = service_httpx.OAuth2Auth.from_env(
            emulator.environ(), url=redirector.graphql_url, retry=NO_WAIT
        )
        async with httpx.AsyncClient(auth=auth, follow_redirects=True) as client:
            await client.post(redirector.graphql_url, json=RENAME.payload)
            emulator.revoke_tokens()
            answer = await client.post(redirector.graphql_url, json=RENAME.payload)
    assert answer.json() == {"data": COUNTED}
    assert redirector.ran == 2
    assert len(redirector.hops) == 3
