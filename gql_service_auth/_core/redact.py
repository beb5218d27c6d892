"""Keeping credentials out of exceptions: HTTP stacks' records of an exchange, echoed text.

An HTTP stack's errors may keep a record of the request: aiohttp's ``ClientResponseError``
(and its subclasses) carries a ``RequestInfo`` whose ``headers`` are the request's,
``Authorization`` included, and whose URL may hold a proxy's password. They may keep the
responses too, with what the server sent, which may quote the credentials back (a proxy's
page quoting the request's headers, a 401 quoting the token it refused): requests' and
httpx's errors keep the response (``exc.response``), aiohttp's the responses of the
redirects before it; each response keeps the ones before it and the requests behind them.
gql chains such errors as the cause of ``TransportServerError`` and
``TransportConnectionFailed``, and crash reporters walk chains. Redacting the records in
place keeps the chain (the URL, the status, the message, what the server said) for
debugging and drops only the credentials.

Each stack's adapter registers where its records are (:func:`register`: a
:class:`RecordScrubber`; aiohttp's is in ``_stacks/aiohttp_redact.py``, requests' and httpx's
beside their auth objects), so this module knows no HTTP stack; what becomes of the records
is decided here, once, the same on every stack.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final, ParamSpec, Protocol, TypeVar
from urllib.parse import quote, quote_plus

from multidict import CIMultiDict, CIMultiDictProxy

REDACTED: Final = "***"
"""What stands where a credential was."""

SENSITIVE_HEADERS: Final = ("Authorization", "Proxy-Authorization", "Cookie")
"""Request headers that carry credentials."""

_R = TypeVar("_R")


def _chain(
    exc: BaseException, keep: Callable[[BaseException], bool] = lambda _: True
) -> Iterable[BaseException]:
    """``exc`` and the exceptions it was raised from or during, each once.

    A link ``keep`` refuses is neither yielded nor followed.
    """
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        link = pending.pop()
        if id(link) in seen or not keep(link):
            continue
        seen.add(id(link))
        yield link
        pending += [e for e in (link.__cause__, link.__context__) if e is not None]


class RecordScrubber(Protocol[_R]):
    """Where an HTTP stack's exceptions keep their records of an exchange, and how to
    change them: the stack's part of :func:`redact_chain`, whose rules are the same for
    every stack. ``_R`` is the stack's response.

    An adapter registers one (:func:`register`) for its stack's exceptions: their records
    of a request hold its headers (and URLs with a proxy's password in them), and the
    responses they keep hold the headers and the body the server sent.
    """

    def passwords(self, link: BaseException) -> list[str]:
        """The passwords in ``link``'s record of a request, to scrub wherever they show."""
        ...

    def scrub(self, link: BaseException) -> None:
        """Blank the credential headers and passwords of ``link``'s own record of the
        request, in place."""
        ...

    def responses(self, link: BaseException) -> Iterable[_R]:
        """The responses ``link`` keeps (the ones before them come from :meth:`history`)."""
        ...

    def history(self, response: _R) -> Iterable[_R]:
        """The responses that came before ``response``: redirects, refusals answered again."""
        ...

    def blank_requests(self, response: _R) -> None:
        """Blank the credential headers of the requests ``response`` keeps a record of (the
        one it answers; one it would have led to)."""
        ...

    def headers(self, response: _R) -> list[tuple[str, str]]:
        """``response``'s headers, each one as received."""
        ...

    def replace_headers(self, response: _R, headers: list[tuple[str, str]]) -> None:
        """Make ``headers`` what ``response`` keeps of its headers, in every copy it keeps."""
        ...

    def body(self, response: _R) -> bytes | None:
        """``response``'s body as it was read; ``None`` when it was not (a stream)."""
        ...

    def replace_body(self, response: _R, body: bytes) -> None:
        """Make ``body`` what ``response`` gives as its body, read or not, without reading
        the body it had: a stream nobody read is let go unread, its buffers with it."""
        ...


_SCRUBBERS: list[RecordScrubber[Any]] = []


def register(scrubber: RecordScrubber[Any], modules: tuple[str, ...]) -> None:
    """Have :func:`redact_chain` scrub the records of a stack's exceptions too, and
    :func:`clear_locals` the frames of its ``modules`` (name prefixes), which hold
    requests' headers."""
    global _LIBRARY_MODULES
    if scrubber not in _SCRUBBERS:
        _SCRUBBERS.append(scrubber)
    _LIBRARY_MODULES += tuple(m for m in modules if m not in _LIBRARY_MODULES)


def redact_chain(exc: BaseException, secrets: Iterable[str] = ()) -> None:
    """Rid every exception in ``exc``'s chain of credentials, in place.

    Blanks the credential headers of the HTTP stacks' records of requests (wherever the
    exception keeps them: attribute, ``args``, the responses it keeps and their redirect
    ``history``), and replaces each of ``secrets`` in the exceptions' messages, ``args``
    and attributes, and in the headers and bodies of the responses they keep, text or
    bytes: a proxy or a debug page may echo the request, and gql puts a body it cannot
    parse into its error message. Exceptions that cannot be changed are left as they are.
    """
    # A proxy password in aiohttp's record is also in the messages made from it, such as
    # gql's TransportConnectionFailed, higher up the chain.
    needles = spellings(
        [*secrets, *(p for link in _chain(exc) for sc in _SCRUBBERS for p in sc.passwords(link))]
    )
    for link in _chain(exc):
        try:
            for scrubber in _SCRUBBERS:
                scrubber.scrub(link)
                _scrub_responses(scrubber, link, needles)
            if isinstance(link, UnicodeEncodeError) and _raised_and_handled_in_libraries(link):
                _mask_unencodable(link)
            if needles:
                _scrub_exception(link, needles)
        except Exception:  # a read-only or odd exception of the caller's: left as it is
            continue


def _scrub_responses(
    scrubber: RecordScrubber[_R], link: BaseException, needles: list[str]
) -> None:
    """Rid the responses ``link`` keeps, and those before them, of credentials: the
    records of their requests blanked, ``needles`` replaced in their headers and bodies."""
    seen: set[int] = set()
    pending = list(scrubber.responses(link))
    while pending:
        response = pending.pop()
        if id(response) not in seen:
            seen.add(id(response))
            pending += scrubber.history(response)
            scrubber.blank_requests(response)
            if needles:
                _scrub_response(scrubber, response, needles)


def _scrub_response(scrubber: RecordScrubber[_R], response: _R, needles: list[str]) -> None:
    headers = scrubber.headers(response)
    scrubbed = [(str(_replace(n, needles, {})), str(_replace(v, needles, {}))) for n, v in headers]
    if scrubbed != headers:
        scrubber.replace_headers(response, scrubbed)
    body = scrubber.body(response)
    if body is None:
        # A body nobody read (a stream; a redirect's, which aiohttp follows unread) may
        # hold a secret, in a buffer or still on the wire. It cannot be scrubbed without
        # reading it, and reading it here would wait on the network for bytes the caller
        # chose not to read: it is dropped unread, and the response reads as empty. Empty
        # rather than "***": nothing was found in it, and a reader must not guess a
        # credential stood there.
        scrubber.replace_body(response, b"")
        return
    scrubbed_body = _replace(body, needles, {})
    if isinstance(scrubbed_body, bytes) and scrubbed_body is not body:
        scrubber.replace_body(response, scrubbed_body)


def _mask_unencodable(link: UnicodeEncodeError) -> None:
    """Blank the text a library failed to encode, whose ``args`` and ``repr`` show it whole.

    aiohttp encodes header values as latin-1, and a proxy's ``user:password`` is one: a
    character beyond latin-1 puts the whole password in the error. Its length and the
    positions stay, and so does a single unencodable character, which ``str()`` names.
    """
    text, start, end = link.object, link.start, link.end
    kept = text[start:end] if end - start == 1 else REDACTED[0] * (end - start)
    masked = REDACTED[0] * start + kept + REDACTED[0] * max(len(text) - end, 0)
    if masked != text:
        link.object = masked
        link.args = tuple(masked if arg == text else arg for arg in link.args)


_LIBRARY_MODULES: tuple[str, ...] = (
    "asyncio",
    "concurrent.futures",
    "gql.",
    "gql_service_auth",
    "json",
    "multidict",
    "tenacity",
    "yarl",
)
"""Modules whose frames may hold a request's credentials, and whose locals are cleared;
each HTTP stack's adapter adds its own (:func:`register`). yarl and multidict from the
start: every stack parses its URLs (a proxy's, with its password) with them before any
adapter's scrubber may have registered (aiohttp's does at the first token fetch)."""


def clear_locals(exc: BaseException) -> None:
    """Drop the locals of finished library frames in the tracebacks of ``exc``'s chain.

    gql's ``post_args``, aiohttp's headers, the grant's form and the JSON decoder's copy
    of a body that quoted a credential all sit in frame locals, and crash reporters such
    as Sentry capture those by default. Only errors raised and handled inside the
    libraries are touched: one whose traceback reaches the caller's own code (the error
    the caller was handling when it called us) is the caller's, and so is its chain. Its
    frames may belong to tasks still running: clearing a suspended coroutine's frame
    closes it on Python 3.12 and before (gql's batching task, for one).
    """
    for link in _chain(exc, keep=_raised_and_handled_in_libraries):
        for frame in _frames(link):
            with contextlib.suppress(RuntimeError):  # a frame still running
                frame.clear()
    # An error raised during the call may come from user code the call ran (an aiohttp
    # trace callback, a connector factory): its traceback reaches that code, yet it is no
    # error the caller was handling. Along ``exc`` and what it was raised from, every frame
    # below a traceback's first (where it was caught) has finished: library ones go too.
    for link in _causes(exc):
        for frame in _frames(link)[1:]:
            if _is_library(frame):
                with contextlib.suppress(RuntimeError):
                    frame.clear()


def _causes(exc: BaseException) -> Iterable[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``), each once."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__


def _frames(exc: BaseException) -> list[FrameType]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _raised_and_handled_in_libraries(exc: BaseException) -> bool:
    return all(_is_library(frame) for frame in _frames(exc))


def _is_library(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(_LIBRARY_MODULES)


def _scrub_exception(link: BaseException, needles: list[str]) -> None:
    scrubbed_args = tuple(_replace(arg, needles, {}) for arg in link.args)
    if scrubbed_args != link.args:
        link.args = scrubbed_args
    if isinstance(link, UnicodeDecodeError):  # the undecodable body, as bytes
        scrubbed_object = _replace(link.object, needles, {})
        if isinstance(scrubbed_object, bytes):
            link.object = scrubbed_object
    for name, value in list(getattr(link, "__dict__", {}).items()):
        # JSONDecodeError.doc holds the whole body; gql's errors hold the answer's parts;
        # aiohttp's hold the response headers.
        scrubbed = _replace(value, needles, {})
        if scrubbed is not value:
            setattr(link, name, scrubbed)


def redact_text(value: object, secrets: Iterable[str]) -> object:
    """``value`` (JSON-like: dicts, lists, strings) with every secret replaced by ``***``.

    For text a server echoes back (an error message quoting the API key it refused)
    before it is put in an exception. Values without a secret are returned as they are.
    """
    needles = spellings(secrets)
    if not needles:
        return value
    return _replace(value, needles, {})


def spellings(secrets: Iterable[str]) -> list[str]:
    """Each of ``secrets`` as a server may quote it back: as sent, JSON-escaped (with
    ``\\/`` as PHP writes it, ``\\u003c`` for ``<``, ``>`` and ``&`` as Go does) and
    percent-encoded; the longest first, so that one that holds another goes whole."""
    found: set[str] = set()
    for secret in secrets:
        if not secret:
            continue
        escaped = json.dumps(secret)[1:-1]
        html_safe = escaped.replace("<", "\\u003c").replace(">", "\\u003e")
        found |= {
            secret,
            escaped,
            escaped.replace("/", "\\/"),
            html_safe.replace("&", "\\u0026"),
            quote(secret, safe=""),
            quote_plus(secret, safe=""),
        }
    return sorted(found, key=len, reverse=True)


def _replace(value: object, needles: list[str], memo: dict[int, object]) -> object:
    """``value`` with the needles replaced; the same object when there was nothing to do."""
    if isinstance(value, str | bytes):
        return _replace_text(value, needles)
    if not isinstance(value, (dict, list, CIMultiDict, CIMultiDictProxy)):
        return value
    if id(value) in memo:  # a cycle, or a part seen already
        return memo[id(value)]
    memo[id(value)] = value
    if isinstance(value, list):
        result = _replace_list(value, needles, memo)
    elif isinstance(value, dict):
        result = _replace_dict(value, needles, memo)
    else:
        result = _replace_headers(value, needles, memo)
    memo[id(value)] = result
    return result


def _replace_text(value: str | bytes, needles: list[str]) -> str | bytes:
    if isinstance(value, str):
        scrubbed = value
        for needle in needles:
            scrubbed = scrubbed.replace(needle, REDACTED)
        return value if scrubbed == value else scrubbed
    data = value
    for needle in needles:
        data = data.replace(needle.encode(), REDACTED.encode())
    return value if data == value else data


def _replace_list(value: list[Any], needles: list[str], memo: dict[int, object]) -> object:
    items = [_replace(item, needles, memo) for item in value]
    changed = any(a is not b for a, b in zip(items, value, strict=True))
    return items if changed else value


def _replace_dict(value: dict[Any, Any], needles: list[str], memo: dict[int, object]) -> object:
    old = list(value.items())
    pairs = [(_replace(k, needles, memo), _replace(v, needles, memo)) for k, v in old]
    changed = any(a is not k or b is not v for (a, b), (k, v) in zip(pairs, old, strict=True))
    return dict(pairs) if changed else value


def _replace_headers(
    value: CIMultiDict[Any] | CIMultiDictProxy[Any], needles: list[str], memo: dict[int, object]
) -> object:
    headers = CIMultiDict((k, str(_replace(v, needles, memo))) for k, v in value.items())
    changed = list(headers.items()) != list(value.items())
    return CIMultiDictProxy(headers) if changed else value


_P = ParamSpec("_P")
_T = TypeVar("_T")


def forgets_on_error(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """``method`` (a function or a coroutine function), whose errors keep no secret in
    their traceback's locals: the one boundary of the package's public entry points.

    A constructor's arguments hold the client secret and a proxy's password; a request's
    frames hold its ``Authorization`` header and answers that may quote it. An error keeps
    every frame it went through, with their locals, in its traceback, and crash reporters
    such as Sentry capture those. When the error reaches this boundary every frame below
    it has finished: their locals are dropped here (see :func:`clear_locals`), and this
    frame lets go of the arguments before re-raising. So the code below needs no ``del``.
    """
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def forgetting_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except BaseException as exc:
                del args, kwargs
                clear_locals(exc)
                raise

        return forgetting_async  # type: ignore[return-value]

    @functools.wraps(method)
    def forgetting(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except BaseException as exc:
            del args, kwargs
            clear_locals(exc)
            raise

    return forgetting
