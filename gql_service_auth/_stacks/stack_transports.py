"""What the requests and httpx transports share, whatever their stack: ``from_env``, the
``repr``, and where the credentials are read. No HTTP stack is imported here."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .._core.redact import forgets_on_error
from .._core.settings import api_key_env, oauth2_env
from .._core.telemetry import Method
from .._core.token import AccessToken
from .gql import AnswerHeadersApart
from .http_auth import OAuth2Rules

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self


class _Shown(AnswerHeadersApart):
    def __repr__(self) -> str:
        return f"<{type(self).__name__} url={str(getattr(self, 'url', None))!r}>"


class ApiKeyTransportParts(_Shown):
    """``from_env`` of an API key transport, and its secret, read from its auth object."""

    _signer: Any
    _method: ClassVar[Method] = "api_key"

    @classmethod
    @forgets_on_error
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        url: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables, as
        :meth:`ApiKeyTransport.from_env <gql_service_auth.ApiKeyTransport.from_env>` does;
        ``**kwargs`` go to the constructor."""
        settings = api_key_env(environ, url=url, client_id=client_id, client_secret=client_secret)
        return cls(**settings, **kwargs)


class OAuth2TransportParts(_Shown):
    """``from_env`` of an OAuth2 transport, and its cached token."""

    _rules: OAuth2Rules
    _method: ClassVar[Method] = "oauth2"

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
        **kwargs: Any,
    ) -> Self:
        """Build the transport from the ``SERVICE_*`` environment variables, as
        :meth:`OAuth2Transport.from_env <gql_service_auth.OAuth2Transport.from_env>` does
        (``SERVICE_TOKEN_STORE_URL`` included); ``**kwargs`` go to the constructor."""
        settings = oauth2_env(
            environ,
            kwargs,
            url=url,
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
        )
        return cls(**settings)

    @property
    def token(self) -> AccessToken | None:
        """The cached access token (its ``repr`` hides the value), or ``None`` before the first."""
        return self._rules.tokens.token
