"""The ``Authorization`` value for code that is not an HTTP client of the package's.

A websocket, an SSE or MCP client, a subprocess, another GraphQL client: each needs the
token, with what the transports give it: one fetch shared by every caller (threads,
event loops, the transports of the process, the fleet through ``token_store``), renewal
ahead of expiry in the background, a refused token dropped and renewed, the token budget.

::

    provider = TokenProvider.from_env()
    headers = {"Authorization": provider.authorization()}       # blocking
    ...
    provider.refused(headers["Authorization"])                   # the service said no

    provider = AsyncTokenProvider.from_env()
    value = await provider.authorization()                       # asyncio or trio
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from yarl import URL

from ._core.constants import ENV_BASE_URL
from ._core.redact import forgets_on_error
from ._core.settings import oauth2_env
from ._core.token import AccessToken
from ._stacks.gql import first_of
from ._stacks.http_auth import OAuth2Rules
from ._stacks.options import TokenOptions, check_known, oauth2_settings

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Self, Unpack
    else:
        from typing_extensions import Self, Unpack

__all__ = ["AsyncTokenProvider", "TokenProvider"]

_T = TypeVar("_T")


class _Provider:
    """What both providers share: the settings, ``from_env``, ``refused`` and ``token``."""

    _rules: OAuth2Rules

    @forgets_on_error
    def __init__(
        self,
        token_url: str | URL,
        client_id: str | None = None,
        client_secret: str | None = None,
        *,
        url: str | URL | None = None,
        **options: Unpack[TokenOptions],
    ) -> None:
        caller = f"{type(self).__name__}.__init__"
        check_known(options, caller)
        settings = oauth2_settings(
            token_url,
            client_id,
            client_secret,
            options,
            caller=caller,
            ssl=True,
            inherited=None,
        )
        self.token_url = token_url
        self.url = url
        self._rules = settings.rules(url)

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | URL | None = None,
        token_url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **options: Unpack[TokenOptions],
    ) -> Self:
        """Build the provider from the ``SERVICE_*`` variables, as
        :meth:`OAuth2Transport.from_env <gql_service_auth.OAuth2Transport.from_env>` does
        (``SERVICE_BASE_URL``, if set, names the API the tokens are for, and so which
        tokens are shared with the transports of the process; ``SERVICE_TOKEN_STORE_URL``
        and the credentials files included).

        Raises:
            ConfigurationError: a variable is missing or empty; the message names it.
        """
        settings: dict[str, Any] = oauth2_env(
            environ,
            dict(options),
            url=None if url is None else str(url),
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
            # The API is optional here: a provider for a websocket needs no GraphQL URL.
            reads_url=url is not None or bool(environ.get(ENV_BASE_URL, "").strip()),
        )
        return cls(settings.pop("token_url"), url=settings.pop("url"), **settings)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} token_url={str(self.token_url)!r} "
            f"client_id={self._rules.credentials.client_id!r}>"
        )

    @property
    def token(self) -> AccessToken | None:
        """The cached token (its ``repr`` hides the value), or ``None`` before the first."""
        return self._rules.tokens.token

    def _current(self, value: str) -> AccessToken | None:
        """The cached token, if ``value`` is it (``Bearer <token>``, any case, or bare)."""
        token = self._rules.tokens.token
        if token is None or not isinstance(value, str):
            return None
        scheme, _, rest = value.strip().partition(" ")
        bare = rest.strip() if rest and scheme.lower() == "bearer" else value.strip()
        return token if bare == token.value else None

    def accepted(self, value: str) -> None:
        """The service accepted ``value`` (a websocket's ``connection_ack``, an answer):
        the refusals before it stop counting towards the pause of renewals, as the
        transports' accepted answers do. Cheap: call it at each acceptance."""
        token = self._current(value)
        if token is not None:
            self._rules.tokens.confirm(token)

    def refused(self, value: str) -> None:
        """The service refused ``value`` (an ``Authorization`` value this provider gave, or
        its bare token): it is dropped, and the next :meth:`authorization` renews it, once
        for every caller it was given to. A value that was already replaced is ignored.

        Renewals after tokens refused before any was :meth:`accepted` pause as the
        transports' do (``RetryPolicy``); every renewal counts in the token budget.
        """
        token = self._current(value)
        if token is not None:
            self._rules.tokens.invalidate(token)


class TokenProvider(_Provider):
    """Hands out the ``Authorization`` value of OAuth 2.0 client-credentials tokens, for
    code that blocks (threads, scripts, a subprocess's environment).

    Tokens are shared with every transport and auth object of the process built for the
    same credentials and API (``url``), and with the fleet through ``token_store``.

    Args:
        token_url: The token endpoint, ``{auth_url}/oauth2/token``.
        client_id: The Client Id from the console.
        client_secret: The Client Secret from the console; never shown.
        url: The API the tokens are for (``{base_url}/graphql``); ``None`` shares them
            with no transport.
        **options: The keywords of the token and its renewal (``scope``, ``retry``,
            ``token_store``, ``credentials``, ``token_budget``...): see
            :class:`~gql_service_auth.TokenOptions`.

    Raises:
        ConfigurationError: a bad argument; the message says which.
    """

    def authorization(self) -> str:
        """The ``Authorization`` value to send now (``Bearer <token>``): the cached token
        while it is valid, else a new one, fetched once for every caller. Blocks, at most
        the retry policy's timeout (plus a grace).

        Raises:
            TokenRequestError: no token could be had (``TokenBudgetExceededError``: the
                budget is spent).
            UnauthenticatedError: fresh tokens keep being refused; renewals are paused.
        """
        tokens = self._rules.tokens
        token = tokens.fresh() or first_of(tokens.get_blocking(), tokens)
        return token.authorization


class AsyncTokenProvider(_Provider):
    """:class:`TokenProvider` for async code: ``await provider.authorization()``, on
    asyncio, or on trio (a waiting caller then holds a worker thread; ``anyio``, which
    httpx brings, is needed there).

    The arguments are :class:`TokenProvider`'s.
    """

    async def authorization(self) -> str:
        """The ``Authorization`` value to send now; see :meth:`TokenProvider.authorization`.
        A caller cancelled while it waits leaves the fetch to finish for the others."""
        tokens = self._rules.tokens
        token = tokens.fresh()
        if token is not None:
            return token.authorization
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # trio, or another library's loop: wait on a worker thread
            got = await _on_worker_thread(tokens.get_blocking)
        else:
            got = await tokens.get()
        return first_of(got, tokens).authorization


async def _on_worker_thread(get: Callable[[], _T]) -> _T:
    """``get()`` on a worker thread, abandoned if the caller is cancelled: the fetch goes
    on for the others. A limiter of its own: a wait holds its thread until the fetch ends
    (bounded by the retry policy), and must not take the worker threads the application's
    own calls share."""
    import anyio
    import anyio.to_thread

    own = anyio.CapacityLimiter(1)
    if "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters:
        return await anyio.to_thread.run_sync(get, abandon_on_cancel=True, limiter=own)
    # anyio before 4.1, which gql allows, named it cancellable.
    return await anyio.to_thread.run_sync(get, cancellable=True, limiter=own)


for _public in (TokenProvider, AsyncTokenProvider):
    _public.__module__ = "gql_service_auth"
del _public
