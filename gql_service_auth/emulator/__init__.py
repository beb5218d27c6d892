"""A local emulator of the service, for tests and offline work.

It keeps the service contract on 127.0.0.1: ``POST /graphql`` with both authentication
methods (API key and Bearer token), the 2024-05-13 rule, ``POST /oauth2/token`` with the
client-credentials grant and RFC 6749 errors, tokens that expire, and ``UNAUTHENTICATED``
errors in the body. Knobs inject faults; counters tell what happened::

    async with Emulator(token_ttl=5) as emulator:
        transport = OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id=emulator.recent_client.client_id,
            client_secret=emulator.recent_client.client_secret,
        )
        ...
        assert emulator.counters.token_requests == 1
"""

from ._schema import UploadedFile
from ._server import (
    ClientRecord,
    Counters,
    Emulator,
    ManualClock,
    RecordedMutation,
    RecordedRequest,
    environ_or_emulator,
)

__all__ = [
    "ClientRecord",
    "Counters",
    "Emulator",
    "ManualClock",
    "RecordedMutation",
    "RecordedRequest",
    "UploadedFile",
    "environ_or_emulator",
]
