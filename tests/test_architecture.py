"""The package's shape, as docs/architecture.md states it: no import cycles, and the modules
it lists as the core and as the stores import no HTTP stack and no gql transport.

The second is checked by importing each of them in a fresh interpreter where aiohttp,
httpx, requests and gql's HTTP transports cannot be imported: an import through any path
(not only a direct one) fails there. The modules are read from the page's tables, so the
page and the code cannot drift apart unnoticed.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gql_service_auth"
PAGE = ROOT / "docs" / "architecture.md"

STACKS = (
    "aiohttp",
    "httpx",
    "requests",
    "gql.transport.aiohttp",
    "gql.transport.httpx",
    "gql.transport.requests",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (functions included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {each for each in found if each.startswith("gql_service_auth")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: _imports(path) & modules.keys() - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_package_has_no_import_cycles() -> None:
    # A module importing its own package (its __init__, which may import it back, lazily
    # or not) is no cycle of meaning.
    graph = {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in _graph().items()
    }
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a graph with a loop has one component."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _listed(section: str) -> list[str]:
    """The modules the first column of a section's table names, as import paths."""
    text = PAGE.read_text(encoding="utf-8")
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    names = []
    for row in re.findall(r"^\| (.+?) \|", body, re.MULTILINE):
        for file in re.findall(r"`([\w/]+)\.py`", row):
            names.append("gql_service_auth." + file.replace("/", "."))
    return names


def test_the_core_and_the_stores_import_no_http_stack() -> None:
    modules = _listed("The core") + _listed("The stores")
    assert "gql_service_auth._core.tokens" in modules  # the page's tables were read
    assert "gql_service_auth._stores.level" in modules
    program = f"""
import importlib, sys
for name in {STACKS!r}:
    sys.modules[name] = None  # import of it raises ImportError
failed = []
for module in {modules!r}:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        failed.append(f"{{module}}: {{exc}}")
print("\\n".join(failed))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_an_adapter_does_import_its_stack_where_the_check_blocks_it() -> None:
    """The blocking the check above relies on works: the aiohttp transports cannot be
    imported with aiohttp blocked."""
    program = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "try:\n    import gql_service_auth.transports\nexcept ImportError:\n    print('blocked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "blocked", done.stdout + done.stderr


def test_the_requests_and_httpx_adapters_load_aiohttp_only_for_a_token() -> None:
    """Importing the requests and httpx modules (and the package's errors and options from
    its top level), and building their OAuth2 transports and auth objects, loads no
    aiohttp (half of what importing them cost): the token request, which goes through
    aiohttp on every stack, loads it when a token is first fetched."""
    program = """
import sys
import gql_service_auth.requests as r, gql_service_auth.httpx as h
from gql_service_auth import ConfigurationError, RetryPolicy, TokenOptions, UnauthenticatedError
token_url = "https://auth.example.com/oauth2/token"
r.OAuth2RequestsTransport("https://api.example.com/graphql", token_url=token_url,
                          client_id="id", client_secret="secret")
h.OAuth2HTTPXTransport("https://api.example.com/graphql", token_url=token_url,
                       client_id="id", client_secret="secret")
h.OAuth2Auth(token_url, "id", "secret", url="https://api.example.com/graphql")
print(sorted(name for name in sys.modules if name.split(".")[0] == "aiohttp"))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_token_machinery_loads_with_the_first_oauth2_transport_not_at_import() -> None:
    """Importing the requests and httpx modules, and using an API key, loads no token
    manager, its plans, nor the shared store level: the first OAuth2 transport does (a
    third of what our modules cost at import, figure 15 of make bench)."""
    program = """
import sys
import gql_service_auth.requests as r, gql_service_auth.httpx as h
from gql_service_auth import TokenOptions
import typing
typing.get_type_hints(TokenOptions)
machinery = ("gql_service_auth._core.tokens", "gql_service_auth._stores.level")
h.ApiKeyHTTPXTransport("https://api.example.com/graphql", client_id="id", client_secret="s")
r.ApiKeyRequestsTransport("https://api.example.com/graphql", client_id="id", client_secret="s")
print([name for name in machinery if name in sys.modules])
h.OAuth2HTTPXTransport("https://api.example.com/graphql",
                       token_url="https://auth.example.com/oauth2/token",
                       client_id="id", client_secret="secret")
print([name for name in machinery if name in sys.modules])
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "[]",
        "['gql_service_auth._core.tokens', 'gql_service_auth._stores.level']",
    ]


def test_the_page_lists_every_module_of_the_core_and_the_stores() -> None:
    """A module added to ``_core/`` or ``_stores/`` is on the page, so the check above
    imports it too."""
    listed = set(_listed("The core") + _listed("The stores"))
    for folder in ("_core", "_stores"):
        for path in (PACKAGE / folder).glob("*.py"):
            if path.name != "__init__.py":
                assert _module_name(path) in listed, f"{path.name} is not on the page"


def _stack_imports(path: Path) -> list[str]:
    """The HTTP stacks and gql transports ``path`` imports anywhere: in a function, under
    ``try``, behind ``TYPE_CHECKING``: what the import check above cannot see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for name in names:
            if any(name == stack or name.startswith(stack + ".") for stack in STACKS):
                found.append(f"{path.name}:{node.lineno} imports {name}")
    return found


def test_the_core_and_the_stores_name_no_http_stack_anywhere() -> None:
    found = []
    for folder in ("_core", "_stores"):
        for path in (PACKAGE / folder).glob("*.py"):
            found += _stack_imports(path)
    assert found == []


def test_the_static_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    lines = ["def later():", "    try:", "        import aiohttp.web", "    except ImportError:"]
    module.write_text("\n".join([*lines, "        pass", ""]))
    assert _stack_imports(module) == ["lazy.py:3 imports aiohttp.web"]


@pytest.mark.skipif(
    importlib.util.find_spec("httpx2") is None, reason="gql runs on httpx alone: nothing to spare"
)
def test_the_httpx_transports_leave_the_httpx_library_gql_did_not_pick_unimported() -> None:
    """With httpx2 installed, gql's transports run on it: importing and building ours
    loads no httpx (18-22 ms, with the click and pygments it brings). Naming the public
    auth objects, for clients the user builds, makes them fit both libraries' clients."""
    program = """
import sys
import gql_service_auth.httpx as h
h.OAuth2HTTPXTransport("https://api.example.com/graphql", client_id="id",
                       client_secret="secret", token_url="https://auth.example.com/token")
h.ApiKeyHTTPXTransport("https://api.example.com/graphql", client_id="id",
                       client_secret="secret")
print("httpx" in sys.modules)
auth = h.ApiKeyAuth("id", "secret", url="https://api.example.com/graphql")
import httpx, httpx2
for library in (httpx, httpx2):
    with library.Client(auth=auth) as client:  # refused unless auth is the library's Auth
        print(client.auth is auth)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


@pytest.mark.skipif(
    importlib.util.find_spec("httpx2") is None, reason="gql runs on httpx alone: nothing to spare"
)
def test_an_auth_object_unpickled_in_a_fresh_process_fits_both_httpx_libraries() -> None:
    """Unpickling (a spawned worker's arguments, a queue) names the public class, which
    makes it fit the client of the library gql did not pick, as one built there would."""
    dump = (
        "import pickle, sys\n"
        "from gql_service_auth.httpx import ApiKeyAuth, OAuth2Auth\n"
        "url = 'https://api.example.com/graphql'\n"
        "objects = (ApiKeyAuth('id', 'secret', url=url),\n"
        "           OAuth2Auth('https://auth.example.com/token', 'id', 'secret', url=url))\n"
        "sys.stdout.buffer.write(pickle.dumps(objects))\n"
    )
    load = (
        "import pickle, sys\n"
        "objects = pickle.loads(sys.stdin.buffer.read())\n"
        "import httpx\n"
        "for auth in objects:\n"
        "    with httpx.Client(auth=auth) as client:\n"
        "        print(type(auth).__name__, client.auth is auth)\n"
    )
    dumped = subprocess.run(
        [sys.executable, "-c", dump], capture_output=True, timeout=120, check=True
    ).stdout
    done = subprocess.run(
        [sys.executable, "-c", load], input=dumped, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["ApiKeyAuth", "True", "OAuth2Auth", "True"]
