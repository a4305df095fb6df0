"""The public export list is pinned: tests outside this repository use these names."""

import graph_durable

EXPECTED = [
    "AsyncDurableSqliteSaver",
    "CancelReport",
    "Compensation",
    "DurabilityError",
    "DurableSqliteSaver",
    "Effect",
    "EffectEvent",
    "EffectGuardMiddleware",
    "EffectGuardNode",
    "EffectRecord",
    "EffectStatus",
    "FlowVersionMismatch",
    "GraphDurableError",
    "InboxItem",
    "InvalidDecision",
    "LeaseHeld",
    "LeaseLost",
    "NotApplied",
    "Orphan",
    "RecoveryOutcome",
    "Retryable",
    "Review",
    "SecretUnavailable",
    "ThreadCancelled",
    "ThreadStatus",
    "acancel",
    "acompensate",
    "afind_orphans",
    "ainbox",
    "arecord_decisions",
    "arecover",
    "aresolve_orphan",
    "areview",
    "athread_status",
    "cancel",
    "compensate",
    "current_effect",
    "find_orphans",
    "flow_version_of",
    "guarded",
    "inbox",
    "record_decisions",
    "recover",
    "redact_keys",
    "resolve_orphan",
    "review",
    "sync_by_default",
    "thread_status",
]


def test_all_is_sorted_and_pinned() -> None:
    assert graph_durable.__all__ == sorted(graph_durable.__all__)
    assert graph_durable.__all__ == EXPECTED


def test_every_export_resolves() -> None:
    for name in graph_durable.__all__:
        assert getattr(graph_durable, name) is not None


def test_importing_the_package_does_not_load_langgraph() -> None:
    """The pytest plugin imports the package in every test run of every user project."""
    import subprocess
    import sys

    code = ("import sys, graph_durable, graph_durable.testing.plugin; "
            "print('langgraph' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_review_and_inbox_are_the_functions_whatever_is_imported_first() -> None:
    import subprocess
    import sys

    code = ("import graph_durable.cli\n"
            "from graph_durable import areview, review, ainbox, inbox\n"
            "assert callable(review) and review.__name__ == 'review', review\n"
            "assert callable(inbox) and inbox.__name__ == 'inbox', inbox\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_old_async_sqlite_path_still_imports_with_a_deprecation() -> None:
    import subprocess
    import sys

    code = ("import warnings\n"
            "warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n"
            "    import graph_durable.checkpointers.aio\n"
            "except DeprecationWarning as warning:\n"
            "    assert 'checkpointers.sqlite' in str(warning), warning\n"
            "else:\n"
            "    raise AssertionError('no DeprecationWarning')\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            "from graph_durable.checkpointers.aio import AsyncDurableSqliteSaver\n"
            "from graph_durable import AsyncDurableSqliteSaver as exported\n"
            "assert AsyncDurableSqliteSaver is exported\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_old_operator_paths_still_import_with_a_deprecation() -> None:
    import subprocess
    import sys

    code = ("import importlib, warnings\n"
            "for old, new, name in [('graph_durable.audit', 'graph_durable.operators.audit', 'audited'),\n"
            "                       ('graph_durable.notebook', 'graph_durable.operators.notebook',\n"
            "                        'inbox')]:\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        warnings.simplefilter('always')\n"
            "        module = importlib.import_module(old)\n"
            "    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)\n"
            "               for w in caught), (old, caught)\n"
            "    assert getattr(module, name) is getattr(importlib.import_module(new), name)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
