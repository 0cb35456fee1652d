"""Each T.<name> a kernel may call is declared once: a stub in tilejit.language and one handler in
tilejit.frontend.builtins.BUILTINS, and the two lists agree."""
from __future__ import annotations

import tilejit.language as T
from tilejit.frontend.builtins import BUILTINS

LOOP_MARKERS = {"range", "static_range"}  # iterables of `for`, handled by the for statement, not called


def _language_builtins() -> set[str]:
    return {obj.__tilejit_builtin__ for obj in vars(T).values() if hasattr(obj, "__tilejit_builtin__")}


def test_every_language_builtin_has_one_handler():
    missing = _language_builtins() - LOOP_MARKERS - set(BUILTINS)
    assert not missing, f"tilejit.language names without a frontend handler: {sorted(missing)}"


def test_every_handler_is_a_language_builtin():
    extra = set(BUILTINS) - _language_builtins()
    assert not extra, f"frontend handlers with no tilejit.language stub: {sorted(extra)}"


def test_handlers_report_wrong_arguments_as_user_errors():
    """An argument error in a handler names the builtin (the dispatch turns it into a located error)."""
    import pytest
    import torch

    import tilejit

    @tilejit.kernel
    def bad(X, BLOCK: T.constexpr):
        X[0:BLOCK] = T.exp(X[0:BLOCK], 3)

    with pytest.raises(tilejit.CompilationError, match="wrong arguments for T.exp"):
        bad.ir(torch.empty(16, device="meta"), BLOCK=16)
