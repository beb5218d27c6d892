"""What the application sees when something is wrong, on every stack and both methods:
errors that name the URL or variable at fault, the bound that ran out and what to do, and
that stay the classes gql raises (``except`` clauses written for gql keep catching them).

Each call is made as an application makes it: gql's sync execute on a sync stack, an
async session on an async one.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from gql import Client
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportQueryError,
    TransportServerError,
)
from support import COUNT, HANG_GUARD, NO_WAIT, closed_port, shown

from gql_service_auth import (
    ApiKeyTransport,
    ConfigurationError,
    OAuth2Transport,
    RetryPolicy,
    ServiceHTTPError,
    ServiceTimeoutError,
    ServiceUnreachableError,
    TokenRequestError,
    UnauthenticatedError,
)
from gql_service_auth.emulator import Emulator
from gql_service_auth.httpx import (
    ApiKeyHTTPXAsyncTransport,
    ApiKeyHTTPXTransport,
    OAuth2HTTPXAsyncTransport,
    OAuth2HTTPXTransport,
)
from gql_service_auth.requests import ApiKeyRequestsTransport, OAuth2RequestsTransport

CLASSES: dict[str, tuple[type[Any], type[Any]]] = {
    "aiohttp": (ApiKeyTransport, OAuth2Transport),
    "requests": (ApiKeyRequestsTransport, OAuth2RequestsTransport),
    "httpx": (ApiKeyHTTPXTransport, OAuth2HTTPXTransport),
    "httpx-async": (ApiKeyHTTPXAsyncTransport, OAuth2HTTPXAsyncTransport),
}
ASYNC_STACKS = ("aiohttp", "httpx-async")
ASYNC_CLASSES = tuple(cls for stack in ASYNC_STACKS for cls in CLASSES[stack])
CASES = [f"{stack}-{method}" for stack in CLASSES for method in ("api_key", "oauth2")]
OAUTH2_CASES = [case for case in CASES if case.endswith("oauth2")]


def make(case: str, emulator: Emulator, url: str | None = None, **kwargs: Any) -> Any:
    """A transport of ``case`` ("stack-method") for the emulator's recent client."""
    stack, _, method = case.rpartition("-")
    api_key, oauth2 = CLASSES[stack]
    client = emulator.recent_client
    kwargs = {"client_id": client.client_id, "client_secret": client.client_secret, **kwargs}
    url = url or emulator.graphql_url
    if method == "api_key":
        return api_key(url, **kwargs)
    kwargs = {"token_url": emulator.token_url, "retry": NO_WAIT, **kwargs}
    return oauth2(url, **kwargs)


def execute(transport: Any, execute_timeout: float = HANG_GUARD) -> Any:
    """The query, as an application runs it: gql's sync execute on a sync stack, an async
    session on asyncio on an async one (gql's sync execute would leave an event loop of its
    own unclosed in this thread, which another test's collector then finds)."""
    client = Client(transport=transport, execute_timeout=execute_timeout)
    if not isinstance(transport, ASYNC_CLASSES):
        return client.execute(COUNT)

    async def run() -> Any:
        async with client as session:
            return await session.execute(COUNT)

    return asyncio.run(run())


class Loopback:
    """A server on 127.0.0.1 whose thread hands each connection to :meth:`handle`."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.socket.settimeout(0.1)  # a blocked accept() does not wake when closed
        self.port: int = self.socket.getsockname()[1]
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def handle(self, connection: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.handle(connection)

    def close(self) -> None:
        self._closing.set()
        self._thread.join(HANG_GUARD)
        self.socket.close()


class Silent(Loopback):
    """Accepts connections and never answers; ``reached`` is set once one came."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._held: list[socket.socket] = []
        super().__init__()

    def handle(self, connection: socket.socket) -> None:
        self._held.append(connection)
        self.reached.set()

    def close(self) -> None:
        super().close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def silent_port(silent: Silent) -> int:
    """A port on 127.0.0.1 that accepts connections and never answers."""
    return silent.port


@pytest.fixture
def proxy_is(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], str]:
    """Points the environment's plain-http proxy at a port, as HTTP_PROXY does."""

    def point(port: int) -> str:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        proxy = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("http_proxy", proxy)
        return proxy

    return point


@pytest.mark.parametrize("case", CASES)
def test_a_url_where_nothing_answers_graphql_is_named_with_its_variable(
    emulator: Emulator, case: str
) -> None:
    """A wrong path (or the authorization server's address as the API): gql's
    TransportServerError, code 404, that names the URL and SERVICE_BASE_URL."""
    url = f"{emulator.base_url}/nothing/graphql"
    with pytest.raises(ServiceHTTPError) as caught:
        execute(make(case, emulator, url))
    error = caught.value
    assert isinstance(error, TransportServerError)
    assert error.code == 404
    assert f"nothing answers GraphQL at {url} (HTTP 404)" in str(error)
    assert "check SERVICE_BASE_URL (the API host, to which from_env() appends /graphql)" in str(
        error
    )
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("case", CASES)
def test_a_gateway_that_fails_says_to_try_later_and_keeps_the_stacks_error(
    emulator: Emulator, case: str
) -> None:
    """A 502 with no GraphQL body: code 502, gql's message first, the stack's error (with
    the response on requests and httpx) as the cause, as with gql's transport."""
    emulator.fail_graphql_requests(1, 502, body=b"bad gateway")
    with pytest.raises(ServiceHTTPError) as caught:
        execute(make(case, emulator))
    error = caught.value
    assert error.code == 502
    assert "unavailable (HTTP 502): try again later" in str(error)
    assert not isinstance(error.__cause__, TransportServerError)
    assert error.__cause__ is not None


@pytest.mark.parametrize("case", CASES)
def test_an_api_that_never_answers_names_the_transports_timeout(
    emulator: Emulator, case: str, silent_port: int
) -> None:
    """The transport's own timeout runs out: gql's TransportConnectionFailed, with the URL,
    the bound and the variable to check."""
    url = f"http://127.0.0.1:{silent_port}/graphql"
    with pytest.raises(ServiceUnreachableError) as caught:
        execute(make(case, emulator, url, timeout=1))
    error = caught.value
    assert isinstance(error, TransportConnectionFailed)
    assert f"no answer from {url} within 1 s (the transport's timeout)" in str(error)
    assert "check SERVICE_BASE_URL" in str(error)


@pytest.mark.parametrize("case", [k for k in CASES if k.startswith(ASYNC_STACKS)])
def test_an_api_that_never_answers_names_the_calls_deadline(
    emulator: Emulator, case: str, silent_port: int
) -> None:
    """gql's execute_timeout runs out (an async stack with no timeout of its own): a
    TimeoutError, as gql raises, that names the URL and the deadline, not an empty one."""
    url = f"http://127.0.0.1:{silent_port}/graphql"
    with pytest.raises(ServiceTimeoutError) as caught:
        execute(make(case, emulator, url), execute_timeout=1)
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert f"no answer from {url} within the 1 s of gql's execute_timeout" in str(error)


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_gqls_deadline_on_trio_is_named_too(
    emulator: Emulator, method: str, silent_port: int
) -> None:
    """httpx under trio, gql's execute_timeout: the same TimeoutError."""
    trio = pytest.importorskip("trio")
    url = f"http://127.0.0.1:{silent_port}/graphql"
    transport = make(f"httpx-async-{method}", emulator, url)

    async def call() -> None:
        async with Client(transport=transport, execute_timeout=1) as session:
            await session.execute(COUNT)

    with pytest.raises(ServiceTimeoutError, match=f"no answer from {url} within the 1 s"):
        trio.run(call)


@pytest.mark.parametrize(
    ("case", "library"),
    [
        *((case, "asyncio") for case in CASES if case.startswith(ASYNC_STACKS)),
        ("httpx-async-api_key", "trio"),
        ("httpx-async-oauth2", "trio"),
    ],
)
def test_a_deadline_of_the_callers_own_moves_on_as_it_means_to(
    emulator: Emulator, case: str, library: str, silent_port: int
) -> None:
    """An anyio or trio move_on_after around a query: its scope catches its cancellation
    and moves on, as with gql's own transports; only gql's execute_timeout is told as our
    error. A fail_after of the caller's raises its own TimeoutError."""
    transport = make(case, emulator, f"http://127.0.0.1:{silent_port}/graphql")
    caught: list[bool] = []

    async def call() -> None:
        async with Client(transport=transport, execute_timeout=HANG_GUARD) as session:
            with anyio.move_on_after(0.3) as scope:
                await session.execute(COUNT)
            caught.append(scope.cancelled_caught)
            with pytest.raises(TimeoutError) as raised:
                with anyio.fail_after(0.3):
                    await session.execute(COUNT)
            assert not isinstance(raised.value, ServiceTimeoutError)

    anyio.run(call, backend=library)
    assert caught == [True]


@pytest.mark.parametrize("case", [k for k in CASES if k.startswith(ASYNC_STACKS)])
async def test_a_cancellation_that_is_no_deadline_stays_a_cancellation(
    emulator: Emulator, case: str, silent: Silent
) -> None:
    """A task cancelled while the query waits: CancelledError, as ever, not our error."""
    transport = make(case, emulator, f"http://127.0.0.1:{silent.port}/graphql")
    async with Client(transport=transport, execute_timeout=HANG_GUARD) as session:
        call = asyncio.ensure_future(session.execute(COUNT))
        reached = await asyncio.to_thread(silent.reached.wait, HANG_GUARD)
        assert reached
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


@pytest.mark.parametrize("case", CASES)
def test_a_refused_connection_names_the_url(emulator: Emulator, case: str) -> None:
    """Nothing listens: gql's TransportConnectionFailed, naming the URL to check."""
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}/graphql"
        with pytest.raises(ServiceUnreachableError) as caught:
            execute(make(case, emulator, url, timeout=HANG_GUARD))
    assert f"could not reach {url}" in str(caught.value)
    assert "check SERVICE_BASE_URL" in str(caught.value)


@pytest.mark.parametrize("case", [k for k in CASES if not k.startswith("aiohttp")])
def test_a_proxy_from_the_environment_is_named(
    emulator: Emulator, case: str, silent_port: int, proxy_is: Callable[[int], str]
) -> None:
    """requests and httpx follow HTTP_PROXY: a proxy that never answers is named, for
    the query and for the token request, rather than blamed on the URLs."""
    proxy_is(silent_port)
    policy = RetryPolicy(attempts=1, timeout=1, wait_initial=0, wait_max=0, wait_jitter=0)
    extra = {"retry": policy} if case.endswith("oauth2") else {}
    error_class = TokenRequestError if case.endswith("oauth2") else ServiceUnreachableError
    with pytest.raises(error_class) as caught:
        execute(make(case, emulator, timeout=1, **extra))
    assert f"through the proxy 127.0.0.1:{silent_port} (HTTP_PROXY)" in str(caught.value)
    assert "NO_PROXY" in str(caught.value)
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("case", OAUTH2_CASES)
def test_a_token_endpoint_that_never_answers_is_named_with_its_bound(
    emulator: Emulator, case: str, silent_port: int
) -> None:
    """The token URL hangs: the URL, the bound that ran out and the variable, no query."""
    token_url = f"http://127.0.0.1:{silent_port}/oauth2/token"
    policy = RetryPolicy(attempts=1, timeout=0.5, wait_initial=0, wait_max=0, wait_jitter=0)
    with pytest.raises(TokenRequestError) as caught:
        execute(make(case, emulator, token_url=token_url, retry=policy, timeout=HANG_GUARD))
    message = str(caught.value)
    assert token_url in message
    assert " within " in message
    assert "SERVICE_AUTH_URL" in message
    assert isinstance(caught.value, TransportQueryError)
    assert emulator.counters.graphql_requests == 0


@pytest.mark.parametrize("case", OAUTH2_CASES)
def test_tokens_that_expire_on_the_way_are_told_as_such(
    live_emulator: Emulator, case: str
) -> None:
    """Requests that wait longer than a token lives (a queue, a slow network; here the
    service reads them late): the error says the tokens expired on the way, not that the
    environments differ, and such refusals do not pause renewals."""
    live_emulator.token_ttl = 1.0
    live_emulator.graphql_latency = 1.2  # it reads the token after the wait
    transport = make(case, live_emulator, max_renewals=1, timeout=HANG_GUARD)
    with pytest.raises(UnauthenticatedError) as caught:
        execute(transport)
    message = str(caught.value)
    assert "had expired before the service read the request" in message
    assert "(1 s)" in message
    assert "same environment" not in message
    live_emulator.graphql_latency = 0.0
    live_emulator.token_ttl = 3600.0
    # Not a pause: the next call fetches a token and succeeds.
    assert execute(transport) == {"carriers": {"totalCount": 25}}


@pytest.mark.parametrize("stack_name", list(CLASSES))
def test_a_store_url_with_two_slashes_names_the_variable_and_the_value(
    emulator: Emulator, stack_name: str
) -> None:
    """SERVICE_TOKEN_STORE_URL=file://tokens: the message quotes the user's value, names
    the variable and says what is wrong, not the docs' example alone."""
    environ = {**emulator.environ(), "SERVICE_TOKEN_STORE_URL": "file://tokens"}
    with pytest.raises(ConfigurationError) as caught:
        CLASSES[stack_name][1].from_env(environ)
    message = str(caught.value)
    assert message.startswith("SERVICE_TOKEN_STORE_URL: 'file://tokens' names the host 'tokens'")
    assert "three slashes" in message


def test_a_store_url_with_a_password_is_quoted_without_it(emulator: Emulator) -> None:
    """A URL of no known form is quoted, with its password masked."""
    environ = {**emulator.environ(), "SERVICE_TOKEN_STORE_URL": "memcached://u:hunter2@h:1"}
    with pytest.raises(ConfigurationError) as caught:
        OAuth2Transport.from_env(environ)
    assert "'memcached://u:***@h:1'" in str(caught.value)
    assert "hunter2" not in str(caught.value)


class OneAnswer(Loopback):
    """Reads each request's head and answers it with ``reply`` (a status line), echoing
    the head in a header and the body (a proxy's error page that quotes what it was
    sent), or, with ``reply=None``, closes the connection unanswered."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        super().__init__()

    def handle(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(HANG_GUARD)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                head += chunk
            self.heads.append(head)
            if self.reply is not None:
                body = head  # what a debug page shows: the request it was sent
                connection.sendall(
                    self.reply
                    + b"Content-Type: text/plain\r\nConnection: close\r\n"
                    + b"X-Echo: "
                    + head.replace(b"\r\n", b" | ")
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )


@pytest.fixture
def one_answer() -> Iterator[Callable[[bytes | None], OneAnswer]]:
    servers: list[OneAnswer] = []

    def start(reply: bytes | None) -> OneAnswer:
        servers.append(OneAnswer(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("case", CASES)
def test_a_connection_dropped_after_the_request_says_it_may_have_run(
    emulator: Emulator, case: str, one_answer: Callable[[bytes | None], OneAnswer]
) -> None:
    """The service read the request and closed the connection: not "could not reach",
    which invites a retry of a mutation that may have run, but what may have happened."""
    server = one_answer(None)
    url = f"http://127.0.0.1:{server.port}/graphql"
    with pytest.raises(ServiceUnreachableError) as caught:
        execute(make(case, emulator, url, timeout=HANG_GUARD))
    assert "the request may have reached the service" in str(caught.value)
    assert "could not reach" not in str(caught.value)
    assert server.heads


@pytest.mark.parametrize("case", CASES)
def test_a_certificate_that_fails_verification_is_told_as_tls(
    emulator: Emulator, case: str, tmp_path: Any
) -> None:
    """An https API whose certificate is not trusted: a TLS failure, with what to check,
    not a URL to fix."""
    import ssl
    import subprocess
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=HANG_GUARD,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        # A path with words OpenSSL uses for a plain-http answer: a certificate failure
        # is still told as one (requests' error text quotes the path).
        url = f"https://127.0.0.1:{server.server_address[1]}/http-request/graphql"
        with pytest.raises(ServiceUnreachableError) as caught:
            execute(make(case, emulator, url, timeout=HANG_GUARD))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(HANG_GUARD)
    assert f"the TLS connection to {url} failed" in str(caught.value)


@pytest.mark.parametrize("case", CASES)
def test_an_https_url_to_a_plain_http_port_says_so(emulator: Emulator, case: str) -> None:
    """The TLS handshake meets an http server (the emulator): no certificate to check,
    the URL's scheme to fix."""
    url = emulator.graphql_url.replace("http://", "https://")
    with pytest.raises(ServiceUnreachableError) as caught:
        execute(make(case, emulator, url, timeout=HANG_GUARD))
    assert f"the server at {url} answered in plain http, not TLS" in str(caught.value)
    assert "SERVICE_BASE_URL" in str(caught.value)
    assert "certificate" not in str(caught.value).rpartition(": the server at")[2]


@pytest.mark.parametrize("case", [k for k in CASES if not k.startswith("aiohttp")])
def test_an_https_proxy_url_to_a_plain_http_port_names_the_proxy_too(
    emulator: Emulator, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handshake that met plain http may be the proxy's: its URL is named as a
    suspect beside the API's, not the API's alone."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy = emulator.base_url.replace("http://", "https://")
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    monkeypatch.setenv("https_proxy", proxy)
    with closed_port() as port, pytest.raises(ServiceUnreachableError) as caught:
        execute(
            make(
                f"{case.rpartition('-')[0]}-api_key", emulator, f"https://127.0.0.1:{port}/graphql"
            )
        )
    message = str(caught.value)
    assert "answered in plain http, not TLS" in message
    assert "or the proxy's URL" in message


@pytest.mark.parametrize("case", OAUTH2_CASES)
def test_an_https_token_url_to_a_plain_http_port_says_so_and_is_not_retried(
    emulator: Emulator, case: str
) -> None:
    token_url = emulator.token_url.replace("http://", "https://")
    retry = RetryPolicy(attempts=4, wait_initial=0, wait_max=0, wait_jitter=0)
    with pytest.raises(TokenRequestError) as caught:
        execute(make(case, emulator, token_url=token_url, retry=retry))
    message = str(caught.value)
    assert f"the token endpoint {token_url} answered in plain http, not TLS" in message
    assert "SERVICE_AUTH_URL" in message
    assert caught.value.attempts == 1  # a URL to fix: no retry heals it


@pytest.mark.parametrize("case", [k for k in CASES if not k.startswith("aiohttp")])
def test_a_proxy_that_refuses_is_named_and_its_login_never_shown(
    emulator: Emulator,
    case: str,
    one_answer: Callable[[bytes | None], OneAnswer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy answering 407 with the request it was sent (its login among it): the
    error says the proxy refused, and nothing in its chain holds the login."""
    proxy = one_answer(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    login = f"http://proxyuser:proxy-pass-5e1f@127.0.0.1:{proxy.port}"
    monkeypatch.setenv("HTTP_PROXY", login)
    monkeypatch.setenv("http_proxy", login)
    extra = {"retry": NO_WAIT} if case.endswith("oauth2") else {}
    transport = make(case, emulator, timeout=HANG_GUARD, **extra)
    with pytest.raises((ServiceHTTPError, TokenRequestError)) as caught:
        execute(transport)
    assert "407" in str(caught.value)
    assert "proxy" in str(caught.value).lower()
    basic = __import__("base64").b64encode(b"proxyuser:proxy-pass-5e1f").decode()
    assert any(basic.encode() in head for head in proxy.heads)  # it was sent, and echoed
    assert shown(caught.value, ["proxy-pass-5e1f", basic]) == []


@pytest.mark.parametrize(
    "case", [k for k in CASES if not k.startswith("aiohttp") and k.endswith("api_key")]
)
def test_a_proxy_is_named_when_the_request_went_through_it(
    emulator: Emulator,
    case: str,
    silent: Silent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NO_PROXY as a CIDR block, which requests honours, and httpx as its version does
    (httpx2 yes, httpx 0.28 no): the message names the proxy when, and only when, the
    request went through it."""
    for name in ("ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.0/8")
    monkeypatch.setenv("no_proxy", "127.0.0.0/8")
    url = f"http://127.0.0.1:{silent.port}/graphql"
    with pytest.raises(ServiceUnreachableError) as caught:
        execute(make(case, emulator, url, timeout=1))
    direct = silent.reached.is_set()
    assert ("through the proxy 127.0.0.1:9" in str(caught.value)) is not direct
    if direct:
        assert f"no answer from {url} within 1 s" in str(caught.value)
    if case.startswith("requests"):
        assert direct  # requests reads the CIDR block


@pytest.mark.parametrize("case", [k for k in OAUTH2_CASES if k.startswith(ASYNC_STACKS)])
def test_a_query_that_waits_past_its_tokens_life_blames_the_api(
    live_emulator: Emulator, case: str, silent: Silent
) -> None:
    """The token came, the query went, the API never answered while the token expired:
    gql's deadline names the API, not the token endpoint."""
    live_emulator.token_ttl = 1.0
    url = f"http://127.0.0.1:{silent.port}/graphql"
    with pytest.raises(ServiceTimeoutError) as caught:
        execute(make(case, live_emulator, url), execute_timeout=2.5)
    assert silent.reached.is_set()
    assert f"no answer from {url}" in str(caught.value)
    assert "token" not in str(caught.value)


def test_the_errors_of_no_answer_survive_copy_and_pickle(emulator: Emulator) -> None:
    """Process pools and task queues pickle exceptions: the code and message survive."""
    import copy
    import pickle

    url = f"{emulator.base_url}/nothing/graphql"
    with pytest.raises(ServiceHTTPError) as caught:
        execute(make("requests-api_key", emulator, url))
    for twin in (pickle.loads(pickle.dumps(caught.value)), copy.copy(caught.value)):
        assert isinstance(twin, ServiceHTTPError)
        assert twin.code == 404
        assert str(twin) == str(caught.value)
    for error in (ServiceUnreachableError("m"), ServiceTimeoutError("m")):
        assert str(pickle.loads(pickle.dumps(error))) == "m"


def test_a_store_url_with_a_password_in_its_query_is_quoted_without_it(
    emulator: Emulator,
) -> None:
    environ = {**emulator.environ(), "SERVICE_TOKEN_STORE_URL": "valkey://h:1/0?password=hunter2"}
    with pytest.raises(ConfigurationError) as caught:
        OAuth2Transport.from_env(environ)
    assert "hunter2" not in str(caught.value)
    assert "'valkey://h:1/0?***'" in str(caught.value)
