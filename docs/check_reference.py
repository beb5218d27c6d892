"""Fail unless the built API reference documents every public name, and no page shows the
build's environment.

Every name in ``__all__`` of the package and of its public modules must have an anchor
in ``api.html``: a name added to ``__all__`` and missed by the reference fails ``make docs``.
A default of ``os.environ`` rendered by value would publish the build machine's variables,
secrets included: ``make docs`` sets a canary variable, which no page may contain.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

PUBLIC_MODULES = (
    "gql_service_auth",
    "gql_service_auth.aiohttp",
    "gql_service_auth.requests",
    "gql_service_auth.httpx",
    "gql_service_auth.redis",
    "gql_service_auth.local",
    "gql_service_auth.emulator",
)


def missing(html: str) -> list[str]:
    """The public names with no anchor in the reference's ``html``."""
    absent = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            if name.startswith("__"):
                continue  # __version__ is on the home page
            if f'id="{module_name}.{name}"' not in html:
                absent.append(f"{module_name}.{name}")
    return absent


def main() -> int:
    built = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    canary = sys.argv[2] if len(sys.argv) > 2 else None
    absent = missing((built / "api.html").read_text(encoding="utf-8"))
    for name in absent:
        print(f"not in the API reference: {name}", file=sys.stderr)
    leaks = [
        page
        for page in sorted(built.rglob("*.html"))
        if canary and canary in page.read_text(encoding="utf-8")
    ]
    for page in leaks:
        print(f"{page} shows the build's environment", file=sys.stderr)
    return 1 if absent or leaks else 0


if __name__ == "__main__":
    sys.exit(main())
