"""The emulator: the service's GraphQL API and token endpoint on loopback, with fault knobs."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import date
from typing import Any, Literal
from urllib.parse import unquote_plus

from aiohttp import BodyPartReader, web
from graphql import ExecutionResult, graphql
from multidict import CIMultiDict

from .._core.constants import (
    API_KEY_CUTOFF,
    API_KEY_SCHEME,
    BEARER_SCHEME,
    ENV_AUTH_URL,
    ENV_BASE_URL,
    ENV_CLIENT_ID,
    ENV_CLIENT_SECRET,
    GRAPHQL_PATH,
    TOKEN_PATH,
    UNAUTHENTICATED,
)
from . import _schema, _websocket
from ._schema import UploadedFile


@dataclass(frozen=True, slots=True, repr=False)
class ClientRecord:
    """Credentials the emulator knows, with the date they were registered.

    Args:
        client_id: The Client Id.
        client_secret: The Client Secret; ``repr`` hides it.
        registered: Registration date; before 2024-05-13 the API key is refused.
        scopes: Scopes the client may request; ``None`` allows any.
    """

    client_id: str
    client_secret: str
    registered: date = date(2025, 1, 15)
    scopes: frozenset[str] | None = None

    @classmethod
    def generate(cls, client_id: str, registered: date) -> ClientRecord:
        """A client with a fresh random secret."""
        return cls(client_id, "emu-secret-" + secrets.token_urlsafe(18), registered)

    @property
    def api_key_allowed(self) -> bool:
        """Whether the API key works: registered on or after 2024-05-13."""
        return self.registered >= API_KEY_CUTOFF

    def __repr__(self) -> str:
        return (
            f"ClientRecord(client_id={self.client_id!r}, client_secret='***', "
            f"registered={self.registered.isoformat()})"
        )


@dataclass(frozen=True, slots=True, repr=False)
class RecordedRequest:
    """One request the emulator received, kept so tests can check what was sent.

    Attributes:
        path: ``/graphql`` or ``/oauth2/token``.
        headers: The request headers (``repr`` hides them: they hold credentials).
        form: The urlencoded form of a token request, else ``None``.
        auth_scheme: First word of the ``Authorization`` header, or ``None``.
    """

    path: str
    headers: CIMultiDict[str]
    form: Mapping[str, str] | None = None

    @property
    def auth_scheme(self) -> str | None:
        """First word of the ``Authorization`` header, or ``None`` without one."""
        value = self.headers.get("Authorization")
        return value.split(" ", 1)[0] if value else None

    def __repr__(self) -> str:
        return f"RecordedRequest(path={self.path!r}, auth_scheme={self.auth_scheme!r})"


@dataclass(frozen=True, slots=True)
class RecordedMutation:
    """One mutation field the emulator ran, with the arguments it ran with.

    Attributes:
        field: The mutation field, ``"renameCarrier"`` or ``"uploadDocument"``.
        arguments: Its arguments as the resolver received them (an upload's file is an
            :class:`UploadedFile`).
    """

    field: str
    arguments: Mapping[str, Any]


@dataclass(slots=True)
class _Fault:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body, headers=self.headers)


_Body = bytes | str | Mapping[str, Any] | list[Any] | None
"""A fault's body as a knob takes it: bytes or text as given, JSON otherwise (see _encode);
spelled out in the knobs' own signatures, which the API reference shows."""


@dataclass(frozen=True, slots=True)
class _RefusalAnswer:
    """An answer :meth:`Emulator.answer_refusals` queued, kept as given: a JSON object
    answers a batch with a copy per request, so it is encoded once the request is read."""

    status: int
    body: _Body
    headers: Mapping[str, str] | None

    def to(self, payload: object) -> _Fault:
        body = self.body
        if isinstance(payload, list) and isinstance(body, Mapping):
            body = [dict(body)] * len(payload)
        return _fault(self.status, b"" if body is None else body, self.headers)


@dataclass(slots=True)
class _Issued:
    client_id: str
    expires_at: float


class ManualClock:
    """A monotonic clock that moves only when told, shared by a transport and the emulator.

    Pass it as ``clock=`` to both, then ``advance()`` past a token's lifetime instead of
    sleeping through it.
    """

    __test__ = False

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        with self._lock:
            self._now += seconds

    def wait(self, seconds: float) -> None:
        """A transport's wait on this clock (a re-send waiting out a pause): it advances the
        clock by ``seconds`` rather than sleeping. Waits of transports sharing the clock add
        up, where in real time they would overlap."""
        self.advance(seconds)


COUNTERS_PATH = "/_emulator/counters"
"""Where the emulator answers its counters as JSON (``GET``)."""


@dataclass(slots=True)
class Counters:
    """What the emulator has seen since it started or since :meth:`Emulator.reset_counters`."""

    token_requests: int = 0
    tokens_issued: int = 0
    graphql_requests: int = 0
    unauthenticated_responses: int = 0
    mutations_run: int = 0
    websocket_connections: int = 0
    """Websocket connections initialised on ``/graphql`` (``graphql-transport-ws``)."""
    deleted_credentials_used: int = 0
    """Requests that carried deleted credentials, or a token issued to them (refused)."""


def _json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()


def _encode(body: _Body) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes):
        return body
    return _json_bytes(body if isinstance(body, list) else dict(body))


def _fault(
    status: int,
    body: _Body,
    headers: Mapping[str, str] | None,
) -> _Fault:
    """An answer given as told: ``body`` encoded by :func:`_encode`, with JSON's content
    type unless it is bytes."""
    fault_headers = {"Content-Type": "application/json"} if not isinstance(body, bytes) else {}
    fault_headers.update(headers or {})
    return _Fault(status, _encode(body), fault_headers)


class Emulator:
    """The service on 127.0.0.1: GraphQL API, token endpoint, and knobs to make them fail.

    Start it as an async context manager (``async with Emulator() as emulator``), or in a
    thread of its own for sync code and tests (``with Emulator().run_in_thread()``).
    Knobs are plain attributes and may be changed while it runs. ``GET /_emulator/counters``
    answers :attr:`counters` as JSON, for a process that did not start it.

    Args:
        clients: Known credentials; by default one recent client and one registered
            before 2024-05-13, with random secrets.
        host: Address to listen on; loopback by default.
        port: Port to listen on; 0 picks a free one.
        token_ttl: Seconds a token stays valid.
        clock: Monotonic clock in seconds for token expiry.
        carriers: How many carriers to seed.

    Attributes:
        token_ttl: Seconds a newly issued token stays valid.
        expires_in_format: How ``expires_in`` is sent: ``"number"``, ``"string"`` or
            ``"omitted"``.
        token_latency: Seconds the token endpoint waits before answering.
        token_body_delay: Seconds between the two halves of a token answer's body, sent
            as separate chunks, as a slow network delivers them; 0 sends it at once.
        graphql_latency: Seconds the GraphQL endpoint waits before answering.
        unauthenticated_status: HTTP status of ``UNAUTHENTICATED`` answers (200 by default).
        unauthenticated_body: Whether those answers carry the GraphQL body; ``False`` with
            status 401 gives a bare 401.
        refuse_all_tokens: Refuse every access token, even fresh ones.
        advertised_ttl: Seconds sent as ``expires_in`` when it should differ from
            ``token_ttl`` (a server that lies); ``None`` sends ``token_ttl``.
        expires_in_override: Any JSON value sent verbatim as ``expires_in`` with a real
            token (strings, negatives, huge numbers: for fuzzing); ``None`` turns it off.
        counters: Request counters.
        requests: The last 10,000 requests received.
        mutations: The last 10,000 mutation fields run, with their arguments, in order.
    """

    __test__ = False

    def __init__(
        self,
        *,
        clients: Iterable[ClientRecord] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        carriers: int = 25,
    ) -> None:
        if clients is None:
            clients = (
                ClientRecord.generate("emu-recent-client", date(2025, 1, 15)),
                ClientRecord.generate("emu-legacy-client", date(2023, 9, 1)),
            )
        self.clients: dict[str, ClientRecord] = {c.client_id: c for c in clients}
        self.host = host
        self.port = port
        self.token_ttl = token_ttl
        self.expires_in_format: Literal["number", "string", "omitted"] = "number"
        self.token_latency = 0.0
        self.token_body_delay = 0.0
        self.graphql_latency = 0.0
        self.unauthenticated_status = 200
        self.unauthenticated_body = True
        self.refuse_all_tokens = False
        self.advertised_ttl: float | None = None
        self.expires_in_override: Any = None
        self.counters = Counters()
        self.requests: deque[RecordedRequest] = deque(maxlen=10_000)
        self.mutations: deque[RecordedMutation] = deque(maxlen=10_000)
        self.carriers = _schema.seed_carriers(carriers)
        self._clock = clock
        self._schema = _schema.build()
        self._tokens: dict[str, _Issued] = {}
        self._deleted: set[str] = set()
        self._issued_to: dict[str, str] = {}  # every token issued, to whom, latest kept
        self._faults: deque[_Fault] = deque()
        self._graphql_faults: deque[_Fault] = deque()
        self._refusal_answers: deque[_RefusalAnswer] = deque()
        self._field_refusals = 0
        self._runner: web.AppRunner | None = None
        self._token_frozen_until = 0.0  # time.monotonic(): outages last real time

    def __repr__(self) -> str:
        return f"<Emulator {self.base_url if self._runner else 'not started'}>"

    # -- addresses -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``{base_url}`` of the contract, e.g. ``http://127.0.0.1:8123``."""
        if self._runner is None:
            raise RuntimeError("the emulator is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def auth_url(self) -> str:
        """``{auth_url}`` of the contract; the same server as the API here."""
        return self.base_url

    @property
    def graphql_url(self) -> str:
        """The GraphQL endpoint, ``{base_url}/graphql``."""
        return self.base_url + GRAPHQL_PATH

    @property
    def token_url(self) -> str:
        """The token endpoint, ``{auth_url}/oauth2/token``."""
        return self.auth_url + TOKEN_PATH

    @property
    def recent_client(self) -> ClientRecord:
        """The first known client that may use the API key."""
        return next(c for c in self.clients.values() if c.api_key_allowed)

    @property
    def legacy_client(self) -> ClientRecord:
        """The first known client registered before 2024-05-13 (OAuth2 only)."""
        return next(c for c in self.clients.values() if not c.api_key_allowed)

    def environ(self, client: ClientRecord | None = None) -> dict[str, str]:
        """The ``SERVICE_*`` variables that point ``from_env`` at this emulator."""
        client = client or self.recent_client
        return {
            ENV_BASE_URL: self.base_url,
            ENV_AUTH_URL: self.auth_url,
            ENV_CLIENT_ID: client.client_id,
            ENV_CLIENT_SECRET: client.client_secret,
        }

    # -- knobs -----------------------------------------------------------------------

    def fail_token_requests(
        self,
        count: int,
        status: int = 503,
        *,
        body: bytes | str | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Answer the next ``count`` token requests with ``status`` instead of a token.

        Args:
            count: How many requests fail.
            status: Their HTTP status.
            body: Their body; by default an RFC 6749 error object for 4xx and 5xx.
            headers: Extra response headers (``Location`` for a redirect...).
            retry_after: Seconds to send as ``Retry-After``.
        """
        if body is None and status >= 400:
            body = {
                "error": "temporarily_unavailable" if status >= 500 else "invalid_request",
                "error_description": "fault injected by the emulator",
            }
        fault_headers = dict(headers or {})
        if retry_after is not None:
            fault_headers["Retry-After"] = f"{retry_after:g}"
        fault = _Fault(status, _encode(body), fault_headers)
        self._faults.extend([fault] * count)

    def freeze_token_endpoint(self, seconds: float) -> None:
        """Hold every token request that arrives in the next ``seconds`` until they are over.

        An outage as a hung identity provider shows it: requests are accepted and then not
        answered; when it ends, the held requests and later ones are answered as usual
        (``token_latency`` and queued faults still apply). Measured in real time
        (``time.monotonic``), whatever ``clock`` the emulator was given.

        Called again while requests are held, it moves the end for them too: 0 ends the
        outage under way and answers them.

        Args:
            seconds: How long the outage lasts from now; 0 ends one under way.
        """
        self._token_frozen_until = time.monotonic() + seconds

    def fail_graphql_requests(
        self,
        count: int,
        status: int = 200,
        *,
        body: bytes | str | Mapping[str, Any] | list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next ``count`` GraphQL requests with ``body``, whatever they ask.

        For answers the contract does not describe: malformed ``errors``, partial data
        next to an ``UNAUTHENTICATED`` error, a body that is not JSON, a redirect
        (``status=307, headers={"Location": ...}``).
        """
        self._graphql_faults.extend([_fault(status, body, headers)] * count)

    def answer_refusals(
        self,
        count: int,
        status: int = 401,
        *,
        body: bytes | str | Mapping[str, Any] | list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next ``count`` requests ``POST /graphql`` refuses with ``status`` and
        ``body`` rather than the emulator's own refusal; by default, bare 401s.

        Only a request the emulator refuses meets one: no ``Authorization``, an unknown
        scheme, a token revoked, expired, unknown or refused by ``refuse_all_tokens``, an
        API key that is wrong or not allowed. An accepted request passes them by, however
        many callers are on the way, so a server whose refusals come in more than one shape
        (a bare 401 for some callers, ``UNAUTHENTICATED`` in a body for others) can be
        played to callers that do not all fly at once. Each counts in
        ``counters.unauthenticated_responses``. Calls queue their answers in order.

        Not refusals of the request, and so not answered here: a body that is not JSON (a
        400 before ``Authorization`` is read), an answer :meth:`fail_graphql_requests`
        queued (it comes first, whatever the request), a resolver's refusal
        (:meth:`refuse_fields`), the websocket's (its close code).

        Args:
            count: How many refusals to answer so.
            status: Their HTTP status.
            body: ``None`` for no body; bytes or text as given; a JSON object or list as
                JSON, an object answering a batch with a copy per request, as the
                emulator's own refusal does.
            headers: Headers added to JSON's content type (none for bytes or no body).
        """
        self._refusal_answers.extend([_RefusalAnswer(status, body, headers)] * count)

    def create_credentials(
        self, *, registered: date | None = None, scopes: frozenset[str] | None = None
    ) -> ClientRecord:
        """New credentials, as the console creates them in a project: a new Client Id and
        a new secret, known from now on beside the others (old ones stay valid until
        :meth:`delete_credentials`).

        Args:
            registered: Registration date; today by default (the API key works).
            scopes: Scopes the client may request; ``None`` allows any.
        """
        client = replace(
            ClientRecord.generate(
                "emu-client-" + secrets.token_hex(4), registered or date.today()
            ),
            scopes=scopes,
        )
        self.clients[client.client_id] = client
        return client

    def delete_credentials(self, client: ClientRecord | str) -> None:
        """Delete credentials, as the console does: their token requests, their API key
        and every token issued to them are refused from now on.

        Raises:
            KeyError: no such credentials are known.
        """
        client_id = client if isinstance(client, str) else client.client_id
        del self.clients[client_id]
        self._deleted.add(client_id)
        for token in [t for t, issued in self._tokens.items() if issued.client_id == client_id]:
            del self._tokens[token]

    def client_of_token(self, token: str) -> str | None:
        """The Client Id a token was issued to (deleted since or not), or ``None``."""
        return self._issued_to.get(token)

    def revoke_tokens(self) -> None:
        """Revoke every token issued so far; clients still think them valid."""
        self._tokens.clear()

    def refuse_fields(self, count: int = 1) -> None:
        """Refuse the next ``count`` root fields from inside their resolvers.

        The request's credentials are accepted and execution starts; the resolver runs (a
        mutation's side effect happens and is recorded), then raises ``UNAUTHENTICATED``.
        graphql-core gives that error a ``path``, and because root fields are non-null the
        answer is ``{"data": null, "errors": [...]}``: the shape of a server that checks
        the token inside its resolvers. Whoever re-sends such a mutation runs it twice.
        """
        self._field_refusals += count

    def reset_counters(self) -> None:
        """Zero the counters and forget the recorded requests and mutations."""
        self.counters = Counters()
        self.requests.clear()
        self.mutations.clear()

    def record_mutation(self, field: str, arguments: dict[str, Any]) -> None:
        """Called by the schema's mutation resolvers when they change something."""
        self.counters.mutations_run += 1
        self.mutations.append(RecordedMutation(field, dict(arguments)))

    def take_field_refusal(self) -> bool:
        """Called by the schema's resolvers: whether this field is to be refused."""
        if self._field_refusals <= 0:
            return False
        self._field_refusals -= 1
        self.counters.unauthenticated_responses += 1
        return True

    # -- life cycle ------------------------------------------------------------------

    def app(self) -> web.Application:
        """The ``aiohttp.web`` application, for embedding in a server of your own."""
        app = web.Application()
        app.router.add_post(GRAPHQL_PATH, self._graphql)
        app.router.add_get(GRAPHQL_PATH, self._websocket)
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_get(COUNTERS_PATH, self._counters)
        return app

    async def _counters(self, request: web.Request) -> web.Response:
        return web.json_response(asdict(self.counters))

    async def start(self) -> None:
        """Start listening; :attr:`port` then holds the actual port."""
        # A test server should stop at once, not wait up to aiohttp's default 60 s for a
        # handler a latency knob keeps asleep.
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def close(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Emulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @contextlib.contextmanager
    def run_in_thread(self) -> Iterator[Emulator]:
        """Serve from a background thread with its own event loop, for sync callers."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            # A handler still asleep in a latency knob or a frozen token endpoint outlives
            # aiohttp's shutdown timeout: cancelled here, it is not left pending for the
            # garbage collector to report as "Task was destroyed but it is pending".
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.close()

        thread = threading.Thread(target=serve, name="gql-service-auth-emulator", daemon=True)
        thread.start()
        if not ready.wait(10):
            raise RuntimeError("the emulator did not start within 10 s")
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, **kwargs: Any) -> AsyncIterator[Emulator]:
        """``async with Emulator.running(token_ttl=5) as emulator:`` in one line."""
        async with cls(**kwargs) as emulator:
            yield emulator

    # -- token endpoint --------------------------------------------------------------

    async def _token(self, request: web.Request) -> web.StreamResponse:
        self.counters.token_requests += 1
        await self._held_by_outage()
        if self.token_latency:
            await asyncio.sleep(self.token_latency)
        form: dict[str, str] | None = None
        if request.content_type == "application/x-www-form-urlencoded":
            form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        self.requests.append(RecordedRequest(TOKEN_PATH, request.headers.copy(), form))
        if self._faults:
            fault = self._faults.popleft()
            return fault.response()
        if form is None:
            return self._oauth_error(
                400, "invalid_request", "use application/x-www-form-urlencoded"
            )
        if form.get("grant_type") != "client_credentials":
            return self._oauth_error(
                400, "unsupported_grant_type", "only client_credentials is supported"
            )
        client, refusal = self._authenticated(request, form)
        if refusal is not None:
            return refusal
        assert client is not None
        scope = form.get("scope")
        if scope and client.scopes is not None and not set(scope.split()) <= client.scopes:
            return self._oauth_error(400, "invalid_scope", "scope not allowed for this client")
        issued = self._issue(client, scope)
        if self.token_body_delay:
            return await self._send_in_halves(request, issued)
        return issued

    async def _held_by_outage(self) -> None:
        """Hold a token request until the token endpoint's outage ends.

        The end is re-read while held, so a call that ends or extends the outage (from any
        thread, hence polling rather than an asyncio.Event) applies to the requests it
        already holds.
        """
        for _ in range(100_000_000):  # bounded; the end of the outage ends it first
            frozen = self._token_frozen_until - time.monotonic()
            if frozen <= 0:
                return
            await asyncio.sleep(min(frozen, 0.02))

    def _authenticated(
        self, request: web.Request, form: Mapping[str, str]
    ) -> tuple[ClientRecord | None, web.Response | None]:
        """The client a token request authenticates as, or the response refusing it."""
        client_id, client_secret, error = self._client_auth(request, form)
        if error is not None:
            return None, error
        client = self.clients.get(client_id or "")
        if client_id in self._deleted:
            self.counters.deleted_credentials_used += 1
        if (
            client is None
            or client_secret is None
            or not hmac.compare_digest(client.client_secret.encode(), client_secret.encode())
        ):
            return None, self._oauth_error(401, "invalid_client", "client authentication failed")
        return client, None

    async def _send_in_halves(
        self, request: web.Request, response: web.Response
    ) -> web.StreamResponse:
        body = response.body
        assert isinstance(body, bytes)
        stream = web.StreamResponse(status=response.status, headers=response.headers)
        stream.enable_chunked_encoding()
        await stream.prepare(request)
        await stream.write(body[: len(body) // 2])
        await asyncio.sleep(self.token_body_delay)
        await stream.write(body[len(body) // 2 :])
        await stream.write_eof()
        return stream

    def _client_auth(
        self, request: web.Request, form: Mapping[str, str]
    ) -> tuple[str | None, str | None, web.Response | None]:
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            if "client_secret" in form:
                # RFC 6749 section 2.3: one authentication method per request.
                return (
                    None,
                    None,
                    self._oauth_error(
                        400, "invalid_request", "use one client authentication method"
                    ),
                )
            try:
                raw = base64.b64decode(header[6:].strip(), validate=True).decode()
            except ValueError:
                return None, None, self._oauth_error(401, "invalid_client", "bad Basic header")
            client_id, _, client_secret = raw.partition(":")
            return unquote_plus(client_id), unquote_plus(client_secret), None
        return form.get("client_id"), form.get("client_secret"), None

    def _issue(self, client: ClientRecord, scope: str | None) -> web.Response:
        token = "emu-token-" + secrets.token_urlsafe(24)
        self._tokens[token] = _Issued(client.client_id, self._clock() + self.token_ttl)
        self._issued_to[token] = client.client_id
        if len(self._issued_to) > 100_000:  # bounded: the oldest go first
            del self._issued_to[next(iter(self._issued_to))]
        self.counters.tokens_issued += 1
        body: dict[str, Any] = {"access_token": token, "token_type": BEARER_SCHEME}
        advertised = self.token_ttl if self.advertised_ttl is None else self.advertised_ttl
        ttl = int(advertised) if float(advertised).is_integer() else advertised
        if self.expires_in_override is not None:
            body["expires_in"] = self.expires_in_override
        elif self.expires_in_format == "number":
            body["expires_in"] = ttl
        elif self.expires_in_format == "string":
            body["expires_in"] = str(ttl)
        if scope:
            body["scope"] = scope
        # RFC 6749 section 5.1: token responses must not be cached.
        return web.Response(
            body=_json_bytes(body),
            content_type="application/json",
            headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
        )

    @staticmethod
    def _oauth_error(status: int, error: str, description: str) -> web.Response:
        return web.Response(
            status=status,
            body=_json_bytes({"error": error, "error_description": description}),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    # -- GraphQL endpoint ------------------------------------------------------------

    async def _graphql(self, request: web.Request) -> web.Response:
        self.counters.graphql_requests += 1
        self.requests.append(RecordedRequest(GRAPHQL_PATH, request.headers.copy()))
        if self.graphql_latency:
            await asyncio.sleep(self.graphql_latency)
        if self._graphql_faults:
            fault = self._graphql_faults.popleft()
            return fault.response()
        try:
            payload = await self._read_payload(request)
        except ValueError as exc:
            return self._errors_response([{"message": f"bad request: {exc}"}], status=400)
        refusal = self._authenticate(request.headers.get("Authorization"))
        if refusal is not None:
            self.counters.unauthenticated_responses += 1
            if self._refusal_answers:
                return self._refusal_answers.popleft().to(payload).response()
            return self._refuse(refusal, payload)
        if isinstance(payload, list):
            results = [await self._execute(item) for item in payload]
            return web.json_response(results)
        return web.json_response(await self._execute(payload))

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        return await _websocket.serve(
            request, self._authenticate, self._ws_execute, self._count_ws
        )

    async def _ws_execute(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        self.counters.graphql_requests += 1  # an operation over the websocket is one too
        return await self._execute(payload)

    def _count_ws(self, accepted: bool) -> None:
        self.counters.websocket_connections += 1
        if not accepted:
            self.counters.unauthenticated_responses += 1

    def _authenticate(self, header: str | None) -> str | None:
        """``None`` when the header is accepted, else the refusal's message."""
        if not header:
            return "missing Authorization header"
        scheme, _, credentials = header.partition(" ")
        if scheme == API_KEY_SCHEME:
            client_id, _, client_secret = credentials.partition(":")
            if client_id in self._deleted:
                self.counters.deleted_credentials_used += 1
            client = self.clients.get(client_id)
            if client is None or not hmac.compare_digest(
                client.client_secret.encode(), client_secret.encode()
            ):
                return "invalid API key"
            if not client.api_key_allowed:
                return (
                    "API key authentication is not available for credentials registered "
                    "before 2024-05-13: use an OAuth2 access token or create new credentials"
                )
            return None
        if scheme.lower() == BEARER_SCHEME.lower():
            issued = self._tokens.get(credentials)
            if issued is None and self._issued_to.get(credentials) in self._deleted:
                self.counters.deleted_credentials_used += 1
            if self.refuse_all_tokens or issued is None:
                return "invalid access token"
            if self._clock() >= issued.expires_at:
                return "access token expired"
            return None
        return f"unsupported Authorization scheme {scheme!r}"

    def _refuse(self, message: str, payload: object) -> web.Response:
        if not self.unauthenticated_body:
            return web.Response(status=self.unauthenticated_status)
        error = {"message": message, "extensions": {"code": UNAUTHENTICATED}}
        result = {"data": None, "errors": [error]}
        body = [result] * len(payload) if isinstance(payload, list) else result
        return web.json_response(body, status=self.unauthenticated_status)

    @staticmethod
    def _errors_response(errors: list[dict[str, Any]], *, status: int) -> web.Response:
        return web.json_response({"data": None, "errors": errors}, status=status)

    async def _read_payload(self, request: web.Request) -> dict[str, Any] | list[Any]:
        if request.content_type == "multipart/form-data":
            return await self._read_multipart(request)
        try:
            payload = json.loads(await request.read())
        except ValueError:
            raise ValueError("the body is not JSON") from None
        if isinstance(payload, dict) or (
            isinstance(payload, list) and payload and all(isinstance(p, dict) for p in payload)
        ):
            return payload
        raise ValueError("the body must be a JSON object or a list of them")

    async def _read_multipart(self, request: web.Request) -> dict[str, Any]:
        # The GraphQL multipart request specification: "operations", then "map", then files.
        operations: Any = None
        file_map: dict[str, list[str]] = {}
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise ValueError("nested multipart is not supported")
            if part.name == "operations":
                operations = json.loads(await part.text())
            elif part.name == "map":
                file_map = json.loads(await part.text())
            elif part.name in file_map:
                upload = UploadedFile(
                    part.filename, part.headers.get("Content-Type"), bytes(await part.read())
                )
                for path in file_map[part.name]:
                    _set_path(operations, path, upload)
        if not isinstance(operations, dict):
            raise ValueError("multipart request without operations")
        return operations

    async def _execute(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        query = payload.get("query")
        if not isinstance(query, str):
            return {"data": None, "errors": [{"message": "query must be a string"}]}
        variables = payload.get("variables")
        result: ExecutionResult = await graphql(
            self._schema,
            query,
            variable_values=variables if isinstance(variables, dict) else None,
            operation_name=payload.get("operationName"),
            context_value={"state": self},
        )
        return result.formatted  # type: ignore[return-value]


def _set_path(target: Any, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


@contextlib.contextmanager
def environ_or_emulator(
    environ: Mapping[str, str] | None = None, *, legacy: bool = False, **knobs: Any
) -> Iterator[tuple[Mapping[str, str], Emulator | None]]:
    """The configured service if ``SERVICE_BASE_URL`` is set, else an emulator started here.

    For scripts that should run anywhere: against the real service when it is configured,
    offline otherwise. The emulator serves from a thread, so sync and async code can use it.

    Args:
        environ: Where to look for ``SERVICE_*``; ``os.environ`` when ``None``.
        legacy: Use the emulator's client registered before 2024-05-13.
        **knobs: Emulator attributes to set (``token_ttl=2``...).

    Yields:
        ``(environ, emulator)``: the variables to build transports from, and the emulator,
        or ``None`` when the configured service is used.
    """
    environ = os.environ if environ is None else environ
    if environ.get(ENV_BASE_URL, "").strip():
        yield environ, None
        return
    emulator = Emulator()
    for name, value in knobs.items():
        if name.startswith("_") or not hasattr(emulator, name):
            raise TypeError(f"the emulator has no knob {name!r}")
        setattr(emulator, name, value)
    with emulator.run_in_thread() as running:
        client = running.legacy_client if legacy else running.recent_client
        yield running.environ(client), running
