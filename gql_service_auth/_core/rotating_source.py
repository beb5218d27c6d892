"""Where the tokens of credentials that can change come from: each fetch reads them first.

A :class:`RotatingSource` stands where a token manager's source stands (the token
endpoint, or a shared store in front of it), and for each fetch picks the grant and the
shared store entry of the credentials read last: a token of the old credentials is never
stored or taken for the new ones, and a store keeps working across the change. It reads
the credentials again (on the fetch's own thread, where blocking is fine) before each
fetch, and once more after the authorization server answered ``invalid_client``; a change
the watcher notices starts a renewal in the background (``TokenManager.renew_soon``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._stores.level import TokenSource
from .._stores.protocol import TokenIdentity
from . import fork as _fork
from .credentials import ClientCredentials
from .errors import TokenRequestError
from .provenance import Origin
from .rotation import RotatingCredentials
from .token import TokenFetcher, TokenResponse

if TYPE_CHECKING:
    from .tokens import TokenManager

READ_WAIT = 2.0
"""Seconds a token fetch waits for its read of the credentials before it goes on with the
ones read last."""

_KEPT = 2
"""Grants and store levels kept, by credentials: the ones in use, and the ones before
(a fetch that began before the change)."""


@dataclass(frozen=True, slots=True, repr=False)
class RotatingIdentity:
    """What the transports sharing a token in a process share, when their credentials can
    change: the source (equal sources give equal credentials) and the token parameters.

    Stands for :class:`~gql_service_auth.TokenIdentity` in a sharing key; never shown.
    """

    source: object
    parameters: TokenIdentity = field(compare=True)  # with no credentials in it

    def __repr__(self) -> str:
        return f"RotatingIdentity(source={self.source!r}, token_url={self.parameters.token_url!r})"


class RotatingSource:
    """A :class:`~gql_service_auth._stores.level.TokenSource` for credentials that can
    change.

    Args:
        credentials: The credentials, and their source.
        make: The grant and the token source (endpoint or shared store level) of a pair
            of credentials; called once per pair.
    """

    def __init__(
        self,
        credentials: RotatingCredentials,
        make: Callable[[ClientCredentials], tuple[TokenFetcher, TokenSource]],
    ) -> None:
        self._credentials = credentials
        self._make = make
        self._made: dict[ClientCredentials, tuple[TokenFetcher, TokenSource]] = {}
        self._lock = threading.Lock()  # a background renewal and an upload's may overlap
        self._reading = False
        self._manager: Callable[[], TokenManager | None] = lambda: None
        self.shared = self._of(credentials.current)[1].shared
        credentials.listen(self._changed)
        _fork.reset_in_child(self)

    def __repr__(self) -> str:
        return f"<RotatingSource {self._credentials!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return RotatingSource, (self._credentials, self._make)

    def serve(self, manager: TokenManager) -> None:
        """Start a renewal of ``manager``'s token whenever the watcher reads new credentials."""
        self._manager = weakref.ref(manager)

    def _changed(self) -> None:
        if self._reading:
            return  # read by a fetch, which fetches for the new credentials itself
        manager = self._manager()
        if manager is not None:
            manager.renew_soon()

    def _of(self, credentials: ClientCredentials) -> tuple[TokenFetcher, TokenSource]:
        with self._lock:
            made = self._made.get(credentials)
            if made is None:
                made = self._make(credentials)
                while len(self._made) >= _KEPT:
                    del self._made[next(iter(self._made))]
                self._made[credentials] = made
            return made

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    async def _refresh(self, *, force: bool) -> bool:
        """Read the credentials on a thread of their own, waiting ``READ_WAIT`` at most: a
        source that hangs costs a fetch that much, and the credentials read last go."""
        self._reading = True
        try:
            read = asyncio.wrap_future(self._credentials.read_soon(force=force))
            return await asyncio.wait_for(asyncio.shield(read), READ_WAIT)
        except asyncio.TimeoutError:
            return False
        finally:
            self._reading = False

    async def fetch(self) -> TokenResponse:
        """The token endpoint's answer for the credentials read last: the manager's own
        fetch, which it hands back to :meth:`obtain` (a copy pickles this source, never a
        grant holding a secret)."""
        grant, _ = self._of(self._credentials.current)
        return await grant()

    async def obtain(
        self, fetch: TokenFetcher, **kwargs: Any
    ) -> tuple[TokenResponse, Origin | None]:
        """A token of the credentials read now; ``fetch``, the manager's, is not used: each
        pair of credentials has a grant of its own."""
        await self._refresh(force=False)
        grant, source = self._of(self._credentials.current)
        try:
            return await source.obtain(grant, **kwargs)
        except TokenRequestError as error:
            # Refused credentials may have been replaced since the last check: read
            # them now, and ask once more if they changed.
            if error.error != "invalid_client" or not await self._refresh(force=True):
                raise
        grant, source = self._of(self._credentials.current)
        return await source.obtain(grant, **kwargs)
