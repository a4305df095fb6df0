"""The public export list is pinned: tests outside this repository use these names."""

import subprocess
import sys
import textwrap
from pathlib import Path

import graph_durable

EXPECTED = [line for line in (Path(__file__).parent / "exports.txt").read_text().splitlines()
            if line and not line.startswith("#")]
"""The pinned export list, kept in `exports.txt` beside this file."""


def test_all_is_sorted_and_pinned() -> None:
    assert graph_durable.__all__ == sorted(graph_durable.__all__)
    assert graph_durable.__all__ == EXPECTED


def test_every_export_resolves() -> None:
    for name in graph_durable.__all__:
        assert getattr(graph_durable, name) is not None


def run_python(code: str, **kwargs: object) -> subprocess.CompletedProcess:
    """Run `code` (dedented) in a new interpreter, which has imported nothing yet."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], **kwargs)


def test_importing_the_package_does_not_load_langgraph() -> None:
    """The pytest plugin imports the package in every test run of every user project."""
    out = run_python("""
        import sys, graph_durable, graph_durable.testing.plugin
        print('langgraph' in sys.modules)
        """, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_review_and_inbox_are_the_functions_whatever_is_imported_first() -> None:
    run_python("""
        import graph_durable.cli
        from graph_durable import areview, review, ainbox, inbox
        assert callable(review) and review.__name__ == 'review', review
        assert callable(inbox) and inbox.__name__ == 'inbox', inbox
        """, check=True)


def test_the_old_async_sqlite_path_still_imports_with_a_deprecation() -> None:
    run_python("""
        import warnings
        warnings.simplefilter('error', DeprecationWarning)
        try:
            import graph_durable.checkpointers.aio
        except DeprecationWarning as warning:
            assert 'checkpointers.sqlite' in str(warning), warning
        else:
            raise AssertionError('no DeprecationWarning')
        warnings.simplefilter('ignore', DeprecationWarning)
        from graph_durable.checkpointers.aio import AsyncDurableSqliteSaver
        from graph_durable import AsyncDurableSqliteSaver as exported
        assert AsyncDurableSqliteSaver is exported
        """, check=True)


def test_the_old_operator_paths_still_import_with_a_deprecation() -> None:
    run_python("""
        import importlib, warnings
        for old, new, name in [('graph_durable.audit', 'graph_durable.operators.audit', 'audited'),
                               ('graph_durable.notebook', 'graph_durable.operators.notebook',
                                'inbox')]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                module = importlib.import_module(old)
            assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
                       for w in caught), (old, caught)
            assert getattr(module, name) is getattr(importlib.import_module(new), name)
        """, check=True)
