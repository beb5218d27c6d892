"""What the auth objects of every HTTP client share, whatever the client: no HTTP stack here.

An auth object (requests' ``AuthBase``, ``httpx.Auth``) sees raw HTTP: a request's URL,
headers and body, and a response's status, content type and body. Here those are read
into what the decision core takes (:class:`~gql_service_auth._core.refusal.Answer`,
:class:`~gql_service_auth._core.refusal.RequestFacts`), the credentials' rules are kept
(:class:`ApiKeyRules`, :class:`OAuth2Rules`), and a refused outcome is handed to the
gql transport that made the request (:func:`exchange`), which raises the package's own
error with gql's bases: the auth object itself only returns responses, as plain clients
expect of an auth.

What is read from the body is what was sent: a request's facts are read from the bytes
that go on the wire, not from a gql object that a caller may change meanwhile.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit

from gql.transport.exceptions import TransportError
from graphql import GraphQLError, parse

from .._core.config import is_loopback, proxy_login
from .._core.constants import UNAUTHENTICATED
from .._core.errors import ApiKeyRejectedError, ConfigurationError
from .._core.events import Emitter
from .._core.flow import Refused
from .._core.log_secrets import remember
from .._core.refusal import BARE_401, Answer, RequestFacts
from .._core.rotation import Credentials, RotatingCredentials
from .._core.token import AccessToken

if TYPE_CHECKING:  # the token machinery loads with the first OAuth2 transport
    from .._core.tokens import TokenManager
from .failures import COUNTED, count
from .gql import (
    api_key_answer,
    api_key_failure,
    oauth2_answer,
    oauth2_failure,
    runs_query,
    scrubbed,
)
from .unanswered import ServiceEndpoint, explained, past_deadline

_T = TypeVar("_T")

_MARK: Final = UNAUTHENTICATED.encode()

NOT_REFUSED: Final = Answer(parts=1, refusals=0, ran=False, data=True)
"""An answer that refuses nothing, as the decision reads it."""

STREAM_TYPES: Final = ("multipart/", "text/event-stream", "application/x-ndjson")
"""Content types of streams, whose bodies are left to the caller; any other is read for a
refusal, whatever it says (gql reads a GraphQL answer whatever its content type)."""


def reads_body(content_type: str | None) -> bool:
    """Whether a response of ``content_type`` is read for a GraphQL refusal."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    return not kind.startswith(STREAM_TYPES)


def answer_of(status: int, body: bytes | None) -> Answer | None:
    """What a response says of the credentials: ``None`` when it refuses nothing.

    ``body`` is ``None`` when it was not read (not JSON). A body without the word
    ``UNAUTHENTICATED`` refuses nothing and is not parsed: most answers are not refusals.
    A redirect refuses nothing, whatever its body says: the server answered the request
    with it, so it ran (rule 5 of :mod:`gql_service_auth._core.refusal`).
    """
    if 300 <= status < 400:
        return None
    if body is not None and _MARK in body:
        answer = _graphql_answer(body)
        if answer is not None:
            return answer if answer.refused else None
    if status == 401 and not _graphql_body(body):
        return BARE_401
    return None


def _graphql_answer(body: bytes) -> Answer | None:
    """``body`` read as a GraphQL answer, or a batch's; ``None`` if it is neither."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        return None
    if isinstance(document, dict) and ("data" in document or "errors" in document):
        return Answer.of_results(((document.get("errors"), document.get("data")),))
    if isinstance(document, list) and all(isinstance(part, dict) for part in document):
        return Answer.of_results((part.get("errors"), part.get("data")) for part in document)
    return None


def _graphql_body(body: bytes | None) -> bool:
    """Whether ``body`` is a GraphQL answer (gql then reads it, whatever the status)."""
    if not body:
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    if isinstance(document, dict):
        return "data" in document or "errors" in document
    return isinstance(document, list) and bool(document)


def facts_of(body: bytes | str | None, *, replayable: bool) -> RequestFacts:
    """What the decision needs of a request, read from the body it sent.

    A body that cannot be read as a GraphQL request counts as a mutation: a wrong guess
    must never run an operation twice.
    """
    if body is None:
        return RequestFacts(replayable=replayable)
    try:
        document = json.loads(body)
    except ValueError:
        return RequestFacts(replayable=replayable)
    if isinstance(document, list):
        return RequestFacts(batch=True, replayable=replayable)
    if isinstance(document, dict):
        query = _is_query(document.get("query"), document.get("operationName"))
        return RequestFacts(query=query, replayable=replayable)
    return RequestFacts(replayable=replayable)


def _is_query(text: object, operation_name: object) -> bool:
    """Whether the operation ``text`` runs is a query, which has no side effects."""
    if not isinstance(text, str):
        return False
    try:
        document = parse(text, no_location=True)
    except GraphQLError:
        return False
    return runs_query(document, operation_name)


_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}

_ENCRYPTED: Final = frozenset({"https", "wss"})


class ServiceOrigin:
    """The origin an auth object signs requests to: its service's, given when it is built.

    A client that also calls another service sends that one its requests untouched: no
    credential, no token fetched for it. ``ServiceOrigin(None)`` signs every request its client
    sends (``sign_any_origin=True``), and the transports' own signers, whose client sends
    only to the transport's URL.
    """

    __slots__ = ("_origin",)

    def __init__(self, url: str | None) -> None:
        self._origin = None if url is None else _origin_of(url)

    def covers(self, scheme: str, host: str | None, port: int | None) -> bool:
        """Whether a request to ``scheme://host:port`` is signed (``port`` ``None``: the
        scheme's default)."""
        if self._origin is None:
            return True
        scheme = scheme.lower()
        return (scheme, _ascii(host or ""), port or _DEFAULT_PORTS.get(scheme)) == self._origin


def _origin_of(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, _ascii(parts.hostname or ""), parts.port or _DEFAULT_PORTS.get(scheme)


def _ascii(host: str) -> str:
    """``host`` as it goes on the wire: lower case, an international name in punycode
    (requests gives the one, httpx the other, for the same host).

    Encoded as requests, httpx and aiohttp (yarl) encode it, by IDNA 2008 with UTS 46
    (the ``idna`` package): Python's own codec is IDNA 2003, which maps ``ß`` to ``ss``,
    another domain.
    """
    if host.isascii():
        return host.lower()
    try:
        import idna  # the HTTP stacks' own dependency; loaded for international names only

        return str(idna.encode(host, uts46=True).decode("ascii")).lower()
    except (ImportError, UnicodeError, ValueError):
        pass
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:  # a name IDNA cannot encode goes nowhere: compared as it is
        return host.lower()


class InsecureOrigins:
    """The plain-http check of every request an auth object signs, cached per origin.

    An auth object signs whatever its client sends: a request to a plain ``http://``
    host that is not loopback would carry the credentials in clear text. ``environment``
    says whether the environment's proxy is weighed too: requests' and httpx's auths
    cannot see the proxy their client uses, which follows the environment by default;
    aiohttp's middlewares see the request's own proxy, and check that instead.
    """

    __slots__ = ("_allowed", "_environment", "_seen")

    def __init__(self, allow_insecure_http: bool, *, environment: bool = True) -> None:
        self._allowed = allow_insecure_http
        self._environment = environment
        self._seen: dict[tuple[str, str], str] = {}  # why not, or "": fine

    @property
    def allowed(self) -> bool:
        """Whether plain http to any host was allowed (``allow_insecure_http``)."""
        return self._allowed

    # pickle and copy: a copy may land in another environment, whose proxy it reads again.
    def __reduce__(self) -> tuple[Any, ...]:
        return _insecure_origins, (self._allowed, self._environment)

    def without_environment(self) -> InsecureOrigins:
        """The same check, the environment's proxy left out (the client's is checked)."""
        return InsecureOrigins(self._allowed, environment=False)

    def check(self, scheme: str, host: str) -> None:
        """Raise :class:`ConfigurationError` unless credentials may go to this origin."""
        if scheme in _ENCRYPTED or self._allowed:
            return
        key = (scheme, host)
        refusal = self._seen.get(key)
        if refusal is None:
            refusal = self._seen[key] = _plain_http_refusal(scheme, host, self._environment)
            if len(self._seen) > 64:  # a client that talks to many hosts: kept small
                self._seen.clear()
        if refusal:
            raise ConfigurationError(refusal)


def _insecure_origins(allow_insecure_http: bool, environment: bool) -> InsecureOrigins:
    return InsecureOrigins(allow_insecure_http, environment=environment)


def _plain_http_refusal(scheme: str, host: str, environment: bool) -> str:
    """Why credentials may not go to ``scheme://host`` in clear text; ``""`` if they may.

    Loopback is safe, unless the environment's proxy, which requests and httpx follow by
    default, is another machine: it would read every plain-http request it forwards. The
    environment is read once per origin (see :class:`InsecureOrigins`).
    """
    fix = "use an https:// URL, or pass allow_insecure_http=True if this network is trusted"
    if scheme not in ("http", "ws") or not is_loopback(host):
        return f"refusing to send credentials over {scheme} to {host}: {fix}"
    proxy = environment_proxy(host) if environment else None
    if proxy is None or is_loopback(proxy):
        return ""
    return (
        f"refusing to send credentials over plain http to {host} through the proxy at "
        f"{proxy} that the environment names (http_proxy): it would read them. Add {host} "
        f"to NO_PROXY, or {fix}. (A proxy set on the client itself is not seen by the auth: "
        "through one, use the service's https:// URL.)"
    )


def check_proxy(url: object, proxy: str | None, given_as: str, allow: bool) -> None:
    """Refuse a plain-http ``url`` sent through a ``proxy`` (given as ``given_as``) that is
    another machine: the proxy would read the credentials of every request it forwards.

    A proxy's password is remembered as a credential (see ``_core/log_secrets.py``): a
    proxy that quotes the ``Proxy-Authorization`` it was sent would put it in httpcore's
    record of its answer's headers.
    """
    _remember_proxy_login(proxy)
    remember_environment_proxies()
    parts = urlsplit(str(url))
    if allow or proxy is None or parts.scheme not in ("http", "ws"):
        return
    proxy_host = urlsplit(proxy if "://" in proxy else f"http://{proxy}").hostname
    if proxy_host is not None and not is_loopback(proxy_host):
        raise ConfigurationError(
            f"refusing to send credentials over plain http to {parts.hostname} through the "
            f"proxy at {proxy_host} ({given_as}): it would read them. Use an https:// URL, "
            "or pass allow_insecure_http=True if this network is trusted"
        )


def _remember_proxy_login(proxy: str | None) -> None:
    for secret in proxy_login(proxy) if proxy else ():
        remember(secret, lasting=True)


def remember_environment_proxies() -> None:
    """Remember the passwords of the proxies the environment names (``HTTPS_PROXY``,
    ``ALL_PROXY``...), which requests and httpx follow by default, as :func:`check_proxy`
    does a client's: a proxy that quotes the login it was sent would put it in httpcore's
    record of its answer."""
    for proxy in urllib.request.getproxies_environment().values():
        _remember_proxy_login(proxy)


def environment_proxy(host: str) -> str | None:
    """The host of the proxy the environment names for plain http to ``host``, if any."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get("http") or proxies.get("all")
    if not url or urllib.request.proxy_bypass(host):
        return None
    return urlsplit(url if "://" in url else f"http://{url}").hostname or url


class ApiKeyRules:
    """An API key auth's settings: the header it sends, and where it may go.

    With credentials that can change, the header follows them: it is swapped when the
    watcher reads new ones, so a request reads one attribute, as with fixed credentials.
    """

    __slots__ = ("__weakref__", "authorization", "credentials", "origins")

    def __init__(self, credentials: Credentials, origins: InsecureOrigins) -> None:
        self.credentials = credentials
        self.origins = origins
        self.authorization = credentials.api_key_authorization()
        if isinstance(credentials, RotatingCredentials):
            credentials.listen(self._changed)

    def _changed(self) -> None:
        self.authorization = self.credentials.api_key_authorization()

    def __reduce__(self) -> tuple[type[ApiKeyRules], tuple[Credentials, InsecureOrigins]]:
        return ApiKeyRules, (self.credentials, self.origins)

    def __repr__(self) -> str:
        return f"<ApiKeyRules client_id={self.credentials.client_id!r}>"

    def secrets(self) -> list[str]:
        return [self.credentials.client_secret]

    def refused(self) -> None:
        """The service refused the key: credentials that can change are read again soon."""
        if isinstance(self.credentials, RotatingCredentials):
            self.credentials.check_soon()


@dataclass(frozen=True, slots=True, repr=False)
class OAuth2Rules:
    """An OAuth2 auth's settings and its token manager, shared by its stack's flows.

    Attributes:
        tokens: Hands out the tokens; shared by every request the auth signs.
        max_renewals: Renewals (so re-sends) per request after a refusal.
        refresh_margin: Seconds of validity an upload, never sent twice, asks for.
        emit: The events' emitter (logs and ``on_event``).
        origins: Where credentials may go.
    """

    credentials: Credentials
    tokens: TokenManager
    max_renewals: int
    refresh_margin: float
    emit: Emitter
    origins: InsecureOrigins

    def __post_init__(self) -> None:
        self.tokens.subscribe(self.emit)

    # Copied (pickle, copy.deepcopy) through __init__: the copy's hook hears the events of
    # the token it uses, which may be the original's (see TokenManager.subscribe).
    def __reduce__(self) -> tuple[type[OAuth2Rules], tuple[Any, ...]]:
        return OAuth2Rules, tuple(getattr(self, name) for name in self.__slots__)

    def __repr__(self) -> str:
        return f"<OAuth2Rules client_id={self.credentials.client_id!r}>"

    def secrets(self, sent: Sequence[str]) -> list[str]:
        """What an answer to a call may quote: the client secret and the tokens ``sent``."""
        return [self.credentials.client_secret, *sent]


class Exchange:
    """What the auth flows tell the gql transport whose call made their request.

    Attributes:
        owner: The transport's rules: only its own auth's flows write here, not those of
            another client used while the call runs (an event hook's, a nested one's).
        refused: How the request ended when the service refused it to the end; the
            transport raises the package's error for it. ``None`` otherwise.
        secrets: The tokens sent, which the answers may quote.
    """

    # Slots, and a list attribute: vars() of a live call's record fails, and a crash
    # reporter capturing a live frame's locals shows the repr below, not the tokens.
    __slots__ = ("owner", "refused", "secrets")

    def __init__(self, owner: OAuth2Rules) -> None:
        self.owner = owner
        self.refused: Refused[Any] | None = None
        self.secrets: list[str] = []

    def __repr__(self) -> str:
        # Without the secrets: a traceback's frames show their locals, this record among them.
        return f"<Exchange refused={self.refused is not None}>"


_EXCHANGE: ContextVar[Exchange | None] = ContextVar("gql_service_auth_exchange", default=None)
"""The :class:`Exchange` of the current call. A ``ContextVar``: the auth flow runs on the
caller's thread (requests, sync httpx) or in its task (async httpx), while another
caller's flow writes its own. Set and reset in line by :func:`oauth2_call`: a context
manager's two calls per request cost more."""


def tell_sent(token: AccessToken, rules: OAuth2Rules) -> None:
    """Note a token the current call's own auth (of ``rules``) sent, which its answers
    may quote, for its gql transport to scrub them of."""
    record = _EXCHANGE.get()
    if record is not None and record.owner is rules:
        record.secrets.append(token.value)


def tell_refused(outcome: Refused[Any], rules: OAuth2Rules) -> None:
    """Hand a refused outcome of the current call's own auth (of ``rules``) to its gql
    transport."""
    record = _EXCHANGE.get()
    if record is not None and record.owner is rules:
        record.refused = outcome


# The calls of gql's requests and httpx transports, wrapped: each runs gql's own method
# with an Exchange open, and raises what the package raises (see _stacks/gql.py).


def _has_errors(answer: object) -> bool:
    """Whether gql's answer (a result, or a batch's) has errors: only then is it read for
    a refusal or scrubbed. Almost none has."""
    if isinstance(answer, list):
        return any(getattr(result, "errors", None) for result in answer)
    return bool(getattr(answer, "errors", None))


def oauth2_call(
    call: Callable[[], _T],
    rules: OAuth2Rules,
    transport: ServiceEndpoint,
    given_timeout: object = None,
) -> _T:
    """``call()`` (gql's ``execute`` or ``execute_batch``) of an OAuth2 transport of
    ``rules``: its answer, or the package's error (one that names what to check when no
    GraphQL answer came from ``transport``'s API, see :func:`explained`; ``given_timeout``,
    the call's own timeout, is the bound it names)."""
    record = Exchange(rules)
    reset = _EXCHANGE.set(record)
    try:
        try:
            answer = call()
        except TransportError as exc:
            failure = oauth2_failure(exc, record.refused, rules.secrets(record.secrets))
        else:
            if record.refused is None and not _has_errors(answer):
                return answer
            return oauth2_answer(answer, record.refused, rules.secrets(record.secrets))
        finally:
            _EXCHANGE.reset(reset)
        # Outside the except block: gql's wrapper stays out of our error's chain.
        raise explained(failure, transport, given_timeout)
    except COUNTED as error:
        count(error, "oauth2")
        raise


async def oauth2_call_async(
    call: Callable[[], Awaitable[_T]],
    rules: OAuth2Rules,
    transport: ServiceEndpoint,
    given_timeout: object = None,
) -> _T:
    """:func:`oauth2_call` for an async transport; gql's ``execute_timeout``, passing while
    it waits, ends it with :class:`~gql_service_auth.ServiceTimeoutError`."""
    record = Exchange(rules)
    reset = _EXCHANGE.set(record)
    started = time.monotonic()
    try:
        try:
            answer = await call()
        except TransportError as exc:
            failure = oauth2_failure(exc, record.refused, rules.secrets(record.secrets))
        except BaseException as exc:
            late = past_deadline(exc, started, transport, rules.tokens.waited_for)
            if late is None:
                raise
            raise late from None
        else:
            if record.refused is None and not _has_errors(answer):
                return answer
            return oauth2_answer(answer, record.refused, rules.secrets(record.secrets))
        finally:
            _EXCHANGE.reset(reset)
        raise explained(failure, transport, given_timeout)
    except COUNTED as error:
        count(error, "oauth2")
        raise


def api_key_call(
    call: Callable[[], _T],
    rules: ApiKeyRules,
    instead: str,
    *,
    given: bool,
    transport: ServiceEndpoint,
    given_timeout: object = None,
) -> _T:
    """``call()`` of an API key transport: its answer, or the package's error.

    ``rules`` give what answers may quote, and hear of a refused key; ``instead`` names the
    OAuth2 transport of the same stack, which a refusal advises. ``given``: the call
    carried the caller's own ``Authorization``, which the auth left alone: a refusal is of
    that header, not of the key, and is gql's to raise. ``transport``: whose API a call
    that got no GraphQL answer names (see :func:`explained`).
    """
    try:
        try:
            answer = call()
        except TransportError as exc:
            failure = _api_key_failure(exc, rules, instead, given)
        else:
            if not _has_errors(answer):
                return answer
            return _api_key_answer(answer, rules, instead, given)
        raise explained(failure, transport, given_timeout)
    except COUNTED as error:
        count(error, "api_key")
        raise


async def api_key_call_async(
    call: Callable[[], Awaitable[_T]],
    rules: ApiKeyRules,
    instead: str,
    *,
    given: bool,
    transport: ServiceEndpoint,
    given_timeout: object = None,
) -> _T:
    """:func:`api_key_call` for an async transport; gql's ``execute_timeout``, passing
    while it waits, ends it with :class:`~gql_service_auth.ServiceTimeoutError`."""
    started = time.monotonic()
    try:
        try:
            answer = await call()
        except TransportError as exc:
            failure = _api_key_failure(exc, rules, instead, given)
        except BaseException as exc:
            late = past_deadline(exc, started, transport)
            if late is None:
                raise
            raise late from None
        else:
            if not _has_errors(answer):
                return answer
            return _api_key_answer(answer, rules, instead, given)
        raise explained(failure, transport, given_timeout)
    except COUNTED as error:
        count(error, "api_key")
        raise


def _api_key_failure(
    exc: TransportError, rules: ApiKeyRules, instead: str, given: bool
) -> BaseException:
    # A caller's own header refused: gql's error, scrubbed, as on OAuth2 (oauth2_failure).
    if given:
        return oauth2_failure(exc, None, rules.secrets())
    failure = api_key_failure(exc, rules.secrets(), instead)
    if isinstance(failure, ApiKeyRejectedError):
        rules.refused()
    return failure


def _api_key_answer(answer: _T, rules: ApiKeyRules, instead: str, given: bool) -> _T:
    if given:
        return scrubbed(answer, rules.secrets())
    try:
        return api_key_answer(answer, rules.secrets(), instead)
    except ApiKeyRejectedError:
        rules.refused()
        raise
