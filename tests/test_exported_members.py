"""The public API is exactly what ``__all__`` lists, and the lazy package resolves it.

Type hints resolve, and the first use of a name from many threads at once, a star
import, or a submodule imported first, all find every name.
"""

from __future__ import annotations

import pickle
import traceback
import typing

from support import run_python

import gql_service_auth
import gql_service_auth.aiohttp
import gql_service_auth.emulator
from gql_service_auth import (
    ApiKeyTransport,
    OAuth2Transport,
)


def test_all_public_names_are_exported() -> None:
    """Every public name of the package is in ``__all__``, and every entry exists."""
    for module in (gql_service_auth, gql_service_auth.aiohttp, gql_service_auth.emulator):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", "").startswith("gql_service_auth")
        }
        assert public <= set(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__)


def test_all_is_sorted() -> None:
    """``__all__`` is sorted, so additions are easy to review."""
    for module in (gql_service_auth, gql_service_auth.aiohttp, gql_service_auth.emulator):
        assert list(module.__all__) == sorted(module.__all__)


def test_version_comes_from_metadata() -> None:
    """``__version__`` is the installed distribution's version."""
    from importlib.metadata import version

    assert gql_service_auth.__version__ == version("gql-service-auth")


def test_public_classes_name_the_module_users_import_them_from() -> None:
    """Classes of gql_service_auth's private modules say gql_service_auth, and still resolve."""
    for name in gql_service_auth.__all__:
        value = getattr(gql_service_auth, name)
        if isinstance(value, type):
            # The package itself, or the public module that defines it (transports).
            assert not any(p.startswith("_") for p in value.__module__.split(".")), name
            if value.__module__ == "gql_service_auth":
                # Annotations are resolved in the module __module__ names: they must be.
                typing.get_type_hints(value)
    assert gql_service_auth.TokenRequestError.__module__ == "gql_service_auth"


def test_tracebacks_show_the_public_name() -> None:
    """A traceback prints gql_service_auth.TokenRequestError, where users import it from."""
    try:
        raise gql_service_auth.TokenRequestError("no token", status=503)
    except gql_service_auth.TokenRequestError as exc:
        text = "".join(traceback.format_exception(exc))
    assert "gql_service_auth.TokenRequestError: no token" in text
    assert "_core" not in text  # the module it lives in is no part of its name


def test_public_errors_and_values_still_pickle() -> None:
    """Pickle finds each class under its public module, and the copy keeps its attributes."""
    error = gql_service_auth.TokenRequestError("refused", status=401, error="invalid_client")
    error.attempts = 2
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is gql_service_auth.TokenRequestError
    assert (str(copy), copy.status, copy.error, copy.attempts) == (
        str(error),
        401,
        "invalid_client",
        2,
    )
    rejected = gql_service_auth.ApiKeyRejectedError("refused", errors=[{"message": "x"}])
    assert pickle.loads(pickle.dumps(rejected)).errors == [{"message": "x"}]
    for value in (
        gql_service_auth.RetryPolicy(attempts=2),
        gql_service_auth.AuthEvent("token_fetched", reason="initial"),
    ):
        assert pickle.loads(pickle.dumps(value)) == value


def test_lazy_names_are_listed() -> None:
    """dir() lists every public name, though the package imports them on first use."""
    assert set(gql_service_auth.__all__) <= set(dir(gql_service_auth))


def test_options_and_constructors_have_resolvable_type_hints() -> None:
    """aiohttp's cookie types are forward references: they must resolve (pydantic, IDEs)."""
    for name in (
        "AIOHTTPTransportOptions",
        "ApiKeyOptions",
        "OAuth2Options",
        "TokenOptions",
        "TokenSessionArgs",
    ):
        typing.get_type_hints(getattr(gql_service_auth, name))
    for cls in (ApiKeyTransport, OAuth2Transport):
        typing.get_type_hints(cls.__init__)


def test_first_use_from_many_threads_and_after_a_submodule() -> None:
    """Threads racing for the first lazy name all get it; star import; a submodule first."""
    completed = run_python(
        """
        import threading
        import gql_service_auth.emulator
        import gql_service_auth as package
        names = list(package.__all__)
        barrier = threading.Barrier(len(names))
        got = {}
        def use(name):
            barrier.wait(timeout=30)
            got[name] = getattr(package, name)
        threads = [threading.Thread(target=use, args=(n,)) for n in names]
        for t in threads: t.start()
        for t in threads: t.join(timeout=30)
        assert sorted(got) == sorted(names), set(names) - set(got)
        namespace = {}
        exec("from gql_service_auth import *", namespace)
        assert set(package.__all__) <= set(namespace)
        print("ok")
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"
