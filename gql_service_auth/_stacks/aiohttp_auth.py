"""aiohttp client middlewares: the service's credentials on any aiohttp session.

An aiohttp client middleware (aiohttp 3.12 and later) is called with each request a
session sends, redirects included (each hop is a request of its own), and with the
handler that sends it: it may sign the request, read the answer, and call the handler
again. So the middlewares here are to aiohttp what the auth objects are to requests and
httpx: the OAuth2 one signs with a token, and when the decision core says so (see
:mod:`gql_service_auth._core.flow`) renews it and sends the same request again, driven by
:func:`~gql_service_auth._core.flow.drive_async`.

A body is sent again only when it is bytes (a JSON or text body): aiohttp rewinds some
other payloads, but an upload's files are the caller's, read once, and a re-send would
need them whole.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from ssl import SSLContext

from aiohttp import StreamReader, hdrs
from aiohttp.base_protocol import BaseProtocol
from aiohttp.client_middlewares import ClientHandlerType
from aiohttp.client_reqrep import ClientRequest, ClientResponse, Fingerprint
from aiohttp.payload import BytesPayload
from yarl import URL

from .._core.flow import (
    Accepted,
    NeedToken,
    Refused,
    Sent,
    drive_async,
    renewal_flow,
)
from .._core.ledger import NotNow
from .._core.redact import clear_locals, forgets_on_error
from .._core.refusal import Answer, RequestFacts
from .._core.rotation import CredentialsGiven
from .._core.token import AccessToken

# Imported for what it does: it registers how aiohttp errors are scrubbed.
from . import aiohttp_redact  # noqa: F401
from .auth_objects import ApiKeyAuthBase, OAuth2AuthBase
from .gql import first_of
from .http_auth import (
    NOT_REFUSED,
    ApiKeyRules,
    InsecureOrigins,
    OAuth2Rules,
    answer_of,
    check_proxy,
    facts_of,
    reads_body,
)
from .options import TokenOptions

# At run time: typing.get_type_hints() of the constructors resolves Unpack.
if sys.version_info >= (3, 11):
    from typing import Self, Unpack
else:
    from typing_extensions import Self, Unpack

__all__ = ["ApiKeyMiddleware", "OAuth2Middleware", "OAuth2MiddlewareOptions"]


class OAuth2MiddlewareOptions(TokenOptions, total=False):
    """The optional keywords of :class:`OAuth2Middleware`, for ``from_env``: the token's
    (:class:`~gql_service_auth.TokenOptions`) and the middleware's own."""

    ssl: SSLContext | bool | Fingerprint
    sign_any_origin: bool


class ApiKeyMiddleware(ApiKeyAuthBase):
    """An aiohttp client middleware that sends the service's API key.

    ``aiohttp.ClientSession(middlewares=(ApiKeyMiddleware(client_id, client_secret,
    url=api_url),))``, or ``middlewares=`` per request; requests to other hosts go out
    untouched. The arguments and rules are those of
    :class:`~gql_service_auth._stacks.auth_objects.ApiKeyAuthBase`; a plain-http request
    through a proxy on another host is refused too, as the session's proxy is seen here.
    """

    @forgets_on_error
    def __init__(
        self,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        credentials: CredentialsGiven | None = None,
        url: str | URL | None = None,
        sign_any_origin: bool = False,
        allow_insecure_http: bool = False,
    ) -> None:
        super().__init__(
            client_id,
            client_secret,
            credentials=credentials,
            url=url,
            sign_any_origin=sign_any_origin,
            allow_insecure_http=allow_insecure_http,
        )
        # The request's own proxy is checked (see _check_origin), not the environment's.
        self._rules = ApiKeyRules(
            self._rules.credentials, self._rules.origins.without_environment()
        )

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        url = request.url
        # Else the caller's own (an auth= or header), or another service's: untouched.
        if hdrs.AUTHORIZATION in request.headers or not self._signs(
            url.scheme, url.raw_host, url.port
        ):
            return await handler(request)
        try:
            _check_origin(self._rules.origins, request)
            return await _send(request, handler, self._rules.authorization)
        except BaseException as exc:
            clear_locals(exc)  # the frames below hold the header (see OAuth2Middleware)
            raise


class OAuth2Middleware(OAuth2AuthBase):
    """An aiohttp client middleware that sends OAuth 2.0 client-credentials tokens,
    renewed as needed.

    ``aiohttp.ClientSession(middlewares=(OAuth2Middleware(token_url, client_id,
    client_secret, url=api_url),))``; requests to other hosts go out untouched. One
    middleware may serve any number of sessions and event loops: they share its token and
    its fetches. A request refused to the end comes back as the service answered it. The
    arguments and rules are those of
    :class:`~gql_service_auth._stacks.auth_objects.OAuth2AuthBase`, but for TLS: ``ssl``
    (aiohttp's: ``True``, ``False``, an ``ssl.SSLContext`` or a ``Fingerprint``) is how
    the token endpoint is verified. The token request goes through aiohttp with its
    defaults: no proxy from the environment unless ``token_session_args`` says
    ``{"trust_env": True}``, as a session of your own would.
    """

    @forgets_on_error
    def __init__(
        self,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        url: str | URL | None = None,
        sign_any_origin: bool = False,
        ssl: SSLContext | bool | Fingerprint = True,
        **options: Unpack[TokenOptions],
    ) -> None:
        self._setup(
            token_url,
            client_id,
            client_secret,
            url,
            sign_any_origin,
            options,
            ssl=ssl,
            verify=None,
            inherited=None,
            inherited_from="the session's",
        )
        # The request's own proxy is checked (see _check_origin), not the environment's.
        per_api = self._per_api
        assert per_api is not None
        origins = per_api.settings.origins.without_environment()
        per_api.settings = replace(per_api.settings, origins=origins)

    @classmethod
    @forgets_on_error
    def from_env(  # type: ignore[override]
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        token_url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[OAuth2MiddlewareOptions],
    ) -> Self:
        """Build the middleware from the ``SERVICE_*`` environment variables, as
        :meth:`OAuth2Transport.from_env <gql_service_auth.OAuth2Transport.from_env>` does
        (``SERVICE_BASE_URL`` is not read with ``sign_any_origin=True``).

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls._from_env(
            environ,
            dict(kwargs),
            url,
            token_url,
            client_id,
            client_secret,
        )

    def _clear(self, rules: OAuth2Rules, scheme: str, host: str | None) -> None:
        """Nothing here: each request's own proxy is checked as it goes (``_check_origin``)."""

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        headers = request.headers
        url = request.url
        # raw_host: the name as it goes on the wire (punycode), as the service's URL is
        # compared (see ServiceOrigin).
        rules = (
            None
            if hdrs.AUTHORIZATION in headers
            else self._of_origin(url.scheme, url.raw_host, url.port, url)
        )
        if rules is None:
            # The caller's own (neither replaced nor re-sent), or another service's (no
            # token is fetched for it).
            return await handler(request)
        # The fast path, inline: each coroutine a request goes through is resumed at each
        # of its waits, and the answer of almost every request refuses nothing.
        try:
            _check_origin(rules.origins, request)
            replayable = _replayable(request)
            # A body sent once asks for a token that will outlive its send.
            min_ttl = 0.0 if replayable else rules.refresh_margin
            tokens = rules.tokens
            token = tokens.fresh(min_ttl) or first_of(await tokens.get(min_ttl=min_ttl), tokens)
            headers[hdrs.AUTHORIZATION] = token.authorization
            try:
                response = await handler(request)
            finally:
                # See _send: no credential stays in the response's request_info.
                headers.popall(hdrs.AUTHORIZATION, None)
            status = response.status
            if _reads(status, response.headers.get(hdrs.CONTENT_TYPE)):
                answer = answer_of(status, await _read(response))
            else:
                answer = answer_of(status, None)
            if answer is None:
                tokens.confirm(token)
                return response
            return await _renewed(
                rules, request, handler, replayable, min_ttl, token, answer, response
            )
        except BaseException as exc:
            # The frames below hold the request with its header, and answers that may
            # quote the token: a crash reporter would show them.
            clear_locals(exc)
            raise


async def _renewed(
    rules: OAuth2Rules,
    request: ClientRequest,
    handler: ClientHandlerType,
    replayable: bool,
    min_ttl: float,
    token: AccessToken,
    answer: Answer,
    response: ClientResponse,
) -> ClientResponse:
    """After a refusal: renew and re-send, within bounds, as the decision core says."""
    tokens = rules.tokens
    last = [response]

    async def send(renewed: AccessToken) -> Sent[ClientResponse]:
        # The refused answer goes no further: its connection goes back, or is closed if
        # its body (a stream's) was not read, before the request goes again.
        last[0].release()
        again = last[0] = await _send(request, handler, renewed.authorization)
        return Sent(await _answer(again) or NOT_REFUSED, again)

    async def get_token(need: NeedToken) -> AccessToken | NotNow:
        return await tokens.get(min_ttl=need.min_ttl, after=need.newer_than)

    flow = renewal_flow(
        _facts(request, replayable),
        tokens,
        max_renewals=rules.max_renewals,
        min_ttl=min_ttl,
        emit=rules.emit,
        first=(token, Sent(answer, response)),
    )
    outcome = await drive_async(
        flow, get_token=get_token, send=send, sleep=tokens.waits(asyncio.sleep)
    )
    if isinstance(outcome, Refused):
        return outcome.last.raw
    # Paused only comes of a flow that starts with no send.
    assert isinstance(outcome, Accepted)
    return outcome.raw


def _check_origin(origins: InsecureOrigins, request: ClientRequest) -> None:
    """Refuse credentials over plain http to a host that is not loopback, or through a
    proxy (the session's, or the environment's with ``trust_env``) on another machine."""
    url = request.url
    origins.check(url.scheme, url.host or "")
    proxy = request.proxy
    if proxy is not None:
        check_proxy(url, str(proxy), "the session's proxy", origins.allowed)


async def _send(
    request: ClientRequest, handler: ClientHandlerType, authorization: str
) -> ClientResponse:
    """Send ``request`` with ``authorization``, taken out again once it is sent."""
    request.headers[hdrs.AUTHORIZATION] = authorization
    try:
        return await handler(request)
    finally:
        # The response's request_info is a live view of these headers: the errors built
        # from it (raise_for_status's, the caller's own) then quote no credential.
        request.headers.popall(hdrs.AUTHORIZATION, None)


async def _answer(response: ClientResponse) -> Answer | None:
    """What ``response`` says of the token: ``None`` when it refuses nothing."""
    status = response.status
    if _reads(status, response.headers.get(hdrs.CONTENT_TYPE)):
        return answer_of(status, await _read(response))
    return answer_of(status, None)


async def _read(response: ClientResponse) -> bytes:
    """``response``'s body, read, and left for the caller to read again in any way.

    aiohttp keeps a body it has read for ``read()``, ``text()`` and ``json()``, but its
    ``content`` stream is then spent: a new one is given the body, so code that reads
    ``content`` (``iter_chunked``, a streaming JSON parser) sees it whole.
    """
    body = await response.read()
    loop = asyncio.get_running_loop()
    # A protocol of its own, with no transport: the stream holds the whole body, so its
    # calls to resume reading reach nothing (the connection went back to the pool).
    stream = StreamReader(BaseProtocol(loop), _STREAM_LIMIT, loop=loop)
    if body:
        stream.feed_data(body)
    stream.feed_eof()
    response.content = stream
    return body


_STREAM_LIMIT = 2**16
"""aiohttp's own read buffer limit for a response."""


def _reads(status: int, content_type: str | None) -> bool:
    """Whether an answer's body is read for a refusal: a JSON one (a GraphQL answer), or
    a 401's, unless it is a stream; one without a content type too.

    Only those: aiohttp keeps a body it has read for ``read()``, ``text()`` and
    ``json()``, but its ``content`` stream is then empty, and a download of another type
    would be held until its end. A redirect refuses nothing.
    """
    if 300 <= status < 400:
        return False
    if content_type is None:
        return True
    if not reads_body(content_type):
        return False  # a stream
    if status == 401:
        return True
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _replayable(request: ClientRequest) -> bool:
    """Whether ``request``'s body can be sent twice, whole: none, or bytes."""
    body = request.body
    return body == b"" or isinstance(body, BytesPayload)


def _facts(request: ClientRequest, replayable: bool) -> RequestFacts:
    """The request's facts, from the bytes it sent (an upload's are not read: it is never
    sent twice, and a body not read counts as a mutation)."""
    body = request.body
    if isinstance(body, BytesPayload):
        return facts_of(body.decode(errors="replace"), replayable=replayable)
    return facts_of(None, replayable=replayable)
