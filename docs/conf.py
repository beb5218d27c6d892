"""Sphinx configuration of the documentation site: ``make docs`` builds it into docs/_build.

Sphinx with furo and MyST: the long-lived standard of Python libraries, whose autodoc reads
the API reference from the docstrings, and whose pages are Markdown like the README.
"""

from __future__ import annotations

import gql_service_auth

project = "gql-service-auth"
author = "The gql-service-auth authors"
copyright = "2026, the gql-service-auth authors"
release = gql_service_auth.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_screenshots"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The reference follows the docstrings: Google style (Args:, Raises:), type hints in the
# description, members in the order of the source.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # Attributes: as fields, not as a second description of each
autodoc_typehints = "description"
# Types go with the arguments the docstring describes, not in a second list of all of them.
autodoc_typehints_description_target = "documented"
autodoc_member_order = "bysource"
# Defaults as the source writes them: `environ=os.environ`, never the build machine's
# variables (which may hold secrets) rendered into the page.
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "show-inheritance": True}
# Names a reader follows in their own libraries' documentation, which is not fetched here
# (the build runs with no network): shown as text, not as a broken link.
nitpicky = False

html_theme = "furo"
html_title = f"gql-service-auth {release}"
html_show_sourcelink = False


def _public_bases(app: object, name: str, obj: object, options: object, bases: list[type]) -> None:
    """ "Bases:" names what a reader can import: the package's private mixins (the parts the
    stacks share, ``check()``'s) are left out, gql's transport stays."""

    def public(base: type) -> bool:
        return not base.__name__.startswith("_") and "._" not in base.__module__

    # A class whose bases are all private (OAuth2Transport's) names its first public
    # ancestor, gql's transport.
    mro = getattr(obj, "__mro__", ())[1:]
    bases[:] = [base for base in bases if public(base)] or [
        base for base in mro if public(base) and base is not object
    ][:1]


def setup(app: object) -> None:
    app.connect("autodoc-process-bases", _public_bases)  # type: ignore[attr-defined]
