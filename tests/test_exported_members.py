"""The public API is exactly what ``__all__`` lists."""

import gql_service_auth
import gql_service_auth.emulator


def test_all_public_names_are_exported() -> None:
    """Every public name of the package is in ``__all__``, and every entry exists."""
    for module in (gql_service_auth, gql_service_auth.emulator):
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
    for module in (gql_service_auth, gql_service_auth.emulator):
        assert list(module.__all__) == sorted(module.__all__)


def test_version_comes_from_metadata() -> None:
    """``__version__`` is the installed distribution's version."""
    from importlib.metadata import version

    assert gql_service_auth.__version__ == version("gql-service-auth")
