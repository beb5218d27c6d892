"""requests auth objects: the service's credentials on any requests session.

``OAuth2Auth`` signs a request in ``__call__`` and registers a response hook, the way
requests' own ``HTTPDigestAuth`` answers a 401: the hook reads the answer, and when the
decision core says so (see :mod:`gql_service_auth._core.flow`), renews the token and re-sends
a copy of the request through the same adapter. A body is sent again only when requests
can rewind it (bytes, text, or a file whose position it recorded): gql's upload body, a
``MultipartEncoder``, cannot be, and a re-send would declare its full length and send
nothing, hanging until the read timeout.
"""

from __future__ import annotations

import time
from functools import partial
from http.client import HTTPMessage
from typing import Any
from urllib.parse import SplitResult, urlsplit

from requests.auth import AuthBase
from requests.cookies import extract_cookies_to_jar
from requests.exceptions import RequestException
from requests.models import PreparedRequest, Response
from requests.structures import CaseInsensitiveDict
from requests.utils import rewind_body

from .._core.flow import Accepted, NeedToken, Refused, Sent, drive_sync, renewal_flow
from .._core.ledger import NotNow
from .._core.redact import REDACTED, SENSITIVE_HEADERS, register
from .._core.refusal import Answer
from .._core.token import AccessToken
from .auth_objects import ApiKeyAuthBase, OAuth2AuthBase
from .gql import detached_401, first_token_blocking
from .http_auth import (
    NOT_REFUSED,
    InsecureOrigins,
    OAuth2Rules,
    answer_of,
    facts_of,
    reads_body,
    tell_refused,
    tell_sent,
)


def _service_url(auth: ApiKeyAuthBase | OAuth2AuthBase, url: str | None) -> SplitResult | None:
    """``url``'s parts when the request goes to ``auth``'s service, else ``None``: a
    request to another host goes out untouched."""
    parts = urlsplit(url or "")
    return parts if auth._signs(parts.scheme, parts.hostname, parts.port) else None


def _check_origin(origins: InsecureOrigins, parts: SplitResult) -> None:
    origins.check(parts.scheme, parts.hostname or "")


class ApiKeyAuth(ApiKeyAuthBase, AuthBase):
    """A requests auth that sends the service's API key.

    ``session.auth = ApiKeyAuth(client_id, client_secret, url=api_url)``, or ``auth=`` per
    request; requests to other hosts go out untouched.
    The arguments and rules are :class:`~gql_service_auth._stacks.auth_objects.ApiKeyAuthBase`'s.
    """

    def __call__(self, r: PreparedRequest) -> PreparedRequest:
        if "Authorization" in r.headers:
            return r  # the caller's own
        parts = _service_url(self, r.url)
        if parts is None:
            return r  # another service's
        _check_origin(self._rules.origins, parts)
        r.headers["Authorization"] = self._rules.authorization
        return r


class OAuth2Auth(OAuth2AuthBase, AuthBase):
    """A requests auth that sends OAuth 2.0 client-credentials tokens, renewed as needed.

    ``session.auth = OAuth2Auth(token_url, client_id, client_secret, url=api_url)``;
    requests to other hosts go out untouched. One auth object
    may serve any number of sessions and threads: they share its token and its fetches.
    A request waits for a token at most ``retry.timeout`` seconds (plus a grace), whatever
    the request's own ``timeout``. The arguments and rules are those of
    :class:`~gql_service_auth._stacks.auth_objects.OAuth2AuthBase`.
    """

    def __call__(self, r: PreparedRequest) -> PreparedRequest:
        if "Authorization" in r.headers:
            return r  # the caller's own: neither replaced nor re-sent
        parts = _service_url(self, r.url)
        if parts is None:
            return r  # another service's: no token is fetched for it
        rules = self._rules_for(r.url)
        _check_origin(rules.origins, parts)
        replayable = _replayable(r)
        # A body sent once asks for a token that will outlive its send.
        min_ttl = 0.0 if replayable else rules.refresh_margin
        token = rules.tokens.fresh(min_ttl) or first_token_blocking(rules.tokens, min_ttl)
        r.headers["Authorization"] = token.authorization
        tell_sent(token, rules)
        r.register_hook("response", partial(self._answered, rules, token, replayable, min_ttl))
        return r

    def _answered(
        self,
        rules: OAuth2Rules,
        token: AccessToken,
        replayable: bool,
        min_ttl: float,
        r: Response,
        **kwargs: Any,
    ) -> Response | None:
        """The response hook: the answer, or the answer of a re-send with a renewed token."""
        if r.request.headers.get("Authorization") != token.authorization:
            # A redirect to another host, which requests sent without our credentials:
            # its answer says nothing of our token, and nothing goes there again.
            return None
        stream = bool(kwargs.get("stream"))
        if not _reads(r, stream):
            return None
        # A transport's session reads an answer that is no stream whole next, whatever its
        # content type (gql does): it is read for a refusal too, as the aiohttp transports
        # read theirs. A plain session's goes by its content type.
        whole = self._own_client and not stream
        answer = _answer(r, whole)
        if answer is None:
            rules.tokens.confirm(token)
            return None
        body = r.request.body
        facts = facts_of(body if isinstance(body, bytes | str) else None, replayable=replayable)
        flow = renewal_flow(
            facts,
            rules.tokens,
            max_renewals=rules.max_renewals,
            min_ttl=min_ttl,
            emit=rules.emit,
            first=(token, Sent(answer, r, detached_401(answer, r.raise_for_status))),
        )
        last = [r]

        def send(renewed: AccessToken) -> Sent[Response]:
            previous = last[0]
            prepared = _copy_for_resend(previous)
            prepared.headers["Authorization"] = renewed.authorization
            # requests follows a redirect of the re-send from the request it was given:
            # it must carry the renewed token too, not the refused one.
            r.request.headers["Authorization"] = renewed.authorization
            tell_sent(renewed, rules)
            response = previous.connection.send(prepared, **kwargs)
            response.history.append(previous)
            response.request = prepared
            last[0] = response
            read = _reads(response, stream)
            answer = (_answer(response, whole) if read else None) or NOT_REFUSED
            return Sent(answer, response, detached_401(answer, response.raise_for_status))

        def get_token(need: NeedToken) -> AccessToken | NotNow:
            return rules.tokens.get_blocking(min_ttl=need.min_ttl, after=need.newer_than)

        outcome = drive_sync(
            flow, get_token=get_token, send=send, sleep=rules.tokens.waits(time.sleep)
        )
        if isinstance(outcome, Accepted):
            return outcome.raw
        assert isinstance(outcome, Refused)  # a pause comes only before a first send
        tell_refused(outcome, rules)
        return outcome.last.raw


def _reads(r: Response, stream: bool) -> bool:
    """Whether ``r`` is read for a refusal: under ``stream=True`` the caller reads the
    body as it comes, so only a 401 (small) is read; a refusal in a 200 is the caller's."""
    return not stream or r.status_code == 401


def _answer(r: Response, whole: bool = False) -> Answer | None:
    """What ``r`` says of the credentials; its body read if ``whole``, else by its
    content type."""
    body = r.content if whole or reads_body(r.headers.get("Content-Type")) else None
    return answer_of(r.status_code, body)


def _replayable(r: PreparedRequest) -> bool:
    """Whether ``r``'s body can be sent twice: none, bytes, text, or a rewindable file."""
    body = r.body
    if body is None or isinstance(body, bytes | str):
        return True
    return isinstance(getattr(r, "_body_position", None), int)


def _copy_for_resend(previous: Response) -> PreparedRequest:
    """A copy of ``previous``'s request to send again, as requests' digest auth makes one:
    the refused response read and closed (its connection back in the pool), the body
    rewound, and the cookies the refusal set."""
    previous.content  # noqa: B018 - read to the end, so the connection can be reused
    previous.close()
    prepared = previous.request.copy()
    if not isinstance(prepared.body, bytes | str | None):
        rewind_body(prepared)
    cookies = prepared._cookies
    if cookies is not None:
        extract_cookies_to_jar(cookies, previous.request, previous.raw)
        prepared.prepare_cookies(cookies)
    return prepared


class _RequestsRecords:
    """requests' exceptions keep the prepared request, and the response with its own
    request, the redirects before it (``history``) and urllib3's response below it."""

    def passwords(self, link: BaseException) -> list[str]:
        return []

    def scrub(self, link: BaseException) -> None:
        if isinstance(link, RequestException):
            _blank(link.request)

    def responses(self, link: BaseException) -> list[Response]:
        response = link.response if isinstance(link, RequestException) else None
        return [response] if isinstance(response, Response) else []

    def history(self, response: Response) -> list[Response]:
        return response.history

    def blank_requests(self, response: Response) -> None:
        _blank(response.request)
        _blank(response.next)  # the redirect it would have led to (allow_redirects=False)
        # The adapter that sent it, the session's live one: its pool manager keys each
        # proxy by its URL, password included. The record lets go of it; nothing that
        # reads a response after the exchange needs it (only a redirect's resend does).
        response.connection = None  # type: ignore[assignment]
        # urllib3's response below it keeps its pool, whose proxy is that URL too: once
        # its connection is back (or closed), it needs the pool no more.
        raw: Any = response.raw
        if raw is not None and getattr(raw, "_pool", None) is not None:
            if getattr(raw, "_connection", None) is not None:
                raw.close()  # unreleased: closed, never back in the pool with its bytes
            raw._pool = None

    def headers(self, response: Response) -> list[tuple[str, str]]:
        return list(response.headers.items())

    def replace_headers(self, response: Response, headers: list[tuple[str, str]]) -> None:
        response.headers = CaseInsensitiveDict(headers)
        # The copies below: urllib3's response, and http.client's below it.
        raw: Any = response.raw
        if raw is not None and raw.headers is not None:
            raw.headers = type(raw.headers)(headers)
        original: Any = getattr(raw, "_original_response", None)
        if isinstance(getattr(original, "msg", None), HTTPMessage):
            message = HTTPMessage()
            for name, value in headers:
                message[name] = value
            original.msg = original.headers = message

    def body(self, response: Response) -> bytes | None:
        content = response._content
        return content if isinstance(content, bytes) else None

    def replace_body(self, response: Response, body: bytes) -> None:
        unread = not isinstance(response._content, bytes)
        response._content = body
        if unread:
            # stream=True: its bytes wait on the connection, which would go back to the
            # pool with them (requests releases a response it takes as read). It is
            # closed instead, unread.
            response._content_consumed = True
            if response.raw is not None:
                response.raw.close()


def _blank(prepared: object) -> None:
    """Blank the credential headers of a request requests keeps (prepared or not)."""
    headers = getattr(prepared, "headers", None)
    if headers is not None:
        for name in SENSITIVE_HEADERS:
            if name in headers:
                headers[name] = REDACTED


# http.client and socket: a failed send's frames, below urllib3's, hold the headers too.
register(
    _RequestsRecords(),
    modules=("requests", "urllib3", "requests_toolbelt", "http.client", "socket", "ssl"),
)
