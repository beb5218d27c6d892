"""Credentials that can change without a restart: read from files or a callable.

Give one as ``credentials=`` to any transport or auth object in place of ``client_id``
and ``client_secret``; ``from_env`` builds one from ``SERVICE_CREDENTIALS_FILE``, or
``SERVICE_CLIENT_ID_FILE`` and ``SERVICE_CLIENT_SECRET_FILE``. The source is read when the
transport is made, then again every ``check_every`` seconds on a thread of the package's
(a file only when its inode, size or modification time changed), at each token fetch,
and at once when the service or the authorization server refuses the credentials. A read
that fails keeps the credentials read last in use, and logs
``gql_service_auth.credentials_source_failed``; a change logs
``gql_service_auth.credentials_changed``. See docs/rotating-credentials.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping
from pathlib import Path

from ._core.config import given_or_env
from ._core.constants import (
    ENV_CLIENT_ID,
    ENV_CLIENT_ID_FILE,
    ENV_CLIENT_SECRET,
    ENV_CLIENT_SECRET_FILE,
    ENV_CREDENTIALS_FILE,
)
from ._core.errors import ConfigurationError
from ._core.rotation import CredentialsCallback, CredentialsSource, checked_period

__all__ = ["CredentialsCallback", "CredentialsFile", "CredentialsFiles", "CredentialsSource"]

_MAX_SIZE = 64 * 1024
"""The largest credentials file read: anything bigger is not one (a wrong path)."""

_ID_KEYS = ("client_id", "service_client_id")
_SECRET_KEYS = ("client_secret", "service_client_secret")

_FILE_CHECK_EVERY = 10.0


def _stat(path: Path) -> tuple[int, int, int, int]:
    # Followed through symbolic links: Kubernetes swaps a link to a new directory.
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _text(path: Path) -> str:
    """The file's text, refused when it is too big to be credentials or not UTF-8."""
    with open(path, "rb") as file:
        data = file.read(_MAX_SIZE + 1)
    if len(data) > _MAX_SIZE:
        raise ConfigurationError(f"{path} is larger than {_MAX_SIZE} bytes: not credentials")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass  # raised below, out of this block: the decoder's error holds the bytes
    raise ConfigurationError(f"{path} is not UTF-8 text")


def _value(text: str) -> str:
    """A value of a ``KEY=value`` line, without its quotes."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _json(text: str) -> list[tuple[str, object]] | None:
    """The members of the JSON object ``text``, in order, names repeated as they come;
    ``None`` when it is no JSON object."""
    try:
        members = json.loads(text, object_pairs_hook=list)
    except ValueError:
        return None
    return members if isinstance(members, list) else None


def _pair_of(text: str, path: Path) -> tuple[str, str]:
    """The Client Id and Secret in ``text``: a JSON object, or ``KEY=value`` lines."""
    pairs: list[tuple[str, object]] = []
    stripped = text.strip()
    if stripped.startswith("{"):
        members = _json(stripped)
        if members is None:
            # Raised out of the decoder's except block: its error holds the whole document.
            raise ConfigurationError(f"{path} is not valid JSON")
        pairs = members
    else:
        for line in stripped.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.removeprefix("export ").partition("=")
            pairs.append((key.strip(), _value(value)))
    # Every spelling of each name, every time it comes: two values are a guess, refused.
    ids = {v for k, v in pairs if k.lower() in _ID_KEYS and isinstance(v, str)}
    secrets = {v for k, v in pairs if k.lower() in _SECRET_KEYS and isinstance(v, str)}
    if len(ids) > 1 or len(secrets) > 1:
        # Two names for one value, with two values: which pair is meant is a guess.
        raise ConfigurationError(
            f"{path} gives the Client Id or the Client Secret twice, with different values"
        )
    client_id = next(iter(ids), None)
    client_secret = next(iter(secrets), None)
    if client_id is None or client_secret is None:
        raise ConfigurationError(
            f"{path} holds no client_id and client_secret: write a JSON object "
            '{"client_id": ..., "client_secret": ...}, or the lines client_id=... and '
            "client_secret=... (or SERVICE_CLIENT_ID=... and SERVICE_CLIENT_SECRET=...)"
        )
    return client_id, client_secret


class CredentialsFile:
    """Both credentials in one file, as a secret manager's agent writes it (Vault Agent,
    the Secrets Store CSI driver): a JSON object ``{"client_id": ..., "client_secret":
    ...}``, or ``KEY=value`` lines (``client_id=...`` and ``client_secret=...``, or
    ``SERVICE_CLIENT_ID=...`` and ``SERVICE_CLIENT_SECRET=...``).

    Args:
        path: The file.
        check_every: Seconds between two checks of the file's inode, size and
            modification time; it is read again only when they changed.

    Raises:
        ConfigurationError: ``check_every`` is no number of seconds above 0.
    """

    __slots__ = ("check_every", "path")

    #: Its errors name a file and say what is wrong with it, never its content.
    explains_errors = True

    def __init__(self, path: str | os.PathLike[str], *, check_every: float = _FILE_CHECK_EVERY):
        self.path = Path(path)
        self.check_every = checked_period(check_every)

    def __repr__(self) -> str:
        return f"CredentialsFile({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CredentialsFile):
            return NotImplemented
        return (self.path, self.check_every) == (other.path, other.check_every)

    def __hash__(self) -> int:
        return hash((CredentialsFile, self.path, self.check_every))

    def stamp(self) -> Hashable:
        return _stat(self.path)

    def read(self) -> tuple[str, str]:
        return _pair_of(_text(self.path), self.path)


class CredentialsFiles:
    """The Client Secret in a file of its own, as Kubernetes mounts each key of a Secret,
    and the Client Id in another file or given as it is.

    A file's text is taken whole, without the spaces and line end around it.

    Args:
        client_secret_file: The file of the Client Secret.
        client_id_file: The file of the Client Id.
        client_id: The Client Id, when it has no file (only the secret is rotated).
        check_every: Seconds between two checks of the files' inodes, sizes and
            modification times; they are read again only when these changed.

    Raises:
        ConfigurationError: neither or both of ``client_id_file`` and ``client_id``;
            ``check_every`` is no number of seconds above 0.
    """

    __slots__ = ("check_every", "client_id", "client_id_file", "client_secret_file")

    #: Its errors name a file and say what is wrong with it, never its content.
    explains_errors = True

    def __init__(
        self,
        client_secret_file: str | os.PathLike[str],
        *,
        client_id_file: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        check_every: float = _FILE_CHECK_EVERY,
    ):
        if (client_id_file is None) == (client_id is None):
            raise ConfigurationError("give one of client_id_file and client_id")
        self.client_secret_file = Path(client_secret_file)
        self.client_id_file = None if client_id_file is None else Path(client_id_file)
        self.client_id = client_id
        self.check_every = checked_period(check_every)

    def _key(self) -> tuple[object, ...]:
        return (self.client_secret_file, self.client_id_file, self.client_id, self.check_every)

    def __repr__(self) -> str:
        given = (
            f"client_id_file={str(self.client_id_file)!r}"
            if self.client_id_file is not None
            else f"client_id={self.client_id!r}"
        )
        return f"CredentialsFiles({str(self.client_secret_file)!r}, {given})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CredentialsFiles):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((CredentialsFiles, *self._key()))

    def stamp(self) -> Hashable:
        paths = [self.client_secret_file]
        if self.client_id_file is not None:
            paths.append(self.client_id_file)
        return tuple(_stat(path) for path in paths)

    def read(self) -> tuple[str, str]:
        # Two files change one after the other: a pair read across a change would mix
        # old and new, so the stamps are taken around the read until they agree.
        for _ in range(3):
            before = self.stamp()
            pair = self._read_once()
            if self.stamp() == before:
                return pair
        raise ConfigurationError(f"{self!r}: the files kept changing while read")

    def _read_once(self) -> tuple[str, str]:
        secret = _text(self.client_secret_file).strip()
        if self.client_id_file is not None:
            return _text(self.client_id_file).strip(), secret
        assert self.client_id is not None
        return self.client_id, secret


def credentials_env(
    environ: Mapping[str, str], *, client_id: str | None, client_secret: str | None
) -> dict[str, object]:
    """The credentials keywords of ``from_env``: ``client_id`` and ``client_secret`` as
    given or from their variables, or ``credentials``, a file source, from
    ``SERVICE_CREDENTIALS_FILE`` or ``SERVICE_CLIENT_SECRET_FILE`` (with
    ``SERVICE_CLIENT_ID_FILE`` or ``SERVICE_CLIENT_ID``).

    Raises:
        ConfigurationError: a variable missing, or a value and a file given for the same
            credential; the message names the variables.
    """
    if client_id is not None or client_secret is not None:
        return {
            "client_id": given_or_env(environ, client_id, ENV_CLIENT_ID),
            "client_secret": given_or_env(environ, client_secret, ENV_CLIENT_SECRET),
        }
    env = {name: environ.get(name, "").strip() for name in _CREDENTIAL_VARIABLES}
    both = env[ENV_CREDENTIALS_FILE]
    if both:
        others = [name for name in _CREDENTIAL_VARIABLES[1:] if env[name]]
        if others:
            raise ConfigurationError(
                f"{ENV_CREDENTIALS_FILE} is set, and so is {', '.join(others)}: unset one"
            )
        return {"credentials": CredentialsFile(both)}
    for value, file in (
        (ENV_CLIENT_ID, ENV_CLIENT_ID_FILE),
        (ENV_CLIENT_SECRET, ENV_CLIENT_SECRET_FILE),
    ):
        if env[value] and env[file]:
            raise ConfigurationError(f"{value} and {file} are both set: unset one")
    if env[ENV_CLIENT_SECRET_FILE]:
        if not env[ENV_CLIENT_ID] and not env[ENV_CLIENT_ID_FILE]:
            given_or_env(environ, None, ENV_CLIENT_ID)  # raises, naming the variable
        return {
            "credentials": CredentialsFiles(
                env[ENV_CLIENT_SECRET_FILE],
                client_id_file=env[ENV_CLIENT_ID_FILE] or None,
                client_id=env[ENV_CLIENT_ID] or None,
            )
        }
    if env[ENV_CLIENT_ID_FILE]:
        raise ConfigurationError(
            f"{ENV_CLIENT_ID_FILE} is set without {ENV_CLIENT_SECRET_FILE}: a rotated "
            "Client Id comes with a new secret; set both"
        )
    return {
        "client_id": given_or_env(environ, None, ENV_CLIENT_ID),
        "client_secret": given_or_env(environ, None, ENV_CLIENT_SECRET),
    }


_CREDENTIAL_VARIABLES = (
    ENV_CREDENTIALS_FILE,
    ENV_CLIENT_ID,
    ENV_CLIENT_SECRET,
    ENV_CLIENT_ID_FILE,
    ENV_CLIENT_SECRET_FILE,
)
_VALUE_OR_FILE = ((ENV_CLIENT_ID, ENV_CLIENT_ID_FILE), (ENV_CLIENT_SECRET, ENV_CLIENT_SECRET_FILE))

# Shown where users import them from, as the errors are (see _core/errors.py).
CredentialsFile.__module__ = "gql_service_auth"
CredentialsFiles.__module__ = "gql_service_auth"
