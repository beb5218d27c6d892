"""The README and the documentation pages run as written: every Python block, against the
emulator; every guide has one; every link of the README resolves.

A block is a complete program, run with ``python -W error``, unless the HTML comment
``<!-- readme: pytest -->`` on the line above marks it as a test file, run with pytest and
the plugin. The README's placeholder hosts are pointed at the emulator, and the block
gets the emulator's ``SERVICE_*`` variables, as a user's shell would have them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gql_service_auth.emulator import Emulator

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
PAGES = [page for page in PAGES if "_build" not in page.parts]
PLACEHOLDERS = ("https://api.example.com", "https://auth.example.com")
BLOCK = re.compile(
    r"(?:^<!-- readme: (?P<kind>\w+) -->\n)?^```python\n(?P<code>.*?)^```$", re.M | re.S
)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str
    code: str


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    return [
        Block(
            name,
            text.count("\n", 0, match.start("code")),
            match["kind"] or "program",
            match["code"],
        )
        for match in BLOCK.finditer(text)
    ]


BLOCKS = [block for page in PAGES for block in _blocks(page)]


def test_the_readme_and_docs_have_blocks_of_each_kind() -> None:
    """The collector finds the blocks, so the tests below cannot pass by running nothing."""
    kinds = [block.kind for block in BLOCKS]
    # The README is a landing page: one program per method, the API key and OAuth2.
    assert [block.kind for block in BLOCKS if block.page == "README.md"].count("program") >= 2
    assert [block.page for block in BLOCKS if block.kind == "pytest"].count("docs/testing.md") >= 2
    assert set(kinds) == {"program", "pytest"}, "an unknown <!-- readme: ... --> marker"


# The guides whose code CI runs as pasted: each shows at least one program.
GUIDES_WITH_CODE = [
    "getting-started",
    "choosing",
    "aiohttp",
    "requests",
    "httpx",
    "web-services",
    "scripts",
    "workers",
    "tokens",
    "managed-redis",
    "testing",
    "errors",
    "metrics",
    "configuration",
]


@pytest.mark.parametrize("guide", GUIDES_WITH_CODE)
def test_each_guide_has_a_program_that_runs(guide: str) -> None:
    """A guide's code is run, not only shown: a page that lost its blocks fails here."""
    page = f"docs/{guide}.md"
    assert any(block.page == page and block.kind == "program" for block in BLOCKS), page


@pytest.mark.parametrize(
    "block", BLOCKS, ids=lambda block: f"{block.page}:line{block.line}-{block.kind}"
)
def test_block_runs_against_the_emulator(
    block: Block, live_emulator: Emulator, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    code = block.code
    for placeholder in PLACEHOLDERS:
        code = code.replace(placeholder, live_emulator.base_url)
    script = tmp_path / ("test_block.py" if block.kind == "pytest" else "block.py")
    script.write_text(code, encoding="utf-8")
    # A proxy of the machine's (a block uses trust_env) must not stand between it and 127.0.0.1.
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SERVICE_") and not k.lower().endswith("_proxy")
    }
    environ.update(live_emulator.environ())
    if "REDIS_URL" in block.code:  # a block that shares tokens gets a real Redis
        environ["REDIS_URL"] = request.getfixturevalue("redis_server").url
    if block.kind == "pytest":
        # As in a user's project, where pytest-asyncio (installed here) wants its scope set.
        command = [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider"]
        command += ["-o", "asyncio_default_fixture_loop_scope=function"]
    else:
        command = [sys.executable, "-W", "error"]
    completed = subprocess.run(
        [*command, script.name],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    if block.kind == "pytest":
        assert re.search(r"\b1 passed\b", completed.stdout), completed.stdout
    else:
        assert completed.stdout.strip(), "a block shows what it did"
        uses_this_emulator = "Emulator(" not in block.code
        assert (live_emulator.counters.graphql_requests > 0) == uses_this_emulator


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$", re.M)
MARKER = re.compile(r"<!--\s*readme", re.I)


def _escapes(text: str) -> list[str]:
    """Python blocks and markers the collector would skip: each a line, for the message.

    Only a fence at column 0 written exactly ```python is collected, and a marker only as
    ``<!-- readme: KIND -->`` right above one; anything else Python-looking would be
    silently left unrun.
    """
    collected = {text.count("\n", 0, m.start("code")) - 1 for m in BLOCK.finditer(text)}
    escapes = []
    for match in FENCE.finditer(text):
        language = match["info"].split()[0].lower() if match["info"].strip() else ""
        line = text.count("\n", 0, match.start())
        if language.startswith(("py", "{py", "{.py")) and line not in collected:
            escapes.append(f"line {line + 1}: {match[0].strip()!r}")
    markers = {text.count("\n", 0, m.start("code")) - 2 for m in BLOCK.finditer(text) if m["kind"]}
    for match in MARKER.finditer(text):
        line = text.count("\n", 0, match.start())
        if line not in markers:
            escapes.append(f"line {line + 1}: a marker that marks no ```python block")
    return escapes


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_python_block_escapes_the_collector(page: Path) -> None:
    """A ```py fence, an indented one, a marker typo: each would pass by running nothing."""
    assert _escapes(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "text",
    [
        "```py\nprint(1)\n```\n",
        "```python3\nprint(1)\n```\n",
        "```Python\nprint(1)\n```\n",
        "```python title=x\nprint(1)\n```\n",
        "- item\n\n  ```python\n  print(1)\n  ```\n",
        "~~~python\nprint(1)\n~~~\n",
        "<!-- readme:pytest -->\n```python\ndef test_x(): pass\n```\n",
        "<!-- readme: pytest -->\n\n```python\ndef test_x(): pass\n```\n",
        "<!-- readme: pytest -->\n```py\ndef test_x(): pass\n```\n",
    ],
)
def test_the_guard_sees_blocks_the_collector_skips(text: str) -> None:
    assert _escapes(text)
    assert _escapes("<!-- readme: pytest -->\n```python\ndef test_x(): pass\n```\n") == []


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


REPOSITORY = "https://github.com/gql-service-auth/gql-service-auth/"


def test_every_link_to_the_project_resolves_and_works_on_pypi() -> None:
    """The README is also the package's page on PyPI, which resolves no relative link: links
    to the project's files are absolute, and each names a file of this clone (and of the
    sdist, whose make test runs this too)."""
    text = README.read_text(encoding="utf-8")
    anchors = {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    targets = [m["target"] for m in LINK.finditer(text)]
    relative = [t for t in targets if "://" not in t and not t.startswith("#")]
    assert relative == [], "relative links are dead on PyPI"
    files = (REPOSITORY + "blob/main/", REPOSITORY + "tree/main/")
    ours = [t for t in targets if t.startswith(files)]
    assert len(ours) >= 10, "the README links into the documentation"
    for target in ours:
        path = target.removeprefix(REPOSITORY)[len("blob/main/") :]
        assert (ROOT / path.partition("#")[0]).exists(), f"{target} is missing"
    for target in targets:
        if target.startswith("#"):
            assert target[1:] in anchors, f"no heading for {target}"


def test_the_version_has_a_dated_changelog_section_and_the_install_lines_name_its_wheel() -> None:
    """A release bumps pyproject.toml; the CHANGELOG and the pasted wheel names follow."""
    # Not tomllib, which Python 3.10 lacks: the [project] table's version line.
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"$', project, re.M)[1]  # type: ignore[index]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    wheel = f"gql_service_auth-{version}-py3-none-any.whl"
    for page in (README, ROOT / "docs" / "getting-started.md"):
        names = re.findall(r"gql_service_auth-[\w.]+-py3-none-any\.whl", page.read_text())
        assert names, f"{page.name} names no wheel"
        assert set(names) == {wheel}, page.name
