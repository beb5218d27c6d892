"""The aiohttp OAuth2 transport past its fast path: the core's renew-and-resend flow.

``OAuth2Transport.execute`` sends a request once, inline, with a cached token: almost
every request ends there. When no token can be sent at once, when that first answer
refuses the token, and for every batch, the request goes through
:func:`~gql_service_auth._core.flow.renewal_flow`, whose sends are gql's own steps
(:meth:`~gql_service_auth._stacks.aiohttp.AuthenticatingTransport._send_once`), and whose
outcome becomes the answer or the package's error (:func:`~gql_service_auth._stacks.gql.settled`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from gql.graphql_request import GraphQLRequest
from graphql import ExecutionResult

from .._core.events import Emitter
from .._core.flow import NeedToken, Sent, drive_async, renewal_flow
from .._core.ledger import NotNow
from .._core.refusal import RequestFacts
from .._core.token import AccessToken
from .._core.tokens import TokenManager
from .aiohttp import AuthenticatingTransport
from .gql import Bare401, Snapshot, is_query, rebuild, sent, sent_batch, settled, snapshot

_T = TypeVar("_T")


def bearer_header(token: AccessToken) -> str:
    """The ``Authorization`` header of ``token`` (see ``AuthenticatingTransport._post``)."""
    return token.authorization


class RenewingTransport(AuthenticatingTransport):
    """What ``OAuth2Transport`` does past its fast path (see the module)."""

    _tokens: TokenManager
    _max_renewals: int
    _refresh_margin: float
    _emit: Emitter
    _method = "oauth2"

    def _secrets(self, token: AccessToken) -> list[str]:
        """What an answer sent with ``token`` may quote: the client secret and the token."""
        return [self._credentials.client_secret, token.value]

    async def _renewing(
        self,
        taken: Snapshot,
        extra_args: dict[str, Any] | None,
        upload_files: bool,
        min_ttl: float,
        first: tuple[AccessToken, Sent[ExecutionResult | Bare401]] | None,
    ) -> ExecutionResult:
        """``execute`` past its fast path: no usable token, or the first send refused."""
        payload = rebuild(taken)

        async def send(token: AccessToken) -> Sent[ExecutionResult | Bare401]:
            answer, redirected = await self._send_once(
                payload,
                extra_args,
                upload_files,
                token,
                bearer_header,
                self._prepare_result,
                self._secrets(token),
            )
            return sent(answer, redirected=redirected)

        facts = RequestFacts(query=is_query(taken), replayable=not upload_files)
        return await self._renewed(facts, send, min_ttl, first)

    async def _batch_renewed(
        self, reqs: list[GraphQLRequest], extra_args: dict[str, Any] | None
    ) -> list[ExecutionResult]:
        """``execute_batch`` of a batch sent with the transport's tokens: always through the
        flow, sent again only when no operation of it can have run."""
        payload = [rebuild(snapshot(req)) for req in reqs]
        read = partial(self._prepare_batch_result, payload)

        async def send(token: AccessToken) -> Sent[list[ExecutionResult] | Bare401]:
            answer, redirected = await self._send_once(
                payload, extra_args, False, token, bearer_header, read, self._secrets(token)
            )
            return sent_batch(answer, redirected=redirected)

        return await self._renewed(RequestFacts(batch=True), send, 0.0, None)

    async def _renewed(
        self,
        facts: RequestFacts,
        send: Callable[[AccessToken], Awaitable[Sent[_T | Bare401]]],
        min_ttl: float,
        first: tuple[AccessToken, Sent[_T | Bare401]] | None,
    ) -> _T:
        """The answer of the renew-and-resend flow (see :mod:`gql_service_auth._core.flow`)."""
        flow = renewal_flow(
            facts,
            self._tokens,
            max_renewals=self._max_renewals,
            min_ttl=min_ttl,
            emit=self._emit,
            first=first,
        )
        sleep = self._tokens.waits(asyncio.sleep)
        outcome = await drive_async(flow, get_token=self._get, send=send, sleep=sleep)
        return settled(outcome, self._tokens.refusal_answer, self._secrets)

    def _get(self, need: NeedToken) -> Awaitable[AccessToken | NotNow]:
        return self._tokens.get(min_ttl=need.min_ttl, after=need.newer_than)
