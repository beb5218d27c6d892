"""The token request posted with aiohttp, for every stack: :class:`AiohttpFormPoster`.

It posts in a short-lived session of its own, with the settings
:mod:`~gql_service_auth._stacks.aiohttp_token_session` resolved, on the fetch's own thread
and event loop. aiohttp itself is imported at the first post (see :func:`_aiohttp`): the
requests and httpx adapters import this module, and aiohttp was half of their import.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Hashable, Mapping
from ssl import SSLContext
from typing import Any

from multidict import CIMultiDict
from yarl import URL

from .._core import fork as _fork
from .._core.constants import ENV_AUTH_URL, MAX_TOKEN_RESPONSE_BYTES
from .._core.diagnosis import answered_in_plain, proxy_clause, token_unreachable_hint
from .._core.errors import ConfigurationError, TokenRequestError
from .._core.oauth2 import FormAnswer, secrets_sent
from .._core.redact import redact_chain, redact_text
from .aiohttp_token_session import SslSetting, TokenSession, hashable


class AiohttpFormPoster:
    """Posts the token request in a short-lived aiohttp session of its own.

    A session of its own keeps the user's default headers, cookies and ``auth`` of the
    GraphQL session away from the authorization server. One session per fetch costs a
    connection per token, which is rare, and binds nothing to an event loop between
    fetches, so tokens can be fetched from any loop or thread.

    Args:
        ssl: As aiohttp's ``ssl``: the same verification settings as the GraphQL endpoint.
        session: The session's proxy, ``trust_env``, connector factory and options;
            ``None`` for aiohttp's defaults (direct, environment ignored).
    """

    def __init__(
        self,
        *,
        ssl: SslSetting = True,
        session: TokenSession | None = None,
        verify: object = None,
    ) -> None:
        self._ssl = ssl
        self._session = session or TokenSession()
        # A CA bundle's path makes a new SSLContext per transport: the path is what
        # tells two such posters alike.
        self._ssl_key = (
            os.fsdecode(verify) if isinstance(verify, str | bytes | os.PathLike) else None
        )

    def __repr__(self) -> str:
        return f"<AiohttpFormPoster {self._session!r}>"

    def sharing_key(self, url: str | URL) -> Hashable:
        """What makes two posters send a token request to ``url`` alike (see
        :meth:`TokenSession.sharing_key`); an ``SSLContext`` counts as itself."""
        ssl_key = self._ssl_key if self._ssl_key is not None else hashable(self._ssl)
        return (ssl_key, self._session.sharing_key(url))

    def route(self, url: str | URL) -> str | None:
        """The proxy a token request to ``url`` goes through, named without credentials."""
        return self._session.route(url)

    def secrets(self) -> list[str]:
        """The proxy credentials a request may carry, which an answer may quote back."""
        return self._session.secrets()

    async def __call__(
        self, url: str | URL, form: Mapping[str, str], headers: Mapping[str, str], timeout: float
    ) -> FormAnswer:
        aiohttp = _aiohttp()
        settings = self._session
        settings.check_environment(url)
        try:
            async with (
                aiohttp.ClientSession(
                    connector=settings.make_connector(),
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    trust_env=settings.trust_env,
                    **settings.options,
                ) as session,
                session.post(
                    url,
                    data=dict(form),
                    headers=dict(headers),
                    ssl=self._ssl,
                    proxy=settings.proxy,
                    allow_redirects=False,
                ) as response,
            ):
                # read(n) returns what has arrived so far, which may be a fraction of a
                # small body: read to the end, stopping once past the cap.
                body = bytearray()
                async for chunk in response.content.iter_chunked(16 * 1024):
                    body += chunk
                    if len(body) > MAX_TOKEN_RESPONSE_BYTES:
                        break
                return FormAnswer(response.status, CIMultiDict(response.headers), bytes(body))
        except UnicodeEncodeError as exc:
            # aiohttp encodes proxy credentials as latin-1 (those of HTTP_PROXY with
            # trust_env; explicit ones were checked when the transport was built), and the
            # error's arguments hold the whole "user:password" it could not encode.
            redact_chain(exc)
            raise TokenRequestError(
                "could not encode the token request (UnicodeEncodeError)",
                hint=(
                    "Proxy credentials (in HTTP_PROXY/HTTPS_PROXY with trust_env, or in "
                    "~/.netrc) must be latin-1 text, as HTTP Basic sends them"
                ),
            ) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            # aiohttp's records of the request (kept for the chain) hold the Basic header
            # of client_secret_basic, and a malformed answer may quote what it was sent;
            # a proxy's error may quote its own credentials.
            sent = secrets_sent(form, headers) + self.secrets()
            redact_chain(exc, sent)
            detail = str(redact_text(str(exc), sent)) or "timed out"
            del sent
            proxied = isinstance(
                exc, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)
            )
            proxy = settings.route(url)
            reason = (
                f"no answer from the token endpoint {url}{proxy_clause(proxy)} within "
                f"{timeout:.1f} s (what RetryPolicy.timeout left this attempt)"
                if isinstance(exc, asyncio.TimeoutError)
                else f"could not reach the token endpoint {url}{proxy_clause(proxy)} "
                f"({type(exc).__name__}: {detail})"
            )
            if isinstance(exc, aiohttp.ClientSSLError) and answered_in_plain(exc):
                # A URL to fix, which no retry heals: the token URL's, or the proxy's.
                which = " or the proxy on the way" if proxy else ""
                raise TokenRequestError(
                    f"the token endpoint {url}{proxy_clause(proxy)}{which} answered in "
                    "plain http, not TLS",
                    hint=(
                        f"Check {ENV_AUTH_URL} (with from_env()) or the token_url given"
                        + (", or the proxy's URL" if proxy else "")
                        + ": an https:// URL names a port that serves http://"
                    ),
                ) from exc
            raise TokenRequestError(
                reason,
                retryable=True,
                hint=(
                    "Check the token request's proxy (token_proxy, token_session_args, or "
                    "HTTP_PROXY/HTTPS_PROXY with trust_env) and its credentials"
                    if proxied
                    else token_unreachable_hint(proxy)
                ),
            ) from exc


def _aiohttp() -> Any:
    """aiohttp, imported on the first token fetch (on the fetch's thread, safe from a fork
    in the middle: see :func:`~gql_service_auth._core.fork.imported`), its error scrubber
    registered."""
    return _fork.imported(_import_aiohttp)


def _import_aiohttp() -> Any:
    import aiohttp

    # Imported for what it does: it registers how aiohttp errors are scrubbed.
    from . import aiohttp_redact  # noqa: F401

    return aiohttp


def ssl_of_verify(verify: object, what: str = "verify") -> SSLContext | bool:
    """requests' and httpx's ``verify`` (a bool, a CA bundle's path, an ``SSLContext``)
    as aiohttp's ``ssl``, for the token request: it verifies as the GraphQL requests do."""
    if isinstance(verify, bool | SSLContext):
        return verify
    if isinstance(verify, str | bytes | os.PathLike):
        path = os.fsdecode(verify)
        if os.path.isdir(path):
            return ssl.create_default_context(capath=path)
        return ssl.create_default_context(cafile=path)
    raise ConfigurationError(
        f"{what} must be a bool, a CA bundle's path or an ssl.SSLContext, not "
        f"{type(verify).__name__}"
    )
