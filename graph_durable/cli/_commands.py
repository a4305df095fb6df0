"""The commands of `graph-durable` (a thin layer over the public API; no SQL here).

The app is assembled here from its groups, in the order `--help` lists them: reading
(`_read.py`), the database's durability settings (`_settings.py`), its integrity
(`_check.py`), the ledger's gauges (`_stats.py`), answering a thread's questions
(`_answer.py`) and operating on threads under a lease (`_operate.py`); the options they share are in `_options.py`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from graph_durable.cli import _answer, _check, _operate, _read, _settings, _stats
from graph_durable.cli._read import EFFECT_STATUSES, THREAD_STATUSES

__all__ = ["EFFECT_STATUSES", "THREAD_STATUSES", "app"]

app = typer.Typer(
    name="graph-durable", add_completion=False, no_args_is_help=True,
    rich_markup_mode=None, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="See which LangGraph threads are stuck and why, answer their pending effects, "
         "and recover threads whose worker died.",
)


def _version_callback(value: bool) -> None:
    if value:
        from graph_durable import __version__

        typer.echo(f"graph-durable {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version_callback,
                                          help="print the version and exit")] = False,
) -> None:
    """See which LangGraph threads are stuck and why, answer their pending effects, and
    recover threads whose worker died."""


for command in (*_read.COMMANDS, *_settings.COMMANDS, *_check.COMMANDS, *_stats.COMMANDS,
                *_answer.COMMANDS, *_operate.COMMANDS):
    app.command()(command)
