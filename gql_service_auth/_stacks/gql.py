"""Glue every gql transport shares, whatever its HTTP stack.

gql's requests are read off once (gql 3 style calls rewrite a shared request in place),
its answers read into the decision core's :class:`~gql_service_auth._core.refusal.Answer`,
its HTTP 401 errors kept as gql raised them, and the core's outcomes turned into the
package's errors, scrubbed of every secret.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gql.graphql_request import GraphQLRequest
from gql.transport.exceptions import (
    TransportConnectionFailed,
    TransportError,
    TransportServerError,
)
from graphql import DocumentNode, ExecutionResult, OperationDefinitionNode

from .._core import log_secrets
from .._core.errors import (
    ApiKeyRejectedError,
    ApiKeyRejectedHTTPError,
    GqlServiceAuthError,
    UnauthenticatedError,
    UnauthenticatedHTTPError,
)
from .._core.flow import Accepted, Outcome, Paused, Refused, Sent
from .._core.ledger import NotNow, RenewalPaused
from .._core.redact import clear_locals, redact_chain, redact_text
from .._core.refusal import (
    BARE_401,
    SUBSCRIPTION,
    Answer,
    api_key_message,
    exhausted_message,
    is_refusal,
    not_resent_message,
    paused_message,
    refusal_message,
)
from .._core.token import AccessToken

if TYPE_CHECKING:  # the token machinery loads with the first OAuth2 transport
    from .._core.tokens import TokenManager

_T = TypeVar("_T")

# gql's transports log every answer at DEBUG before the package sees it: the credentials
# of this process are replaced in their records (see _core/log_secrets.py).
log_secrets.install()

# What a request sends, read off gql's GraphQLRequest before the first await: gql 3
# style calls (execute(doc, variable_values=...)) rewrite a shared request in place.
Snapshot = tuple[DocumentNode, "dict[str, Any] | None", "str | None", "dict[str, Any] | None"]


def snapshot(request: GraphQLRequest) -> Snapshot:
    """What ``request`` sends, copied so that later changes to it are not sent."""
    variables, extensions = request.variable_values, request.extensions
    return (
        request.document,
        _copied(variables) if variables else variables,
        request.operation_name,
        _copied(extensions) if extensions else extensions,
    )


def _copied(value: Any) -> Any:
    """``value`` with its dicts, lists and tuples copied, so the caller's changes miss it.

    Leaves are kept as they are: a ``FileVar`` must stay the object whose stream is sent.
    A part shared twice is copied once, and a cycle stays a cycle, which the serializer
    then refuses as it would the original; nesting too deep to copy is sent as it is.
    """
    if not isinstance(value, _CONTAINERS):
        return value
    try:
        return _copy_into(value, {})
    except RecursionError:
        return value


_CONTAINERS = (dict, list, tuple)


def _copy_into(value: dict[Any, Any] | list[Any] | tuple[Any, ...], memo: dict[int, Any]) -> Any:
    # On every request with variables, before the first send: leaves are tested in line
    # rather than by a call each, which halves the time of a typical variables dict.
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, dict):
        copied: dict[Any, Any] = {}
        memo[id(value)] = copied
        for key, item in value.items():
            copied[key] = _copy_into(item, memo) if isinstance(item, _CONTAINERS) else item
        return copied
    items: list[Any] = []
    memo[id(value)] = items
    for item in value:
        items.append(_copy_into(item, memo) if isinstance(item, _CONTAINERS) else item)
    if isinstance(value, tuple):
        memo[id(value)] = result = tuple(items)  # a cycle through a tuple keeps the list
        return result
    return items


def rebuild(snapshot: Snapshot) -> GraphQLRequest:
    """A new request that sends what ``snapshot`` holds."""
    document, variables, operation_name, extensions = snapshot
    return GraphQLRequest(
        document, variable_values=variables, operation_name=operation_name, extensions=extensions
    )


def is_query(snapshot: Snapshot) -> bool:
    """Whether the operation a request runs is a query, which has no side effects."""
    document, _, operation_name, _ = snapshot
    return runs_query(document, operation_name)


def runs_query(document: DocumentNode, operation_name: object) -> bool:
    """Whether the operation ``document`` runs (``operation_name``'s, or its only one) is
    a query, which has no side effects."""
    operations = [
        d
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        and (not operation_name or (d.name is not None and d.name.value == operation_name))
    ]
    return len(operations) == 1 and operations[0].operation.value == "query"


class AnswerHeadersApart:
    """gql's ``response_headers`` (the last answer's headers), held in a slot, which
    ``vars()`` and copies of the transport leave out: a server that quotes the token or the
    API key in a header of its answer would otherwise show it to whatever dumps the
    transport's attributes (a crash reporter, a debugger's variables view). Reading the
    attribute still gives them, as gql's transport does."""

    __slots__ = ("_answer_headers",)

    @property
    def response_headers(self) -> Any:
        return getattr(self, "_answer_headers", None)

    @response_headers.setter
    def response_headers(self, headers: Any) -> None:
        self._answer_headers = headers


class Bare401:
    """An HTTP 401 without a GraphQL body: gql's error for it, rid of credentials.

    Kept so that the error that ends the request carries gql's message, ``code`` and
    chain, as code written for gql's transport expects (see :func:`http_401`).
    """

    __slots__ = ("error",)

    def __init__(self, error: TransportServerError) -> None:
        self.error = error

    def detached(self) -> Bare401:
        """What the token manager keeps past the request (``Sent.kept``): gql's message
        and code, as requests' and httpx's (:func:`detached_401`). Not the error itself:
        its traceback's frames hold the request's locals, the transport and its token
        manager among them, for as long as a pause's lesson is kept (12 refused per-call
        transports stayed live), and a later caller's error would carry another call's
        frames. Each caller failing in the pause gets a copy of the kept one too."""
        return Bare401(TransportServerError(str(self.error), self.error.code))


def detached_401(answer: Answer, raise_for_status: Callable[[], object]) -> Bare401 | None:
    """What of a requests or httpx answer a bare 401 keeps (``Sent.kept``): gql's error
    for it, made from the stack's own error's text as gql makes it, with no response
    behind it. ``None`` for any other answer.

    So a call that fails at once while renewals pause after bare 401s is gql's 401 error
    too, as on aiohttp (see :func:`paused_error`).
    """
    if not answer.bare_401:
        return None
    try:
        raise_for_status()
    except Exception as exc:  # the stack's HTTPError: its text names the status and URL
        return Bare401(TransportServerError(str(exc), 401))
    return Bare401(TransportServerError("401 Unauthorized", 401))


def bare_401(exc: TransportError, secrets: Sequence[str]) -> Bare401:
    """Accept an HTTP 401 without a GraphQL body as a refusal; re-raise anything else.

    Call it from the ``except`` block. Whatever is raised keeps the stack's record of the
    request in its chain, and what the server echoed, so the chain is first rid of the
    credential headers and of ``secrets`` (see :mod:`gql_service_auth._core.redact`).
    """
    redact_chain(exc, secrets)
    clear_locals(exc)  # gql's post_args and the stack's headers hold the credential
    if isinstance(exc, TransportServerError) and exc.code == 401:
        return Bare401(exc)
    raise exc


def sent(
    raw: ExecutionResult | Bare401, *, redirected: bool = False
) -> Sent[ExecutionResult | Bare401]:
    """A single request's answer, read for the decision; ``redirected``: it came back
    through a redirect (see :mod:`gql_service_auth._core.refusal`, rule 5)."""
    if isinstance(raw, Bare401):
        return Sent(_through(BARE_401, redirected), raw, kept=raw.detached())
    return Sent(_through(Answer.of_results(((raw.errors, raw.data),)), redirected), raw)


def sent_batch(
    raw: list[ExecutionResult] | Bare401, *, redirected: bool = False
) -> Sent[list[ExecutionResult] | Bare401]:
    """A batch's answer, read for the decision (``redirected`` as for :func:`sent`)."""
    if isinstance(raw, Bare401):
        return Sent(_through(BARE_401, redirected), raw, kept=raw.detached())
    return Sent(_through(Answer.of_results((r.errors, r.data) for r in raw), redirected), raw)


def _through(answer: Answer, redirected: bool) -> Answer:
    return replace(answer, redirected=True) if redirected else answer


_HTTPErrorT = TypeVar("_HTTPErrorT", bound=UnauthenticatedHTTPError)


def http_401(kind: type[_HTTPErrorT], bare: Bare401, explanation: str) -> _HTTPErrorT:
    """The error that ends a request refused with a bare HTTP 401.

    gql's message comes first, as code written for gql's transport may match it
    (``"401, message='Unauthorized'"``); gql's error, already rid of credentials, is
    the cause. Set here rather than by ``raise ... from``: the callers raise it outside
    their ``except`` blocks, to keep internal signals out of the chain.
    """
    error = kind(f"{bare.error}: {explanation}")
    error.__cause__ = bare.error
    return error


def scrubbed(answer: _T, secrets: list[str]) -> _T:
    """``answer`` (one result or a batch's) with credentials scrubbed from its errors.

    An answer that is not a refusal goes back to gql, whose client raises
    ``TransportQueryError`` for its ``errors``, with the first as message: a service that
    quotes the API key or the token it was sent in another error (``FORBIDDEN``...) must
    not put it there. Answers without errors are left alone, untouched and uncopied.
    """
    for result in answer if isinstance(answer, list) else (answer,):
        if isinstance(result, ExecutionResult) and result.errors:
            result.errors = cast(Any, redact_text(result.errors, secrets))
            result.data = cast(Any, redact_text(result.data, secrets))
            result.extensions = cast(Any, redact_text(result.extensions, secrets))
    return answer


def _parts(raw: object, secrets: list[str]) -> tuple[list[Any] | None, Any, Any]:
    """The ``errors``, ``data`` and ``extensions`` of a refusal, with any secret scrubbed."""
    if isinstance(raw, list):
        raw = next((r for r in raw if is_refusal(r.errors)), None)
    if not isinstance(raw, ExecutionResult):
        return None, None, None
    errors = redact_text(raw.errors, secrets)
    return (
        errors if isinstance(errors, list) else None,
        redact_text(raw.data, secrets),
        redact_text(raw.extensions, secrets),
    )


def refused_error(outcome: Refused[Any], secrets: list[str]) -> UnauthenticatedError:
    """The error that ends a request the service refused (OAuth2)."""
    answer, raw = outcome.last.answer, outcome.last.raw
    if outcome.reason is None:
        token = outcome.token
        lived = round(token.expires_at - token.obtained_at, 1) if outcome.expired else None
        message = exhausted_message(answer, outcome.renewals, lived)
    else:
        message = not_resent_message(answer, outcome.reason, dropped=outcome.dropped)
    if isinstance(raw, Bare401):
        return http_401(UnauthenticatedHTTPError, raw, message)
    errors, data, extensions = _parts(raw, secrets)
    return UnauthenticatedError(message, errors=errors, data=data, extensions=extensions)


def settled(
    outcome: Outcome[_T | Bare401],
    refusal_answer: object,
    secrets: Callable[[AccessToken], list[str]],
) -> _T:
    """The answer the flow's ``outcome`` gives the caller, or the error it ends with.

    ``refusal_answer`` is what the token manager kept of the refusal behind a pause.
    """
    if isinstance(outcome, Accepted):
        assert not isinstance(outcome.raw, Bare401)  # a bare 401 is always a refusal
        return scrubbed(outcome.raw, secrets(outcome.token))
    if isinstance(outcome, Paused):
        raise paused_error(outcome, refusal_answer)
    raise refused_error(outcome, secrets(outcome.token))


async def guarded(
    stream: AsyncGenerator[ExecutionResult, None],
    secrets: Callable[[], list[str]],
    *,
    on_refusal: Callable[[], object],
    on_401: Callable[[Bare401], BaseException],
) -> AsyncGenerator[ExecutionResult, None]:
    """A subscription's ``stream``, its results and errors rid of the ``secrets()``.

    A result that refuses the credentials is told to ``on_refusal`` and passed on: a
    stream is never sent twice. gql raises ``TransportServerError(401)`` for any 401 to a
    subscription, body or not: the stream ends with the error ``on_401`` makes of it.
    An async generator is its own boundary (a decorator cannot wrap one without changing
    how it closes), so the error's frames are cleared here; ``stream`` is closed with it.
    The secrets are asked for each time, so that this frame, which a traceback shows,
    holds none.
    """
    try:
        async with contextlib.aclosing(stream):
            async for result in stream:
                if is_refusal(result.errors):
                    on_refusal()
                yield scrubbed(result, secrets())
    except BaseException as exc:
        redact_chain(exc, secrets())
        clear_locals(exc)
        if isinstance(exc, TransportServerError) and exc.code == 401:
            raise on_401(Bare401(exc)) from exc
        raise


async def first_token(tokens: TokenManager) -> AccessToken:
    """A token for a call that is never re-sent (a stream); fails at once while renewals
    are paused, as the error of the refusals behind the pause (see :func:`paused_error`)."""
    return first_of(await tokens.get(), tokens)


def first_token_blocking(tokens: TokenManager, min_ttl: float) -> AccessToken:
    """:func:`first_token` for code without an event loop: blocks the calling thread,
    within the fetch's deadline."""
    return first_of(tokens.get_blocking(min_ttl=min_ttl), tokens)


def first_of(got: AccessToken | NotNow, tokens: TokenManager) -> AccessToken:
    """A first token, or the error of the refusals that paused renewals.

    Never spent: a first token renews after no refused one (``after=0``).
    """
    if isinstance(got, RenewalPaused):
        raise paused_error(Paused(got.refusals, got.remaining), tokens.refusal_answer)
    assert isinstance(got, AccessToken), "a first token is never a spent renewal"
    return got


def subscription_refused(
    tokens: TokenManager, token: AccessToken, bare: Bare401, renewals: int
) -> UnauthenticatedError:
    """The error of a subscription refused with a 401: the token is dropped, and the
    stream, which is never sent twice, ends."""
    tokens.invalidate(token, answer=bare.detached())
    last = Sent(BARE_401, bare)
    return refused_error(Refused(token, last, SUBSCRIPTION, True, renewals), [])


def paused_error(paused: Paused, last_refusal: object) -> UnauthenticatedError:
    """The error of a call that fails at once while renewals are paused.

    When the refusals that caused the pause were bare HTTP 401s (``last_refusal``), it is
    gql's 401 error too, as the calls that met them ended: code written for gql catches
    both alike.
    """
    message = paused_message(paused.refusals, paused.remaining)
    if isinstance(last_refusal, Bare401):
        # A copy per caller: one that raises its error's cause writes its frames into it.
        return http_401(UnauthenticatedHTTPError, last_refusal.detached(), message)
    return UnauthenticatedError(message)


# gql's requests and httpx transports, whose auth objects sign and re-send inside the HTTP
# client, and hand a refused outcome back through an Exchange (see _stacks/http_auth.py).


def own_error(exc: BaseException) -> GqlServiceAuthError | None:
    """This package's error inside ``exc``: gql's requests and httpx transports raise
    anything the HTTP client raised (an auth's token fetch) as ``TransportConnectionFailed``,
    which ``except TransportQueryError`` misses and a reconnecting session retries."""
    cause = exc.__cause__
    if isinstance(exc, TransportConnectionFailed) and isinstance(cause, GqlServiceAuthError):
        return cause
    return None


def oauth2_failure(
    exc: TransportError, refused: Refused[Any] | None, secrets: list[str]
) -> BaseException:
    """What a call to gql's transport that raised ``exc`` raises instead (OAuth2): this
    package's own error, the error of a request refused to the end, or ``exc`` itself,
    rid of credentials. Raise it outside the ``except`` block."""
    own = own_error(exc)
    if own is not None:
        return own
    redact_chain(exc, secrets)
    clear_locals(exc)
    if refused is None:
        return exc
    # A bare 401, or a batch refused with a single object, which gql finds malformed.
    raw = Bare401(exc) if isinstance(exc, TransportServerError) and exc.code == 401 else None
    return refused_error(replace(refused, last=Sent(refused.last.answer, raw)), secrets)


def oauth2_answer(answer: _T, refused: Refused[Any] | None, secrets: list[str]) -> _T:
    """The answer of a call to gql's transport (OAuth2), or the error of a refused one."""
    if refused is not None:
        raise refused_error(replace(refused, last=Sent(refused.last.answer, answer)), secrets)
    return scrubbed(answer, secrets)


def api_key_failure(
    exc: TransportError, secrets: list[str], instead: str = "OAuth2Transport"
) -> BaseException:
    """:func:`oauth2_failure` for the API key: a bare 401 refused the key.

    ``instead`` names the OAuth2 class the refusal's message advises: the same stack's.
    """
    own = own_error(exc)
    if own is not None:
        return own
    redact_chain(exc, secrets)
    clear_locals(exc)
    if isinstance(exc, TransportServerError) and exc.code == 401:
        return api_key_error(Bare401(exc), secrets, instead)
    return exc


def api_key_answer(answer: _T, secrets: list[str], instead: str = "OAuth2Transport") -> _T:
    """The answer of a call to gql's transport (API key), or the error of a refused key."""
    results = answer if isinstance(answer, list) else [answer]
    if any(isinstance(r, ExecutionResult) and is_refusal(r.errors) for r in results):
        raise api_key_error(answer, secrets, instead)
    return scrubbed(answer, secrets)


def api_key_error(
    raw: object, secrets: list[str], instead: str = "OAuth2Transport"
) -> ApiKeyRejectedError:
    """The error of a request that the service refused the API key for.

    ``instead`` names the OAuth2 class to use in the key's place, of the caller's stack.
    """
    if isinstance(raw, Bare401):
        return http_401(ApiKeyRejectedHTTPError, raw, api_key_message(BARE_401, None, instead))
    # The service may quote the key it refused; the error must not.
    errors, data, extensions = _parts(raw, secrets)
    return ApiKeyRejectedError(
        api_key_message(Answer(1, 1, False, False), refusal_message(errors), instead),
        errors=errors,
        data=data,
        extensions=extensions,
    )


def callers_own(extra_args: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """A call's ``extra_args``, and whether they carry the caller's own ``Authorization``
    header (a mapping of headers, or pairs; any case; ``str`` or ``bytes`` names). Such a
    call is the caller's: sent as it is, never signed by us, never sent again. Headers given
    as an iterator are read once here, and handed on as a list."""
    headers = extra_args.get("headers") if extra_args else None
    if not headers:
        return extra_args, False
    assert extra_args is not None
    if not isinstance(headers, Mapping | Sequence):
        headers = list(headers)
        extra_args = {**extra_args, "headers": headers}
    names = headers.keys() if isinstance(headers, Mapping) else (pair[0] for pair in headers)
    for name in names:
        text = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        if text.lower() == "authorization":
            return extra_args, True
    return extra_args, False


async def stream_as_given(
    stream: AsyncGenerator[ExecutionResult, None], secrets: Sequence[str]
) -> AsyncGenerator[ExecutionResult, None]:
    """:func:`as_given` for a subscription: each result scrubbed of ``secrets``."""
    async with contextlib.aclosing(stream):
        try:
            async for result in stream:
                yield scrubbed(result, list(secrets))
        except TransportError as exc:
            redact_chain(exc, list(secrets))
            clear_locals(exc)
            raise


async def as_given(call: Awaitable[_T], secrets: Sequence[str]) -> _T:
    """The answer of a call made with the caller's own ``Authorization``: gql's own, as
    it came (a refusal is gql's to raise, not ours), scrubbed of ``secrets``."""
    try:
        answer = await call
    except TransportError as exc:
        redact_chain(exc, list(secrets))
        clear_locals(exc)
        raise
    return scrubbed(answer, list(secrets))
