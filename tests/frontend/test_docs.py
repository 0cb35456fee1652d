"""The language reference a user can reach: docs/language.md (installed with the package), the anchors error hints
point to, and the docstrings of tilejit.language that help() shows."""
from __future__ import annotations

import inspect
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


def test_every_builtin_in_the_reference_table():
    text = DOC.read_text()
    reference = text[text.index("## Reference"):]
    for name in BUILTINS:
        if hasattr(T, name):
            assert f"T.{name}" in reference, name
