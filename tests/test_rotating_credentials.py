"""Credentials that change without a restart: files and callables, on every stack and both
methods, against the emulator's new and deleted credentials."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest
from support import ANSWER, COUNT, HANG_GUARD, NO_WAIT, in_child, poll
from ways import EVERY_WAY, Call, Way, calls

from gql_service_auth import (
    AuthEvent,
    ConfigurationError,
    CredentialsCallback,
    CredentialsFile,
    CredentialsFiles,
    OAuth2Transport,
)
from gql_service_auth.emulator import ClientRecord, Emulator, ManualClock

CHECK = 0.02
"""Seconds between the watcher's checks in these tests: a change is seen at once."""


def write_json(path: Path, client: ClientRecord) -> None:
    """Replace ``path`` at once, as Kubernetes and Vault Agent do (a rename)."""
    text = json.dumps({"client_id": client.client_id, "client_secret": client.client_secret})
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@pytest.fixture(params=EVERY_WAY, ids=lambda way: way.name)
def way(request: pytest.FixtureRequest) -> Way:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def credentials_file(tmp_path: Path, emulator: Emulator) -> Path:
    path = tmp_path / "credentials.json"
    write_json(path, emulator.recent_client)
    return path


def transport_of(way: Way, method: str, emulator: Emulator, source: object, **kwargs: Any) -> Any:
    if method == "api_key":
        return way.api_key(emulator.graphql_url, credentials=source)
    kwargs.setdefault("retry", NO_WAIT)
    return way.oauth2(
        emulator.graphql_url, token_url=emulator.token_url, credentials=source, **kwargs
    )


def last_client(emulator: Emulator) -> str | None:
    """The client of the last GraphQL request: its key's, or its token's."""
    request = next(r for r in reversed(emulator.requests) if r.path == "/graphql")
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme == "SERVICE-API-KEY":
        return value.partition(":")[0]
    return emulator.client_of_token(value)


def uses(way: Way, transport: Any, emulator: Emulator, client: ClientRecord) -> bool:
    """Whether a query now goes out with ``client``'s credentials."""
    assert way.one(transport, Call(COUNT)) == ANSWER
    return last_client(emulator) == client.client_id


@pytest.mark.parametrize("method", ["api_key", "oauth2"])
def test_a_replaced_file_moves_every_stack_to_the_new_credentials_before_the_old_go(
    way: Way, method: str, emulator: Emulator, credentials_file: Path
) -> None:
    """Old and new overlap: once the new are read, deleting the old fails no query."""
    old = emulator.recent_client
    transport = transport_of(
        way, method, emulator, CredentialsFile(credentials_file, check_every=CHECK)
    )
    assert way.run(transport, calls(COUNT, 4)) == [ANSWER] * 4
    new = emulator.create_credentials()
    write_json(credentials_file, new)
    assert poll(lambda: uses(way, transport, emulator, new))
    emulator.delete_credentials(old)
    assert way.run(transport, calls(COUNT, 8)) == [ANSWER] * 8
    assert emulator.counters.deleted_credentials_used == 0


def test_the_token_of_the_old_credentials_serves_until_the_new_one_lands(
    emulator: Emulator, credentials_file: Path, clock: ManualClock
) -> None:
    """The renewal after a change runs in the background: no request waits for it."""
    events: list[AuthEvent] = []
    transport = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        credentials=CredentialsFile(credentials_file, check_every=CHECK),
        on_event=events.append,
        clock=clock,
    )
    way = EVERY_WAY[0]
    way.one(transport, Call(COUNT))
    emulator.token_latency = 0.5  # the renewal is slow; requests go on meanwhile
    new = emulator.create_credentials()
    write_json(credentials_file, new)
    assert poll(lambda: any(e.name == "credentials_changed" for e in events))
    assert way.run(transport, calls(COUNT, 4)) == [ANSWER] * 4
    assert last_client(emulator) == emulator.recent_client.client_id  # still the old token
    assert poll(lambda: any(e.name == "token_fetched" and e.reason == "expiring" for e in events))
    assert uses(way, transport, emulator, new)
    assert emulator.counters.token_requests == 2


class _Unmarked:
    """A source whose stamp never changes: read again only when forced (a refusal)."""

    check_every = 3600.0

    def __init__(self, client: ClientRecord) -> None:
        self.client = client

    def read(self) -> tuple[str, str]:
        return self.client.client_id, self.client.client_secret

    def stamp(self) -> Hashable:
        return "same"


def test_invalid_client_reads_the_credentials_again_and_asks_once_more(
    way: Way, emulator: Emulator
) -> None:
    """Credentials deleted before the watcher looked: the refused token request reads the
    source again, and the call goes through with the new ones."""
    old = emulator.recent_client
    source = _Unmarked(old)
    transport = transport_of(way, "oauth2", emulator, source)
    way.one(transport, Call(COUNT))
    new = emulator.create_credentials()
    source.client = new
    emulator.delete_credentials(old)  # its token too: the next request is refused
    emulator.reset_counters()
    assert way.run(transport, calls(COUNT, 3)) == [ANSWER] * 3
    # The refused token, then invalid_client for the old pair, then the new pair's token.
    assert emulator.counters.token_requests == 2
    assert emulator.counters.tokens_issued == 1
    assert last_client(emulator) == new.client_id


def test_a_refused_api_key_has_the_source_read_at_once(way: Way, emulator: Emulator) -> None:
    """The key refused: the next query, not the next period, carries the new key."""
    old = emulator.recent_client
    source = _Unmarked(old)
    transport = transport_of(way, "api_key", emulator, source)
    way.one(transport, Call(COUNT))
    new = emulator.create_credentials()
    source.client = new
    emulator.delete_credentials(old)
    (refused,) = way.run(transport, calls(COUNT))
    assert isinstance(refused, Exception)
    assert poll(lambda: uses(way, transport, emulator, new))


def test_a_callable_is_called_at_each_token_fetch(emulator: Emulator) -> None:
    """No stamp: a callable is read before each token request, on the fetch's thread."""
    clients = [emulator.recent_client]
    threads: list[str] = []

    def read() -> tuple[str, str]:
        threads.append(threading.current_thread().name)
        return clients[-1].client_id, clients[-1].client_secret

    transport = transport_of(EVERY_WAY[0], "oauth2", emulator, read)
    way = EVERY_WAY[0]
    way.one(transport, Call(COUNT))
    clients.append(emulator.create_credentials())
    emulator.revoke_tokens()
    way.one(transport, Call(COUNT))
    assert last_client(emulator) == clients[-1].client_id
    assert threading.main_thread().name in threads[:1]  # the constructor's first read
    assert len(threads) >= 3


def test_a_missing_file_keeps_the_last_good_credentials_and_says_so(
    emulator: Emulator, credentials_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mid-rotation the file is gone: queries go on with what was read last, once said."""
    events: list[AuthEvent] = []
    transport = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        credentials=CredentialsFile(credentials_file, check_every=CHECK),
        on_event=events.append,
    )
    way = EVERY_WAY[0]
    way.one(transport, Call(COUNT))
    credentials_file.unlink()
    assert poll(lambda: any(e.name == "credentials_source_failed" for e in events))
    emulator.revoke_tokens()  # a fetch now reads the missing file, and goes on
    assert way.run(transport, calls(COUNT, 2)) == [ANSWER] * 2
    failed = [e for e in events if e.name == "credentials_source_failed"]
    assert len(failed) == 1
    assert failed[0].error == "FileNotFoundError"
    assert str(credentials_file) in (failed[0].detail or "")
    new = emulator.create_credentials()
    write_json(credentials_file, new)
    assert poll(lambda: uses(way, transport, emulator, new))
    warnings = [r for r in caplog.records if "credentials_source_failed" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]


def test_transports_of_one_source_share_one_token(
    way: Way, emulator: Emulator, credentials_file: Path
) -> None:
    """The process's sharing follows the source: two transports, one token request."""
    source = CredentialsFile(credentials_file, check_every=CHECK)
    first = transport_of(way, "oauth2", emulator, source)
    second = transport_of(
        way, "oauth2", emulator, CredentialsFile(credentials_file, check_every=CHECK)
    )
    way.one(first, Call(COUNT))
    way.one(second, Call(COUNT))
    assert emulator.counters.token_requests == 1


def test_a_copy_reads_its_source_anew(emulator: Emulator, credentials_file: Path) -> None:
    """Pickled with its source, never its secret: the copy reads the file itself."""
    transport = transport_of(EVERY_WAY[0], "oauth2", emulator, CredentialsFile(credentials_file))
    data = pickle.dumps(transport)
    assert emulator.recent_client.client_secret.encode() not in data
    new = emulator.create_credentials()
    write_json(credentials_file, new)
    copy = pickle.loads(data)
    assert uses(EVERY_WAY[0], copy, emulator, new)


# -- reading files ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"client_id": "an-id", "client_secret": "a-secret"}',
        "client_id=an-id\nclient_secret=a-secret\n",
        "# rendered by Vault Agent\nexport SERVICE_CLIENT_ID='an-id'\n"
        'SERVICE_CLIENT_SECRET="a-secret"\n',
    ],
    ids=["json", "lines", "env-file"],
)
def test_a_credentials_file_is_read_as_json_or_key_value_lines(tmp_path: Path, text: str) -> None:
    path = tmp_path / "credentials"
    path.write_text(text)
    assert CredentialsFile(path).read() == ("an-id", "a-secret")


def test_two_files_are_read_whole_without_their_line_end(tmp_path: Path) -> None:
    (tmp_path / "client_id").write_text("an-id\n")
    (tmp_path / "client_secret").write_text("a-secret\n")
    source = CredentialsFiles(tmp_path / "client_secret", client_id_file=tmp_path / "client_id")
    assert source.read() == ("an-id", "a-secret")
    fixed_id = CredentialsFiles(tmp_path / "client_secret", client_id="other-id")
    assert fixed_id.read() == ("other-id", "a-secret")


def test_a_bad_file_is_refused_at_construction_without_showing_the_secret(
    tmp_path: Path, emulator: Emulator
) -> None:
    path = tmp_path / "credentials.json"
    secret = emulator.recent_client.client_secret
    path.write_text('{"client_id": "x", "client_secret": "' + secret + '"')  # no closing brace
    with pytest.raises(ConfigurationError, match="is not valid JSON") as caught:
        OAuth2Transport(
            emulator.graphql_url, token_url=emulator.token_url, credentials=CredentialsFile(path)
        )
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert str(path) in str(caught.value)


def test_a_source_and_a_secret_together_are_refused(
    emulator: Emulator, credentials_file: Path
) -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        OAuth2Transport(
            emulator.graphql_url,
            token_url=emulator.token_url,
            client_id="x",
            client_secret="y",
            credentials=CredentialsFile(credentials_file),
        )


def test_a_callback_that_raises_keeps_the_credentials_read_last(emulator: Emulator) -> None:
    fail = [False]
    client = emulator.recent_client

    def read() -> tuple[str, str]:
        if fail[0]:
            raise RuntimeError(client.client_secret)  # a careless message: never shown
        return client.client_id, client.client_secret

    events: list[AuthEvent] = []
    transport = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        credentials=CredentialsCallback(read, check_every=CHECK),
        on_event=events.append,
    )
    fail[0] = True
    assert poll(lambda: any(e.name == "credentials_source_failed" for e in events))
    assert EVERY_WAY[0].one(transport, Call(COUNT)) == ANSWER
    (failed,) = [e for e in events if e.name == "credentials_source_failed"]
    assert failed.error == "RuntimeError"
    assert client.client_secret not in repr(failed)


# -- from_env --------------------------------------------------------------------------


def test_from_env_reads_the_secret_from_its_file(
    way: Way, emulator: Emulator, tmp_path: Path
) -> None:
    client = emulator.recent_client
    (tmp_path / "secret").write_text(client.client_secret + "\n")
    environ = {
        "SERVICE_BASE_URL": emulator.base_url,
        "SERVICE_AUTH_URL": emulator.auth_url,
        "SERVICE_CLIENT_ID": client.client_id,
        "SERVICE_CLIENT_SECRET_FILE": str(tmp_path / "secret"),
    }
    for transport in (way.api_key.from_env(environ), way.oauth2.from_env(environ)):
        assert way.one(transport, Call(COUNT)) == ANSWER


def test_from_env_reads_one_credentials_file(emulator: Emulator, credentials_file: Path) -> None:
    environ = {
        "SERVICE_BASE_URL": emulator.base_url,
        "SERVICE_AUTH_URL": emulator.auth_url,
        "SERVICE_CREDENTIALS_FILE": str(credentials_file),
    }
    assert EVERY_WAY[0].one(OAuth2Transport.from_env(environ), Call(COUNT)) == ANSWER


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SERVICE_CLIENT_SECRET": "s", "SERVICE_CLIENT_SECRET_FILE": "/f"}, "both set"),
        ({"SERVICE_CREDENTIALS_FILE": "/f", "SERVICE_CLIENT_ID": "i"}, "SERVICE_CLIENT_ID"),
        ({"SERVICE_CLIENT_SECRET_FILE": "/f"}, "SERVICE_CLIENT_ID is not set"),
        ({"SERVICE_CLIENT_ID_FILE": "/f", "SERVICE_CLIENT_SECRET": "s"}, "set both"),
    ],
)
def test_from_env_refuses_credentials_given_twice_or_half(
    variables: dict[str, str], message: str
) -> None:
    environ = {
        "SERVICE_BASE_URL": "http://127.0.0.1:1",
        "SERVICE_AUTH_URL": "http://127.0.0.1:1",
        **variables,
    }
    with pytest.raises(ConfigurationError, match=message):
        OAuth2Transport.from_env(environ)


# -- a fleet ---------------------------------------------------------------------------

ROTATION_WORKER = Path(__file__).with_name("rotation_worker.py")
FOUR_STACKS = ("aiohttp", "requests", "httpx", "httpx-async")


def _statuses(tmp_path: Path) -> list[dict[str, Any]]:
    texts = [tmp_path / f"status-{index}.json" for index in range(len(FOUR_STACKS))]
    return [json.loads(path.read_text()) if path.exists() else {} for path in texts]


@pytest.mark.parametrize("method", ["oauth2", "api_key"])
def test_four_processes_sharing_a_store_move_to_new_credentials_with_no_query_failed(
    live_emulator: Emulator, tmp_path: Path, method: str
) -> None:
    """Four processes, one per stack, half reading the file and half a callable, sharing a
    local store: the new credentials are taken up under load, and when the old ones are
    deleted, no query fails and none carries them."""
    emulator = live_emulator
    old = emulator.recent_client
    path = tmp_path / "credentials.json"
    write_json(path, old)
    (tmp_path / "tokens").mkdir(mode=0o700)
    stop = tmp_path / "stop"
    workers = []
    try:
        for index, stack in enumerate(FOUR_STACKS):
            config = {
                "graphql_url": emulator.graphql_url,
                "token_url": emulator.token_url,
                "method": method,
                "stack": stack,
                "source": ("file", "callable")[index % 2],
                "path": str(path),
                "check_every": 0.05,
                "store_url": (tmp_path / "tokens").as_uri(),
                "status": str(tmp_path / f"status-{index}.json"),
                "stop": str(stop),
            }
            environ = {**os.environ, "ROTATION_CONFIG": json.dumps(config)}
            workers.append(subprocess.Popen([sys.executable, str(ROTATION_WORKER)], env=environ))
        assert poll(lambda: all(s.get("ok", 0) >= 3 for s in _statuses(tmp_path)))
        new = emulator.create_credentials()
        write_json(path, new)
        assert poll(lambda: all(s["switched"] for s in _statuses(tmp_path)))
        emulator.delete_credentials(old)
        before = [s["ok"] + s["failed"] for s in _statuses(tmp_path)]
        assert poll(
            lambda: all(
                s["ok"] + s["failed"] >= n + 5
                for s, n in zip(_statuses(tmp_path), before, strict=True)
            )
        )
    finally:
        stop.touch()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    final = _statuses(tmp_path)
    assert [s["errors"] for s in final] == [[]] * len(FOUR_STACKS)
    assert emulator.counters.deleted_credentials_used == 0


def test_a_forked_child_keeps_watching_its_source(
    emulator: Emulator, credentials_file: Path
) -> None:
    """The watcher thread is not in a forked child: the child starts its own."""
    way = EVERY_WAY[0]
    transport = transport_of(
        way, "api_key", emulator, CredentialsFile(credentials_file, check_every=CHECK)
    )
    way.one(transport, Call(COUNT))
    new = emulator.create_credentials()  # the emulator serves from this process
    emulator.delete_credentials(emulator.recent_client)

    def child() -> None:
        write_json(credentials_file, new)

        def answered() -> bool:
            (outcome,) = way.run(transport, calls(COUNT))
            return outcome == ANSWER

        assert poll(answered, timeout=20)

    code, ended = in_child(child, timeout=40)
    assert (code, ended) == (0, "ok")


# -- sources that misbehave --------------------------------------------------------------


def test_a_source_that_blocks_holds_up_no_other_source(
    emulator: Emulator, credentials_file: Path
) -> None:
    """A callable that hangs holds its own reads: another source still rotates, and a
    token fetch of the hung source waits a bounded time, then uses what was read last."""
    release = threading.Event()
    client = emulator.recent_client
    calls_made = [0]

    def hanging() -> tuple[str, str]:
        calls_made[0] += 1
        if calls_made[0] > 1:
            release.wait(HANG_GUARD)
        return client.client_id, client.client_secret

    way = EVERY_WAY[0]
    try:
        stuck = transport_of(
            way, "oauth2", emulator, CredentialsCallback(hanging, check_every=CHECK)
        )
        other = transport_of(
            way, "api_key", emulator, CredentialsFile(credentials_file, check_every=CHECK)
        )
        assert way.one(stuck, Call(COUNT)) == ANSWER  # its fetch waited, then went on
        new = emulator.create_credentials()
        write_json(credentials_file, new)
        assert poll(lambda: uses(way, other, emulator, new))
    finally:
        release.set()


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, OSError])
def test_a_callable_that_raises_anything_is_a_failed_read(
    emulator: Emulator, credentials_file: Path, raised: type[BaseException]
) -> None:
    """Even SystemExit: the last good credentials stay, the watch goes on for the others,
    and only the exception's class is told (its message may quote what it read)."""
    client = emulator.recent_client
    fail = [False]

    def read() -> tuple[str, str]:
        if fail[0]:
            raise raised(client.client_secret)
        return client.client_id, client.client_secret

    events: list[AuthEvent] = []
    transport = OAuth2Transport(
        emulator.graphql_url,
        token_url=emulator.token_url,
        credentials=CredentialsCallback(read, check_every=CHECK),
        on_event=events.append,
    )
    fail[0] = True
    assert poll(lambda: any(e.name == "credentials_source_failed" for e in events))
    (failed,) = [e for e in events if e.name == "credentials_source_failed"]
    assert failed.error == raised.__name__
    assert client.client_secret not in repr(failed)
    assert EVERY_WAY[0].one(transport, Call(COUNT)) == ANSWER
    other = transport_of(
        EVERY_WAY[0], "api_key", emulator, CredentialsFile(credentials_file, check_every=CHECK)
    )
    new = emulator.create_credentials()
    write_json(credentials_file, new)
    assert poll(lambda: uses(EVERY_WAY[0], other, emulator, new))


class _Writing:
    """A source being written: its stamp moves until ``done``.

    Checked rarely: the process's watcher must not read it between the test's own looks
    (on a busy machine it did, and the test's read found nothing new to read).
    """

    check_every = 600

    def __init__(self) -> None:
        self.stamps = iter(range(1_000_000))
        self.done = False
        self.pair = ("an-id", "a-secret")

    def stamp(self) -> Hashable:
        return "final" if self.done else next(self.stamps)

    def read(self) -> tuple[str, str]:
        return self.pair


def test_a_source_is_read_once_its_stamp_holds_still() -> None:
    """A file written in place, or two files replaced one after the other, is not read
    half-way: a stamp that moves between two looks is looked at again later."""
    from gql_service_auth._core.rotation import RotatingCredentials

    source = _Writing()
    credentials = RotatingCredentials(source)
    source.pair = ("an-id", "half-a-sec")
    assert credentials.refresh() is False  # still moving
    assert credentials.client_secret == "a-secret"
    source.done, source.pair = True, ("new-id", "new-secret")
    assert credentials.refresh() is True
    assert (credentials.client_id, credentials.client_secret) == ("new-id", "new-secret")


def test_a_file_naming_a_value_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "credentials"
    for text in (
        "SERVICE_CLIENT_ID=old\nclient_id=new\nclient_secret=s\n",
        "client_id=old\nclient_id=new\nclient_secret=s\n",
        "client_id=old\nCLIENT_ID=new\nclient_secret=s\n",
        '{"client_id": "old", "client_id": "new", "client_secret": "s"}',
    ):
        path.write_text(text)
        with pytest.raises(ConfigurationError, match="twice, with different values"):
            CredentialsFile(path).read()


def test_transports_of_one_source_read_it_once(emulator: Emulator) -> None:
    """A transport per call on one callable: one read when built, one watch, one thread."""
    client = emulator.recent_client
    reads = [0]

    def read() -> tuple[str, str]:
        reads[0] += 1
        return client.client_id, client.client_secret

    source = CredentialsCallback(read, check_every=600)
    transports = [transport_of(EVERY_WAY[0], "api_key", emulator, source) for _ in range(50)]
    assert reads == [1]
    assert EVERY_WAY[0].one(transports[-1], Call(COUNT)) == ANSWER


def test_a_forced_read_asked_during_a_plain_one_still_reads() -> None:
    """A refusal asks for a forced read while the watcher's (which may read nothing: the
    stamp keeps moving) runs: the forced one follows it."""
    from gql_service_auth._core.rotation import RotatingCredentials

    source = _Writing()
    credentials = RotatingCredentials(source)
    source.pair = ("new-id", "new-secret")
    plain = credentials.read_soon()
    forced = credentials.read_soon(force=True)
    assert plain.result(HANG_GUARD) is False  # still moving: nothing read
    assert forced.result(HANG_GUARD) is True
    assert credentials.client_id == "new-id"
