"""gql transports that authenticate to the service: drop-in ``AIOHTTPTransport`` subclasses.

The aiohttp adapter. What an answer means and whether a request goes again is decided by
the core (:mod:`gql_service_auth._core.refusal`, :mod:`gql_service_auth._core.flow`); tokens are
the business of :class:`~gql_service_auth._core.tokens.TokenManager`; the aiohttp plumbing
(sessions per loop, uploads per task) is in :mod:`gql_service_auth._stacks.aiohttp`. Here is
what ties them to gql's ``AIOHTTPTransport``, and the fast path of a request.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncGenerator, Callable, Mapping

# aiohttp's LooseCookies names these in strings: typing.get_type_hints() of the options
# and constructors (pydantic, cattrs, IDEs) looks them up in this module.
from http.cookies import BaseCookie, Morsel  # noqa: F401
from ssl import SSLContext
from time import monotonic
from typing import Any, TypedDict

from aiohttp.client_reqrep import Fingerprint
from aiohttp.typedefs import LooseCookies, LooseHeaders
from gql.graphql_request import GraphQLRequest
from gql.transport.exceptions import TransportError
from graphql import ExecutionResult
from yarl import URL

from ._core.credentials import ClientCredentials
from ._core.errors import UnauthenticatedError
from ._core.redact import clear_locals, forgets_on_error
from ._core.refusal import is_refusal
from ._core.rotation import CredentialsGiven, credentials_of, refused
from ._core.settings import api_key_env, oauth2_env
from ._core.token import AccessToken
from ._stacks.aiohttp import (
    AuthenticatingTransport,
    transport_error,
    with_authorization,
)
from ._stacks.aiohttp_renewal import RenewingTransport, bearer_header
from ._stacks.gql import (
    Bare401,
    api_key_error,
    bare_401,
    callers_own,
    first_token,
    guarded,
    rebuild,
    scrubbed,
    sent,
    snapshot,
    subscription_refused,
)
from ._stacks.options import TokenOptions, check_known, oauth2_settings

# At run time: typing.get_type_hints() of the constructors resolves Unpack.
if sys.version_info >= (3, 11):
    from typing import Self, Unpack
else:
    from typing_extensions import Self, Unpack

__all__ = [
    "AIOHTTPTransportOptions",
    "ApiKeyOptions",
    "ApiKeyTransport",
    "OAuth2Options",
    "OAuth2Transport",
]


class AIOHTTPTransportOptions(TypedDict, total=False):
    """The keywords of gql's ``AIOHTTPTransport``, all passed through unchanged.

    ``auth`` is left out on purpose: aiohttp cannot combine it with the ``Authorization``
    header these transports send, so it is refused.
    """

    headers: LooseHeaders | None
    cookies: LooseCookies | None
    ssl: SSLContext | bool | Fingerprint
    timeout: int | None
    ssl_close_timeout: int | float | None
    json_serialize: Callable[..., str]
    json_deserialize: Callable[..., Any]
    client_session_args: dict[str, Any] | None


class OAuth2Options(AIOHTTPTransportOptions, TokenOptions, total=False):
    """The optional keywords of :class:`OAuth2Transport`, for :meth:`OAuth2Transport.from_env`:
    gql's (:class:`AIOHTTPTransportOptions`) and the token's
    (:class:`~gql_service_auth.TokenOptions`)."""


class ApiKeyOptions(AIOHTTPTransportOptions, total=False):
    """The optional keywords of :class:`ApiKeyTransport`, for :meth:`ApiKeyTransport.from_env`."""

    allow_insecure_http: bool


class ApiKeyTransport(AuthenticatingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with the service's API key.

    Sends ``Authorization: SERVICE-API-KEY <client_id>:<client_secret>`` on every request;
    no token is ever requested. Credentials registered before 2024-05-13 cannot be used
    this way: use :class:`OAuth2Transport` for them.

    After ``url`` come gql's ``AIOHTTPTransport`` arguments, in gql's order (``headers``,
    ``cookies``, ``auth``, ``ssl``, ``timeout``, ``ssl_close_timeout``, ``json_serialize``,
    ``json_deserialize``, ``client_session_args``); ``auth`` must stay ``None``.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``: a str or a ``yarl.URL``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        credentials: In place of ``client_id`` and ``client_secret``: credentials that
            can change without a restart (a :class:`~gql_service_auth.CredentialsFile`,
            :class:`~gql_service_auth.CredentialsFiles`,
            :class:`~gql_service_auth.CredentialsCallback`, or a callable returning
            ``(client_id, client_secret)``); see docs/rotating-credentials.md.
        allow_insecure_http: Allow a plain ``http://`` URL to a host that is not loopback.

    Raises:
        ConfigurationError: bad credentials format, unsafe URL, ``auth`` given, or an
            ``Authorization`` entry in ``headers``.
    """

    @forgets_on_error
    def __init__(
        self,
        url: str | URL,
        headers: LooseHeaders | None = None,
        cookies: LooseCookies | None = None,
        auth: None = None,
        ssl: SSLContext | bool | Fingerprint = True,
        timeout: int | None = None,
        ssl_close_timeout: int | float | None = 10,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        client_session_args: dict[str, Any] | None = None,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        credentials: CredentialsGiven | None = None,
        allow_insecure_http: bool = False,
    ) -> None:
        self._credentials = credentials_of(client_id, client_secret, credentials)
        super().__init__(
            url, headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args, allow_insecure_http=allow_insecure_http,
        )  # fmt: skip

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[ApiKeyOptions],
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` (``/graphql`` is appended unless it ends with it),
        ``SERVICE_CLIENT_ID`` and ``SERVICE_CLIENT_SECRET``. A setting given by keyword
        wins: its variable is then not read.

        Args:
            environ: Where to read the variables; the process environment by default.
            url: The GraphQL endpoint; ``None`` reads ``SERVICE_BASE_URL``.
            client_id: The Client Id; ``None`` reads ``SERVICE_CLIENT_ID``.
            client_secret: The Client Secret; ``None`` reads ``SERVICE_CLIENT_SECRET``.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        return cls(
            **api_key_env(environ, url=url, client_id=client_id, client_secret=client_secret),
            **kwargs,
        )

    def _secrets(self) -> list[str]:
        return [self._credentials.client_secret]

    def _key_error(self, raw: object, secrets: list[str] | None = None) -> BaseException:
        """The error of a refusal (``raw``), or ``raw`` itself when it is no refusal of the
        key; credentials that can change are read again soon after a refusal."""
        error = api_key_error(raw, self._secrets() if secrets is None else secrets)
        refused(self._credentials)
        return error

    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with the API key; see gql's ``AIOHTTPTransport.execute``.

        Raises:
            ApiKeyRejectedError: the service refused the key. Not retried: it cannot change.
        """
        # The boundary of forgets_on_error, inline (see _post): the frames below are
        # cleared, and this one's locals show no secret once the few below are dropped (an
        # answer with errors is scrubbed in place as it arrives).
        started = monotonic()
        try:
            if extra_args:
                extra_args, given = callers_own(extra_args)
                if given:
                    return await self._execute_given(request, extra_args, upload_files)
            # The pair in use now: credentials that can change swap it for another.
            posting = self._post(
                request, extra_args, upload_files, self._credentials.current, _API_KEY_HEADER
            )
            try:
                async with posting as response:
                    answer = await self._prepare_result(response)
                    if answer.errors:  # scrubbed in place before any other wait
                        scrubbed(answer, self._secrets())
            except Exception as exc:
                failed = transport_error(exc)
                error = bare_401(failed, self._secrets())
                raise self._key_error(error) from failed
            finally:
                if upload_files:
                    self._close_upload()
            if answer.errors and is_refusal(answer.errors):
                raise self._key_error(answer)
            return answer
        except BaseException as exc:
            clear_locals(exc)
            # Shown by repr: the answer's headers (which may echo the key), a per-request
            # proxy's password or cookie. What else this frame holds shows no secret.
            call_timeout = extra_args.get("timeout") if extra_args else None
            response = answer = extra_args = None  # type: ignore[assignment]
            failure = self._unanswered(exc, started, None, call_timeout)
            if failure is exc:
                raise
            raise failure  # noqa: B904 - its cause is set: gql's error, or none

    @forgets_on_error
    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with the API key; see gql's ``AIOHTTPTransport.execute_batch``.

        Raises:
            ApiKeyRejectedError: the service refused the key for any request of the batch.
        """
        extra_args, given = callers_own(extra_args)
        if given:
            return await self._batch_as_given(reqs, extra_args)
        args = with_authorization(extra_args, self._credentials.api_key_authorization())
        started = monotonic()
        try:
            answers = await super().execute_batch(reqs, extra_args=args)
        except TransportError as exc:
            try:
                refused_key = bare_401(exc, self._secrets())
            except BaseException as other:
                failure = self._unanswered(other, started)
                if failure is other:
                    raise
                raise failure from failure.__cause__  # the stack's error, as execute's
            raise self._counted(self._key_error(refused_key)) from exc
        except BaseException as exc:
            failure = self._unanswered(exc, started)
            if failure is exc:
                raise
            raise failure  # noqa: B904 - no cause: a deadline passed
        if any(is_refusal(answer.errors) for answer in answers):
            raise self._counted(self._key_error(answers))
        return scrubbed(answers, self._secrets())

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with the API key; see gql's ``subscribe``."""
        extra_args, given = callers_own(extra_args)
        if given:  # the caller's own Authorization: sent as it is
            stream = self._subscribe_given(request, extra_args)
        else:
            stream = guarded(
                super().subscribe(
                    request,
                    extra_args=with_authorization(
                        extra_args, self._credentials.api_key_authorization()
                    ),
                ),
                self._secrets,
                on_refusal=_nothing,
                on_401=lambda bare: self._key_error(bare, []),
            )
        async with contextlib.aclosing(stream):
            async for result in stream:
                yield result


class OAuth2Transport(RenewingTransport):
    """A gql ``AIOHTTPTransport`` that authenticates with OAuth 2.0 client-credentials tokens.

    The first request fetches a token; concurrent requests share one fetch; a token is
    renewed ``refresh_margin`` seconds before it expires; and when the service answers
    ``UNAUTHENTICATED`` (or HTTP 401 without a body) to a request that ran nothing, the
    token is renewed and the request sent again, up to ``max_renewals`` times.

    After ``url`` come gql's ``AIOHTTPTransport`` arguments, in gql's order (``headers``,
    ``cookies``, ``auth``, ``ssl``, ``timeout``, ``ssl_close_timeout``, ``json_serialize``,
    ``json_deserialize``, ``client_session_args``); ``auth`` must stay ``None``. ``ssl``
    also applies to the token endpoint; ``headers`` and ``cookies`` do not, nor does
    ``client_session_args`` beyond its proxy settings (``trust_env``, ``proxy``,
    ``proxy_auth``), which the token request follows unless ``token_session_args`` says
    otherwise.

    Args:
        url: The GraphQL endpoint, ``{base_url}/graphql``: a str or a ``yarl.URL``.
        token_url: The token endpoint, ``{auth_url}/oauth2/token``: a str or a ``yarl.URL``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        **options: The keywords of the token and its renewal, each with a default:
            ``scope``, ``token_params``, ``token_auth_method``, ``refresh_margin``,
            ``default_expires_in``, ``max_renewals``, ``retry``, ``on_event``, ``clock``,
            ``allow_insecure_http``, ``token_session_args``, ``token_proxy``,
            ``token_store``, ``share_tokens``: see :class:`~gql_service_auth.TokenOptions`.
            Every OAuth2 transport and auth object, of every stack, takes them.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """

    @forgets_on_error
    def __init__(
        self,
        url: str | URL,
        headers: LooseHeaders | None = None,
        cookies: LooseCookies | None = None,
        auth: None = None,
        ssl: SSLContext | bool | Fingerprint = True,
        timeout: int | None = None,
        ssl_close_timeout: int | float | None = 10,
        json_serialize: Callable[..., str] = json.dumps,
        json_deserialize: Callable[..., Any] = json.loads,
        client_session_args: dict[str, Any] | None = None,
        *,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        **options: Unpack[TokenOptions],
    ) -> None:
        caller = f"{type(self).__name__}.__init__"
        check_known(options, caller)
        super().__init__(
            url, headers, cookies, auth, ssl, timeout, ssl_close_timeout, json_serialize,
            json_deserialize, client_session_args,
            allow_insecure_http=options.get("allow_insecure_http", False),
        )  # fmt: skip
        settings = oauth2_settings(
            token_url,
            client_id,
            client_secret,
            options,
            caller=caller,
            ssl=ssl,
            inherited=client_session_args,
        )
        rules = settings.rules(url)
        self.token_url = token_url
        self._credentials = rules.credentials
        self._max_renewals = rules.max_renewals
        self._refresh_margin = rules.refresh_margin
        self._emit = rules.emit
        self._tokens = rules.tokens

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        token_url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Unpack[OAuth2Options],
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables.

        Reads ``SERVICE_BASE_URL`` and ``SERVICE_AUTH_URL`` (``/graphql`` and
        ``/oauth2/token`` are appended unless they end with them), ``SERVICE_CLIENT_ID``
        and ``SERVICE_CLIENT_SECRET``, and, if set, ``SERVICE_TOKEN_STORE_URL``: the
        ``token_store``, one per URL per process, a Redis URL for a
        :class:`~gql_service_auth.redis.RedisTokenStore` (the ``[redis]`` extra) or
        ``file:///dir`` for a :class:`~gql_service_auth.local.LocalTokenStore` (the
        ``[local]`` extra). A setting given by keyword wins: its variable is not read.

        Args:
            environ: Where to read the variables; the process environment by default.
            url: The GraphQL endpoint; ``None`` reads ``SERVICE_BASE_URL``.
            token_url: The token endpoint; ``None`` reads ``SERVICE_AUTH_URL``.
            client_id: The Client Id; ``None`` reads ``SERVICE_CLIENT_ID``.
            client_secret: The Client Secret; ``None`` reads ``SERVICE_CLIENT_SECRET``.
            **kwargs: Passed to the constructor.

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
            ImportError: ``SERVICE_TOKEN_STORE_URL`` is set, and its store's extra is not
                installed.
        """
        settings = oauth2_env(
            environ,
            dict(kwargs),
            url=url,
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
        )
        return cls(**settings)

    @property
    def token(self) -> AccessToken | None:
        """The cached access token (its ``repr`` hides the value), or ``None`` before the first."""
        return self._tokens.token

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # A copy hears the events of the token it uses, which may be the original's.
        self._tokens.subscribe(self._emit)

    async def execute(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
        upload_files: bool = False,
    ) -> ExecutionResult:
        """Execute ``request`` with a valid token; see gql's ``AIOHTTPTransport.execute``.

        What is sent is read off ``request`` when the call starts, as gql's own transport
        does, so concurrent callers each send their own request, re-sends included.

        Raises:
            UnauthenticatedError: the service kept refusing renewed tokens, or refused a
                request that is never sent twice: an upload, an answer with data, or a
                mutation refused while it ran.
            TokenRequestError: no token could be obtained.
        """
        # The boundary of forgets_on_error, inline (see _post): the frames below are
        # cleared, and this one's locals show no secret once the few below are dropped (an
        # answer with errors is scrubbed in place as it arrives; a token's repr hides it).
        started = monotonic()
        try:
            if extra_args:
                extra_args, given = callers_own(extra_args)
                if given:
                    return await self._execute_given(request, extra_args, upload_files)
            taken = snapshot(request)
            # An upload's file streams are consumed by the first send, which is never
            # repeated: it asks for a token that will outlive it.
            min_ttl = self._refresh_margin if upload_files else 0.0
            token = self._tokens.fresh(min_ttl)
            if token is None:
                return await self._renewing(taken, extra_args, upload_files, min_ttl, None)
            # The fast path: almost every request succeeds on its first send with a cached
            # token. No await comes before gql serialises the request, so the caller's
            # object is what was taken.
            posting = self._post(request, extra_args, upload_files, token, bearer_header)
            redirected = False
            try:
                async with posting as response:
                    # getattr: a response_class of the caller's may be a stand-in.
                    redirected = bool(getattr(response, "history", ()))
                    answer = await self._prepare_result(response)
                    if answer.errors:  # scrubbed in place before any other wait
                        scrubbed(answer, self._secrets(token))
            except Exception as exc:
                failed = transport_error(exc)
                refused: ExecutionResult | Bare401 = bare_401(failed, self._secrets(token))
            else:
                if not answer.errors or not is_refusal(answer.errors):
                    self._tokens.confirm(token)
                    return answer
                refused = answer
            finally:
                if upload_files:
                    self._close_upload()
            first = (token, sent(refused, redirected=redirected))
            return await self._renewing(taken, extra_args, upload_files, min_ttl, first)
        except BaseException as exc:
            clear_locals(exc)
            # Shown by repr: the answer's headers (which may echo the token), a per-request
            # proxy's password or cookie. What else this frame holds shows no secret.
            call_timeout = extra_args.get("timeout") if extra_args else None
            response = answer = extra_args = None  # type: ignore[assignment]
            failure = self._unanswered(exc, started, self._tokens.waited_for, call_timeout)
            if failure is exc:
                raise
            raise failure  # noqa: B904 - its cause is set: gql's error, or none

    @forgets_on_error
    async def execute_batch(
        self,
        reqs: list[GraphQLRequest],
        extra_args: dict[str, Any] | None = None,
    ) -> list[ExecutionResult]:
        """Execute a batch with a valid token; see gql's ``AIOHTTPTransport.execute_batch``.

        A refused batch is sent again only when no operation of it can have run: every
        answer refused the token before execution, and none carries data.
        """
        extra_args, given = callers_own(extra_args)
        if given:
            return await self._batch_as_given(reqs, extra_args)
        started = monotonic()
        try:
            return await self._batch_renewed(reqs, extra_args)
        except BaseException as exc:
            failure = self._unanswered(exc, started, self._tokens.waited_for)
            if failure is exc:
                raise
            raise failure  # noqa: B904 - its cause is set: gql's error, or none

    async def subscribe(
        self,
        request: GraphQLRequest,
        *,
        extra_args: dict[str, Any] | None = None,
    ) -> AsyncGenerator[ExecutionResult, None]:
        """Subscribe over HTTP multipart with a valid token; see gql's ``subscribe``.

        A stream is never re-sent; a refusal drops the token so the next call renews it.
        """
        extra_args, given = callers_own(extra_args)
        if given:  # the caller's own Authorization: sent as it is, and no token fetched
            own = self._subscribe_given(request, extra_args)
            async with contextlib.aclosing(own):
                async for result in own:
                    yield result
            return
        request = rebuild(snapshot(request))
        token = await first_token(self._tokens)

        def refused(bare: Bare401) -> UnauthenticatedError:
            return subscription_refused(self._tokens, token, bare, self._max_renewals)

        stream = guarded(
            super().subscribe(
                request, extra_args=with_authorization(extra_args, token.authorization)
            ),
            lambda: self._secrets(token),
            on_refusal=lambda: self._tokens.invalidate(token),
            on_401=refused,
        )
        async with contextlib.aclosing(stream):
            async for result in stream:
                yield result


_API_KEY_HEADER = ClientCredentials.api_key_authorization


def _nothing() -> None:
    """An API key refused in a subscription's result changes nothing: the key stays."""
