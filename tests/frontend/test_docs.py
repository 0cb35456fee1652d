"""The language reference a user can reach: docs/language.md (installed with the package), the anchors error hints
point to, and the docstrings of tilejit.language that help() shows."""
from __future__ import annotations

import ast
import inspect
import os
import pydoc
import re
from pathlib import Path

import pytest

import tilejit
import tilejit.language as T
from tilejit.dtypes import DType
from tilejit.frontend.builtins import BUILTINS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "language.md"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_the_package_ships_the_reference():
    path = Path(tilejit.docs())
    assert path.is_file() and path.read_text() == DOC.read_text()
    assert tilejit.docs("while-loops") == f"{path}#while-loops"


def test_every_anchor_hints_and_the_reference_use_exists():
    text = DOC.read_text()
    anchors = github_anchors(text)
    used = set(re.findall(r"\]\(#([\w-]+)\)", text))
    for source in (REPO / "tilejit").rglob("*.py"):
        code = source.read_text()
        used |= set(re.findall(r"docs_link\(['\"]([\w-]+)['\"]\)", code))
        used |= set(re.findall(r"docs/language\.md#([\w-]+)", code))
    assert {"while-loops", "constexprs", "what-kernels-cannot-do", "helper-functions", "broadcasting"} <= used
    assert used <= anchors, sorted(used - anchors)


LANGUAGE_FUNCTIONS = [name for name in T.__all__ if not isinstance(getattr(T, name), DType)]


@pytest.mark.parametrize("name", LANGUAGE_FUNCTIONS)
def test_every_language_function_has_a_useful_docstring(name):
    obj = getattr(T, name)
    doc = inspect.getdoc(obj)
    assert doc and len(doc.splitlines()) >= 6, f"T.{name}: {doc!r}"
    assert "Example::" in doc, f"T.{name} has no example"
    rendered = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert len(rendered.splitlines()) >= 8


def test_help_gemm_explains_shapes_dtypes_and_shows_an_example():
    text = pydoc.render_doc(T.gemm, renderer=pydoc.plaintext)
    assert len(text.splitlines()) >= 25
    for phrase in ("(M, K)", "(K, N)", "float32", "int32", "transpose_b=True", "Example::"):
        assert phrase in text


def reference_table() -> str:
    """The table of docs/language.md's "Reference" section (up to the next section)."""
    text = DOC.read_text()
    section = text[text.index("## Reference\n"):]
    section = section[:section.index("\n## ", 1)]
    return "\n".join(line for line in section.splitlines() if line.startswith("| "))


def test_every_public_name_of_the_language_is_in_the_reference_table():
    names_in_table = set(re.findall(r"`T\.(\w+)", reference_table()))
    assert set(T.__all__) <= names_in_table, sorted(set(T.__all__) - names_in_table)
    assert names_in_table <= set(T.__all__), sorted(names_in_table - set(T.__all__))  # no name that is gone


def test_every_builtin_in_the_reference_table():
    table = reference_table()
    for name in BUILTINS:
        if hasattr(T, name):
            assert f"T.{name}" in table, name


def knobs_variables() -> set[str]:
    """The environment variables tilejit/knobs.py reads: the upper-case string constants of its code."""
    tree = ast.parse((REPO / "tilejit" / "knobs.py").read_text())
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"[A-Z][A-Z0-9_]*", node.value)}


def test_the_readme_lists_every_environment_variable_knobs_reads():
    variables = knobs_variables()
    assert {"TILEJIT_CACHE_DIR", "TILEJIT_COMPILE_WORKERS", "TILEJIT_LOCK_TIMEOUT", "XDG_CACHE_HOME"} <= variables
    readme = (REPO / "README.md").read_text()
    missing = sorted(v for v in variables if f"`{v}" not in readme)
    assert not missing, f"README.md does not list {missing}"


def test_the_language_reference_lists_every_tilejit_variable():
    doc = DOC.read_text()
    table = doc[doc.index("## Environment variables"):doc.index("## Reference")]
    missing = sorted(v for v in knobs_variables() if v.startswith("TILEJIT_") and f"`{v}" not in table)
    assert not missing, f"docs/language.md's environment table does not list {missing}"


#: Relative paths in prose: a word of path characters with a slash or a file suffix, inside backticks or a link.
_PATH_MENTION = re.compile(r"(?:`|\]\()((?:\.{0,2}/)?[\w.-]+(?:/[\w.-]+)*\.(?:py|md|c|cuh|h|json|toml|sh|txt)|"
                           r"[\w.-]+(?:/[\w.-]+)+/?)(?:[#`)])")


@pytest.mark.parametrize("doc", ["README.md", "docs/language.md"])
def test_every_file_the_docs_mention_exists(doc):
    """A path the README or the language reference names (in backticks or a link) is in the repository: one
    with a folder from the repository's root or from the package's (``backend_cuda/...``), a bare ``*.md``
    name from the root or the document's folder. Bare module names (``knobs.py``) follow a ``tilejit/...``
    path in the same sentence and cache file names (``meta.json``) are not files of the repository."""
    text = (REPO / doc).read_text()
    mentioned = {m.rstrip("/") for m in _PATH_MENTION.findall(text)}
    checked = {m for m in mentioned if "/" in m or m.endswith(".md")}
    assert {"tilejit/knobs.py", "docs/language.md"} <= checked or doc != "README.md"
    bases = (REPO, REPO / "tilejit", (REPO / doc).parent)
    missing = sorted(m for m in checked if not any((base / m).exists() for base in bases))
    assert not missing, f"{doc} names files the repository does not have: {missing}"
    markdown_names = set()
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if not d.startswith((".", "__"))]  # .venv, .git, caches
        markdown_names |= {f for f in files if f.endswith(".md")}
    cited = set(re.findall(r"\b([\w-]+\.md)\b", text))  # in prose too: "see RESULTS.md"
    assert cited <= markdown_names, f"{doc} cites {sorted(cited - markdown_names)}, which the repository lacks"


def test_ci_runs_exactly_the_readmes_test_command():
    """.ci/run installs the test extra and runs the README's test command, word for word; the command runs
    the suite in parallel with pytest-xdist, which the test extra installs."""
    readme = (REPO / "README.md").read_text()
    (command,) = [line.strip() for line in readme.splitlines() if "python -m pytest" in line and "pip install" in line]
    tail = command[command.index("pip install -e '.[test]'"):]
    assert " -n " in tail
    assert tail in (REPO / ".ci" / "run").read_text()
    assert '"pytest-xdist"' in (REPO / "pyproject.toml").read_text()
