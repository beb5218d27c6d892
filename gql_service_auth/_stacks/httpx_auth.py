"""httpx auth objects: the service's credentials on any httpx (or httpx2) client.

gql imports httpx2 when it is installed, else httpx, and httpx2 refuses an auth that is
not its own ``Auth`` (``TypeError: Invalid "auth" argument``): these classes subclass
gql's library's ``Auth``, and the other's too once the public names are first used
(:func:`fit_every_library`), so they fit either client. They read requests and
responses by the attributes both share.

Both flows are overridden, as httpx's docs ask of auths that do I/O: the synchronous one
blocks on the token manager; the asynchronous one awaits it on asyncio, and under any
other event loop (trio) waits on a worker thread, so no asyncio call is made there. A
flow yields the same request again after a refusal, which httpx sends with the body it
built: bytes, or a multipart stream whose file parts httpx seeks back to their start.
A file part that cannot seek would go out empty the second time, so such a request is
never re-sent.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._core.flow import NeedToken, Refused, Send, Sent, renewal_flow
from .._core.ledger import NotNow
from .._core.redact import REDACTED, SENSITIVE_HEADERS, register
from .._core.refusal import Answer, RequestFacts
from .._core.token import AccessToken
from .auth_objects import ApiKeyAuthBase, OAuth2AuthBase
from .gql import detached_401, first_of, first_token_blocking
from .http_auth import (
    NOT_REFUSED,
    STREAM_TYPES,
    OAuth2Rules,
    answer_of,
    facts_of,
    tell_refused,
    tell_sent,
)

try:
    # The library gql's transports use: httpx2 when it is installed, else httpx.
    from gql.transport.httpx import httpx as _gql_httpx  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "gql_service_auth.httpx needs the httpx extra: pip install 'gql-service-auth[httpx]'"
    ) from exc

# The httpx libraries whose clients the auth objects fit: gql's at import, and the other
# one (httpx beside httpx2) once fit_every_library() has run. Importing both at import
# cost 18-22 ms of a transport user's import (httpx, and the command line's click and
# pygments it loads where they are installed) for clients a transport never builds.
_MODULES: list[Any] = [_gql_httpx]
_JOINING = threading.Lock()

if TYPE_CHECKING:
    from httpx import Auth as _Auth
    from httpx import Request, Response
else:
    _Auth = type("Auth", (_gql_httpx.Auth,), {})

_BYTE_STREAMS: tuple[type, ...] = (_gql_httpx.ByteStream,)
_SYNC_STREAMS: tuple[type, ...] = (_gql_httpx.SyncByteStream,)
_ERRORS: tuple[type[BaseException], ...] = (_gql_httpx.HTTPError,)


def fit_every_library() -> None:
    """Make the auth classes fit the clients of every installed httpx library (httpx and
    httpx2), importing the one gql did not. Runs when the public auth classes are first
    named (``gql_service_auth.httpx.OAuth2Auth``): their users build their own clients,
    of either library. httpx's clients take an ``auth`` only if it is an instance of the
    library's own ``Auth``; the other library's joins the shared base's bases, so one
    class, its instances made before included, fits both."""
    global _BYTE_STREAMS, _SYNC_STREAMS, _ERRORS
    other = "httpx" if _gql_httpx.__name__ == "httpx2" else "httpx2"
    try:
        module = importlib.import_module(other)
    except ImportError:
        return
    with _JOINING:
        if module in _MODULES:
            return
        _MODULES.append(module)
        _BYTE_STREAMS = tuple(m.ByteStream for m in _MODULES)
        _SYNC_STREAMS = tuple(m.SyncByteStream for m in _MODULES)
        _ERRORS = tuple(m.HTTPError for m in _MODULES)
        _Auth.__bases__ = tuple(m.Auth for m in _MODULES)


class ApiKeyAuth(ApiKeyAuthBase, _Auth):
    """An httpx auth that sends the service's API key.

    ``httpx.Client(auth=ApiKeyAuth(client_id, client_secret, url=api_url))``; it fits
    httpx2 clients too. Requests to other hosts go out untouched. The arguments and rules
    are those of :class:`~gql_service_auth._stacks.auth_objects.ApiKeyAuthBase`.
    """

    def auth_flow(self, request: Request) -> Generator[Request, Response, None]:
        url = request.url
        # The caller's own (a transport's auth is not given those: see _own_client), or
        # another service's, goes untouched.
        if (self._own_client or _signable(request)) and self._signs(
            url.scheme, url.host, url.port
        ):
            self._rules.origins.check(url.scheme, url.host)
            request.headers["Authorization"] = self._rules.authorization
        yield request


class OAuth2Auth(OAuth2AuthBase, _Auth):
    """An httpx auth that sends OAuth 2.0 client-credentials tokens, renewed as needed.

    ``httpx.Client(auth=OAuth2Auth(token_url, client_id, client_secret, url=api_url))``
    (requests to other hosts go out untouched), or an
    ``AsyncClient`` (asyncio or trio); it fits httpx2 clients too. One auth object may
    serve any number of clients, threads and event loops: they share its token and its
    fetches. The arguments and rules are those of
    :class:`~gql_service_auth._stacks.auth_objects.OAuth2AuthBase`.
    """

    def sync_auth_flow(self, request: Request) -> Generator[Request, Response, None]:
        rules = self._to_sign(request)
        if rules is None:
            yield request  # the caller's own, or another service's: untouched
            return
        # The first send, inline: almost every request is accepted at once.
        replayable = isinstance(request.stream, _BYTE_STREAMS) or _replayable(request)
        min_ttl = 0.0 if replayable else rules.refresh_margin
        token = rules.tokens.fresh(min_ttl) or first_token_blocking(rules.tokens, min_ttl)
        request.headers["Authorization"] = token.authorization
        tell_sent(token, rules)
        # A transport's gql call (marked, see GQL_CALL) is read whatever its content type,
        # as gql reads it next and the aiohttp transports read theirs; any other answer by
        # its content type (_body): a stream, even one opened with the transport's client
        # while a call runs, is the caller's to read.
        whole = GQL_CALL in request.extensions
        response = yield request
        # Without a redirect, httpx answers the very request signed (see _ours).
        if response.request is not request and not _ours(response, request, token):
            return
        body = response.read() if whole or _body(response) else None
        answer = answer_of(response.status_code, body)
        if answer is None:
            rules.tokens.confirm(token)
            return
        request, replayable = _refused(response, request, replayable)
        flow = _flow(rules, request, replayable, min_ttl, token, _sent(answer, response))
        reply: object = None
        while True:
            try:
                command = flow.send(reply)
            except StopIteration as done:
                _told(done.value, rules)
                return
            if isinstance(command, Send):
                _sign(request, command.token, rules)
                response = yield request
                reads = _reads(response, request, command.token, whole)
                body = response.read() if reads else None
                reply = _reply(response, request, command.token, body)
            elif isinstance(command, NeedToken):
                reply = rules.tokens.get_blocking(
                    min_ttl=command.min_ttl, after=command.newer_than
                )
            else:
                rules.tokens.waits(time.sleep)(command.seconds)
                reply = None

    async def async_auth_flow(self, request: Request) -> AsyncGenerator[Request, Response]:
        rules = self._to_sign(request)
        if rules is None:
            yield request  # the caller's own, or another service's: untouched
            return
        # The first send, inline, as in sync_auth_flow.
        replayable = isinstance(request.stream, _BYTE_STREAMS) or _replayable(request)
        min_ttl = 0.0 if replayable else rules.refresh_margin
        token = rules.tokens.fresh(min_ttl) or await _first_token(rules, min_ttl)
        request.headers["Authorization"] = token.authorization
        tell_sent(token, rules)
        whole = GQL_CALL in request.extensions  # as in sync_auth_flow
        response = yield request
        if response.request is not request and not _ours(response, request, token):
            return
        body = await response.aread() if whole or _body(response) else None
        answer = answer_of(response.status_code, body)
        if answer is None:
            rules.tokens.confirm(token)
            return
        request, replayable = _refused(response, request, replayable)
        flow = _flow(rules, request, replayable, min_ttl, token, _sent(answer, response))
        reply: object = None
        while True:
            try:
                command = flow.send(reply)
            except StopIteration as done:
                _told(done.value, rules)
                return
            if isinstance(command, Send):
                _sign(request, command.token, rules)
                response = yield request
                reads = _reads(response, request, command.token, whole)
                body = await response.aread() if reads else None
                reply = _reply(response, request, command.token, body)
            elif isinstance(command, NeedToken):
                reply = await _get(rules, command.min_ttl, command.newer_than)
            else:
                await rules.tokens.waits(anyio.sleep)(command.seconds)
                reply = None

    def _to_sign(self, request: Request) -> OAuth2Rules | None:
        """The rules to sign ``request`` with: ``None`` for one to another service, or one
        with the caller's own ``Authorization`` (never replaced nor re-sent). A transport's
        own auth signs what its client sends (see ``_own_client``)."""
        url = request.url
        if self._own_client:
            return self._of_origin(url.scheme, url.host, url.port, url)
        if not _signable(request):
            return None
        rules = self._of_origin(url.scheme, url.host, url.port, url)
        if rules is not None:
            request.extensions[_SIGNED] = True
        return rules


GQL_CALL = "gql_service_auth.gql_call"
"""The mark, in a request's ``extensions``, of a transport's own gql call (its transport
sets it through ``extra_args``): gql reads its answer whole next, whatever its content
type, so the auth reads it for a refusal too. httpx hands ``extensions`` to its transport,
whose httpcore reads only the keys it knows."""

_SIGNED = "gql_service_auth.signed"
"""The mark of a request a plain client's OAuth2 auth signed, in its ``extensions`` (which
httpx hands its transport, whose httpcore reads only the keys it knows): a request sent
again, by ``client.send(request)``, is signed again with the token of the day, not taken
for the caller's own ``Authorization`` and sent with the token it had. (An API key's
header is the same at every send.)"""


def _signable(request: Request) -> bool:
    """Whether ``request`` carries no ``Authorization`` of the caller's own."""
    return not _has_authorization(request) or bool(request.extensions.get(_SIGNED))


def _has_authorization(request: Request) -> bool:
    """Whether ``request`` carries an ``Authorization`` header.

    Read from the raw headers: ``in`` would decode every header to find the encoding of
    the name, and raise and catch a ``KeyError`` when it is absent (every request): work
    that gql's own transport does not do.
    """
    return any(name.lower() == b"authorization" for name, _ in request.headers.raw)


def _sign(request: Request, token: AccessToken, rules: OAuth2Rules) -> None:
    request.headers["Authorization"] = token.authorization
    tell_sent(token, rules)


def _ours(response: Response, request: Request, token: AccessToken) -> bool:
    """Whether ``response`` answers a request sent with ``token``: after a redirect to
    another origin, httpx sent it without, and its answer says nothing of the token."""
    sent = response.request
    # Without a redirect, httpx answers the very request signed: no header to look up.
    return sent is request or bool(sent.headers.get("Authorization") == token.authorization)


def _refused(response: Response, request: Request, replayable: bool) -> tuple[Request, bool]:
    """The request a refusal answers, and whether its body can be sent twice.

    After a redirect, httpx's answer is that of the request the redirect led to: the
    request sent was answered with the redirect, so it ran and never goes again (rule 5 of
    :mod:`gql_service_auth._core.refusal`). The refused one is judged, and re-sent, alone.
    """
    refused = response.request
    if refused is request:
        return request, replayable
    return refused, _replayable(refused)


def _reply(
    response: Response, request: Request, token: AccessToken, body: bytes | None
) -> Sent[Response]:
    """A re-send's answer for the flow. One from another origin (a redirect httpx followed
    without our header) refuses nothing of ``token``; one that came back through another
    redirect answers another request, and ends the flow if it refuses (rule 5)."""
    if not _ours(response, request, token):
        return Sent(NOT_REFUSED, response)
    answer = answer_of(response.status_code, body) or NOT_REFUSED
    if answer.refused and response.request is not request:
        answer = replace(answer, redirected=True)
    return _sent(answer, response)


def _sent(answer: Answer, response: Response) -> Sent[Response]:
    return Sent(answer, response, detached_401(answer, response.raise_for_status))


def _reads(response: Response, request: Request, token: AccessToken, whole: bool) -> bool:
    """Whether a re-send's answer is read for a refusal (``whole``: whatever its content
    type, see the flows): one that came back from another origin (a redirect) refuses
    nothing of ``token``, which it was sent without."""
    return _ours(response, request, token) and (whole or _body(response))


def _body(response: Response) -> bool:
    """Whether ``response``'s body is read for a refusal (a stream's is not, even on a
    transport's client: ``transport.client.stream()`` is the caller's to read)."""
    # From the raw headers, as in _has_authorization: .get() decodes every header first.
    for name, value in response.headers.raw:
        if name.lower() == b"content-type":
            return not value.partition(b";")[0].strip().lower().startswith(_STREAM_TYPES)
    return True


_STREAM_TYPES = tuple(kind.encode() for kind in STREAM_TYPES)


def _flow(
    rules: OAuth2Rules,
    request: Request,
    replayable: bool,
    min_ttl: float,
    token: AccessToken,
    first: Sent[Response],
) -> Generator[Any, object, Any]:
    return renewal_flow(
        _facts(request, replayable),
        rules.tokens,
        max_renewals=rules.max_renewals,
        min_ttl=min_ttl,
        emit=rules.emit,
        first=(token, first),
    )


def _told(outcome: object, rules: OAuth2Rules) -> None:
    """Hand a refused outcome to gql's transport; the response goes back as it came."""
    if isinstance(outcome, Refused):
        tell_refused(outcome, rules)


async def _get(rules: OAuth2Rules, min_ttl: float, after: int) -> AccessToken | NotNow:
    """A token, awaited: on asyncio by the manager's own wait, elsewhere (trio) on a
    worker thread, abandoned if the caller is cancelled (the fetch goes on for others)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        get = partial(rules.tokens.get_blocking, min_ttl=min_ttl, after=after)
        # A limiter of its own: a wait holds its thread until the fetch ends (bounded by
        # the retry policy), and must not take the worker threads the application's own
        # to_thread calls share (40 by default).
        own = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(get, abandon_on_cancel=True, limiter=own)
    return await rules.tokens.get(min_ttl=min_ttl, after=after)


async def _first_token(rules: OAuth2Rules, min_ttl: float) -> AccessToken:
    return first_of(await _get(rules, min_ttl, 0), rules.tokens)


def _replayable(request: Request) -> bool:
    """Whether httpx can send ``request``'s body twice, whole: bytes, or multipart whose
    file parts are bytes or seekable files (httpx seeks each back before it sends)."""
    stream = request.stream
    if isinstance(stream, _BYTE_STREAMS):
        return True
    fields = getattr(stream, "fields", None)
    if fields is None:
        return False
    for part in fields:
        file = getattr(part, "file", None)
        if file is None or isinstance(file, bytes | str):
            continue
        seekable = getattr(file, "seekable", None)
        if seekable is None or not seekable():
            return False
    return True


def _facts(request: Request, replayable: bool) -> RequestFacts:
    """The request's facts, from the JSON it sent or a multipart's ``operations`` part."""
    stream = request.stream
    if isinstance(stream, _BYTE_STREAMS):
        # read(): a request httpx built for a redirect holds the stream, not the content.
        return facts_of(request.read(), replayable=replayable)
    for part in getattr(stream, "fields", ()):
        if getattr(part, "name", None) == "operations" and not hasattr(part, "file"):
            return facts_of(getattr(part, "value", None), replayable=replayable)
    return facts_of(None, replayable=replayable)


class _HttpxRecords:
    """httpx's errors keep the request (with its headers), and the response with its own
    request, the one a redirect not followed would send, and the responses before it
    (``history``: redirects, refusals answered again)."""

    def passwords(self, link: BaseException) -> list[str]:
        return []

    def scrub(self, link: BaseException) -> None:
        if isinstance(link, _ERRORS):
            self._blank(getattr(link, "_request", None))

    def responses(self, link: BaseException) -> list[Response]:
        response = getattr(link, "response", None) if isinstance(link, _ERRORS) else None
        return [] if response is None else [response]

    def history(self, response: Response) -> list[Response]:
        return response.history

    def blank_requests(self, response: Response) -> None:
        self._blank(getattr(response, "_request", None))
        self._blank(response.next_request)

    @staticmethod
    def _blank(request: Request | None) -> None:
        if request is not None:
            for name in SENSITIVE_HEADERS:
                if name in request.headers:
                    request.headers[name] = REDACTED

    def headers(self, response: Response) -> list[tuple[str, str]]:
        return response.headers.multi_items()

    def replace_headers(self, response: Response, headers: list[tuple[str, str]]) -> None:
        encoding = response.headers.encoding  # the one the received bytes were read with
        response.headers = type(response.headers)(headers, encoding=encoding)

    def body(self, response: Response) -> bytes | None:
        return response.content if hasattr(response, "_content") else None

    def replace_body(self, response: Response, body: bytes) -> None:
        unread = not hasattr(response, "_content")
        response._content = body
        response.__dict__.pop("_text", None)  # decoded from the body it had
        if unread:
            # A stream: no read, nor iter_raw(), takes its bytes off the wire any more. A
            # sync one is closed here; an async one cannot be without awaiting, and is
            # left to its owner's aclose().
            response.is_stream_consumed = True
            if isinstance(response.stream, _SYNC_STREAMS):
                response.close()


# Pickled, they are found where users import them from, which makes them fit both
# libraries in the process that loads them (see gql_service_auth/httpx.py).
ApiKeyAuth.__module__ = OAuth2Auth.__module__ = "gql_service_auth.httpx"

register(
    _HttpxRecords(),
    modules=("httpx", "httpcore", "httpx2", "httpcore2", "h11", "h2", "anyio", "sniffio"),
)
