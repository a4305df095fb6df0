"""What the ledger keeps at rest, byte for byte, when the saver's serde encrypts.

Each flow runs a charging agent whose calls carry distinctive secrets (see
`graph_durable.testing.scenarios.secrets`) in real processes: one is SIGKILLed at a fault
point, new ones resume the same database and thread, reviewers answer in others. Then:

- the provider's side is as usual: each effect applied once (none for a declined charge);
- the saver *with the key* reads every secret back from the ledger (nothing was lost or
  garbled on the way to the disk);
- encrypted: no secret occurs in the raw bytes of the SQLite file (and its `-wal` and
  `-shm`, read right after the processes exit), nor in a `pg_dump` of the PostgreSQL
  database (bytea columns are hex in a dump, so their hex is searched too);
- not encrypted: the secrets are in the ledger's rows, in the clear (a plain ledger is
  plain, and the search finds what is there);
- redacted (not encrypted): the redacted keys' secrets are in no row of `effects` or
  `effect_events`, while the provider got the full arguments and LangGraph's checkpoints
  still hold the model's message, as documented.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from graph_durable.testing import FaultPlan
from graph_durable.testing.crash.child import ChildResult, child_spec, run_child
from graph_durable.testing.crash.forkserver import ForkServer
from graph_durable.testing.postgres import find_postgres_bin
from graph_durable.testing.scenarios.secrets import (
    CHARGE_ARGS,
    EDITED_ARGS,
    SECRET_CARD,
    SECRET_EDIT,
    SECRET_ERROR,
    SECRET_HUMAN_RECEIPT,
    SECRET_RECEIPT,
    SECRETS,
    charge_provider,
    open_saver,
)

pytestmark = pytest.mark.crash

FACTORY = "graph_durable.testing.scenarios.secrets:build_secrets_agent"
THREAD = "t"
LEDGER_TABLES = ("effects", "effect_events")
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Flow:
    """One path through the guard, and the secrets the ledger then knows of."""

    options: dict[str, Any]
    """Factory options besides the database, providers, encryption and redaction."""
    ledger_secrets: tuple[str, ...]
    """Secrets the ledger holds after the flow (in args, receipts, decisions, errors)."""
    redactable: tuple[str, ...] = ()
    """Those that sit under the keys `card` and `auth_token`."""


FLOWS = {
    # A charge applied at a lookup provider, the process killed before the receipt was
    # durable; the resuming process finds it by key: args and the provider's receipt.
    "receipt": Flow({"mode": "lookup"}, (SECRET_CARD, SECRET_RECEIPT),
                    (SECRET_CARD, SECRET_RECEIPT)),
    # The same at a blind provider: `unknown`, and a human gives the receipt.
    "human": Flow({"mode": "blind"}, (SECRET_CARD, SECRET_HUMAN_RECEIPT),
                  (SECRET_CARD, SECRET_HUMAN_RECEIPT)),
    # An approval answered with an edit; the edited call is killed after it applied and
    # found on resume: the edit's args in the decision and the new intent.
    # Redaction keeps an edit's args whole in its decision and its intent: they are the
    # only copy of what must be sent (the journal's copy is redacted).
    "edit": Flow({"mode": "lookup", "approval": True},
                 (SECRET_CARD, SECRET_EDIT, SECRET_RECEIPT),
                 (SECRET_CARD, SECRET_RECEIPT)),
    # A declined charge (`NotApplied`), killed before the step's writes; the resumed run
    # replays the failure: the error text.
    "error": Flow({"decline": True}, (SECRET_CARD, SECRET_ERROR)),
}
REDACT = ["card", "auth_token"]

HUMAN_RECEIPT = {"auth_token": SECRET_HUMAN_RECEIPT}
TOOL_RECEIPT = {"charge_id": "charge-1", "auth_token": SECRET_RECEIPT}
# The tools task's own writes, after its call was recorded (inputs and agent come first).
TOOLS_STEP_WRITES = FaultPlan("before_put_writes", occurrence=3)


# -- child processes ----------------------------------------------------------------------

Run = Callable[..., ChildResult]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """`run(kwargs, action=..., resume=..., fault=...)`: one run of the scenario on
    thread `t` in a new process, forked from a server that imported it (a fresh
    interpreter each where forking is not possible)."""
    try:
        server = (ForkServer(["graph_durable.testing.crash.child",
                              "graph_durable.testing.scenarios.secrets"])
                  if hasattr(os, "fork") else None)
    except RuntimeError:
        server = None

    def run_one(kwargs: dict[str, Any], action: str = "start", resume: Any = None,
                fault: FaultPlan | None = None) -> ChildResult:
        if server is None:
            return run_child(FACTORY, kwargs, thread_id=THREAD, action=action,  # type: ignore[arg-type]
                             resume=resume, fault=fault)
        spec = child_spec(FACTORY, kwargs, thread_id=THREAD, action=action,  # type: ignore[arg-type]
                          resume=resume)
        outcome = server.run("graph_durable.testing.crash.child:run_spec",
                             {"spec": spec, "fault": asdict(fault) if fault else None},
                             timeout=60)
        if outcome.killed:
            return ChildResult(outcome.exitcode, True, {}, outcome.stderr)
        if outcome.result is None:
            raise RuntimeError(f"child run ({action}) failed with exit code "
                               f"{outcome.exitcode}:\n{outcome.error or outcome.stderr}")
        return ChildResult(outcome.exitcode, False, outcome.result, outcome.stderr)

    try:
        yield run_one
    finally:
        if server is not None:
            server.close()


def drive(run: Run, name: str, kwargs: dict[str, Any]) -> None:
    """Run flow `name` to its end across crashed, resumed and reviewing processes, and
    check the provider's side: each effect applied once, with the arguments sent."""
    provider = charge_provider(kwargs["provider_dir"], kwargs.get("mode", "lookup"))
    if name in ("receipt", "human"):
        assert run(kwargs, fault=FaultPlan("after_effect", tool="charge")).killed
        assert provider.count() == 1
        resumed = run(kwargs, action="resume")
        if name == "human":
            assert [q["type"] for q in resumed.interrupts] == ["effect_unknown"]
            resumed = run(kwargs, action="review", resume={
                "call_0_0": {"type": "applied", "receipt": HUMAN_RECEIPT}})
        sent = CHARGE_ARGS
    elif name == "edit":
        asked = run(kwargs)
        assert [q["type"] for q in asked.interrupts] == ["tool_approval"]
        assert provider.count() == 0
        edit = {"type": "edit", "edited_action": {"name": "charge", "args": EDITED_ARGS}}
        assert run(kwargs, action="review", resume={"call_0_0": edit},
                   fault=FaultPlan("after_effect", tool="charge")).killed
        assert provider.count() == 1
        resumed = run(kwargs, action="resume")
        sent = EDITED_ARGS
    else:
        assert run(kwargs, fault=TOOLS_STEP_WRITES).killed
        resumed = run(kwargs, action="resume")
        [tool_message] = [m for m in resumed.summary["messages"] if m["type"] == "tool"]
        assert tool_message["status"] == "error" and SECRET_ERROR in tool_message["content"]
        assert provider.count() == 0 and provider.requests() == []
        sent = None
    assert resumed.done, resumed.summary
    if sent is not None:
        assert provider.count() == 1 and len(provider.requests()) == 1
        # The tool got the full arguments, whatever the ledger keeps of them.
        assert [e["payload"] for e in provider.effects()] == [sent]


# -- what the saver with the key reads back ------------------------------------------------


def check_read_back(saver: Any, name: str, *, redacted: bool = False) -> None:
    """The ledger as the saver (with the key, if any) reads it: every secret the flow
    gave it, in its place, or the redaction mark under the redacted keys."""
    def masked(value: dict[str, Any]) -> dict[str, Any]:
        return {k: REDACTED if redacted and k in REDACT else v for k, v in value.items()}

    records = saver.effects(THREAD)
    events = saver.events(THREAD)
    journal = json.dumps([e.data for e in events])
    if name == "edit":
        # The asked call is resolved by the edit; the edited call is a new effect.
        [asked] = [r for r in records if r.status.value == "skipped"]
        [record] = [r for r in records if r.status.value == "applied"]
        assert asked.args == masked(CHARGE_ARGS)
        assert asked.decision is not None
        assert asked.decision["edited_action"]["args"] == EDITED_ARGS  # kept whole
        assert record.args == EDITED_ARGS
        assert record.receipt == masked(TOOL_RECEIPT)
        decisions = [e.data["decision"] for e in events if e.kind == "decision"]
        assert [d["edited_action"]["args"] for d in decisions] == [masked(EDITED_ARGS)]
    else:
        [record] = records
        assert record.args == masked(CHARGE_ARGS)
    if name == "receipt":
        assert record.status.value == "applied" and record.receipt == masked(TOOL_RECEIPT)
    if name == "human":
        assert record.status.value == "applied" and record.receipt == masked(HUMAN_RECEIPT)
        decisions = [e.data["decision"] for e in events if e.kind == "decision"]
        assert [d.get("receipt") for d in decisions] == [masked(HUMAN_RECEIPT)]
    if name == "error":
        assert record.status.value == "failed" and record.attempts == 1  # replayed
        assert record.error is not None and SECRET_ERROR in record.error
    result = saver.stored_result(THREAD, record.key)
    expected = {"receipt": SECRET_RECEIPT, "edit": SECRET_RECEIPT,
                "human": SECRET_HUMAN_RECEIPT, "error": SECRET_ERROR}[name]
    if not redacted:
        assert expected in str(result.content), result
    text = json.dumps([r.model_dump(mode="json") for r in saver.effects(THREAD)]) + journal
    for secret in FLOWS[name].ledger_secrets:
        if redacted and secret in FLOWS[name].redactable:
            assert secret not in text
        else:
            assert secret in text, f"{secret} was not read back from the ledger"


# -- byte searches ------------------------------------------------------------------------


def files_of(db_path: Path) -> dict[str, bytes]:
    """The raw bytes of the database file and of its `-wal` and `-shm`, if present."""
    files = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(f"{db_path}{suffix}")
        if path.exists():
            files[path.name] = path.read_bytes()
    return files


def as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def columns_holding(db_path: Path, tables: tuple[str, ...] | None = None
                    ) -> dict[str, set[str]]:
    """`{secret: {"table.column", ...}}`: where each secret occurs in the rows' bytes."""
    found: dict[str, set[str]] = {}
    uri = "file:" + str(db_path) + "?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        names = tables or tuple(row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"))
        for table in names:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in cursor.description]
            for row in cursor:
                for column, value in zip(columns, row, strict=True):
                    for secret in SECRETS:
                        if secret.encode() in as_bytes(value):
                            found.setdefault(secret, set()).add(f"{table}.{column}")
    conn.close()
    return found


def secrets_in(files: dict[str, bytes]) -> dict[str, list[str]]:
    """`{secret: [file, ...]}` for every secret whose ASCII bytes occur in a file."""
    found: dict[str, list[str]] = {}
    for secret in SECRETS:
        where = [name for name, data in files.items() if secret.encode() in data]
        if where:
            found[secret] = where
    return found


def kwargs_for(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "agent.sqlite"),
            "provider_dir": str(tmp_path / "providers"), **FLOWS[name].options, **extra}


# -- SQLite ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_encrypted_sqlite_keeps_no_secret_in_the_clear(tmp_path: Path, run: Run,
                                                       name: str) -> None:
    kwargs = kwargs_for(tmp_path, name, encrypt=True)
    drive(run, name, kwargs)
    files = files_of(tmp_path / "agent.sqlite")  # before any other connection opens it
    assert "agent.sqlite" in files

    with open_saver(kwargs["db_path"], encrypt=True) as saver:
        check_read_back(saver, name)
    leaked = secrets_in(files)
    assert not leaked, (
        f"secrets in the clear in the encrypted database's files {leaked}; in these "
        f"columns: {columns_holding(tmp_path / 'agent.sqlite')}")


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_a_plain_ledger_keeps_the_secrets_in_the_clear(tmp_path: Path, run: Run,
                                                       name: str) -> None:
    """The contrast: without encryption the search finds each secret in the ledger."""
    kwargs = kwargs_for(tmp_path, name)
    drive(run, name, kwargs)
    files = files_of(tmp_path / "agent.sqlite")

    with open_saver(kwargs["db_path"]) as saver:
        check_read_back(saver, name)
    in_files = secrets_in(files)
    in_ledger = columns_holding(tmp_path / "agent.sqlite", LEDGER_TABLES)
    for secret in FLOWS[name].ledger_secrets:
        assert secret in in_files, f"{secret} not found in the plain database's bytes"
        assert secret in in_ledger, f"{secret} not found in the plain ledger's rows"


def _redact_keys_available() -> bool:
    try:
        from graph_durable import redact_keys  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _redact_keys_available(),
                    reason="graph_durable.redact_keys is not available in this version")
@pytest.mark.parametrize("name", ["receipt", "human", "edit"])
def test_redacted_keys_never_reach_the_ledger(tmp_path: Path, run: Run, name: str) -> None:
    kwargs = kwargs_for(tmp_path, name, redact=REDACT)
    drive(run, name, kwargs)  # checks the provider got the full card

    in_ledger = columns_holding(tmp_path / "agent.sqlite", LEDGER_TABLES)
    leaked = {s: sorted(cols) for s, cols in in_ledger.items()
              if s in FLOWS[name].redactable}
    assert not leaked, f"redacted secrets in the ledger's rows: {leaked}"
    with open_saver(kwargs["db_path"]) as saver:
        check_read_back(saver, name, redacted=True)
    # Documented contrast: redaction is the ledger's; LangGraph's checkpoints keep the
    # model's message (encrypt the serde to protect them).
    in_state = columns_holding(tmp_path / "agent.sqlite", ("checkpoints", "writes"))
    assert SECRET_CARD in in_state


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_dump(conninfo: str) -> str:
    """A plain-SQL dump of the database, with the dump tool of the server's binaries."""
    bin_dir = find_postgres_bin()
    assert bin_dir is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    done = subprocess.run([os.path.join(bin_dir, "pg_dump"), "--no-owner",
                           "--dbname", conninfo], capture_output=True, timeout=60,
                          env=env, check=True)
    return done.stdout.decode("utf-8", "replace")


def tables_holding(dump: str) -> dict[str, set[str]]:
    """`{secret: {table, ...}}`: the tables whose dumped rows hold a secret, as text or,
    for bytea columns, as the hex a dump writes them in."""
    found: dict[str, set[str]] = {}
    for match in re.finditer(r"^COPY (\S+) .*? FROM stdin;\n(.*?)^\\\.$", dump,
                             re.MULTILINE | re.DOTALL):
        table, rows = match.group(1), match.group(2)
        for secret in SECRETS:
            if secret in rows or secret.encode().hex() in rows.lower():
                found.setdefault(secret, set()).add(table)
    return found


@pytest.mark.parametrize(("name", "encrypt"), [
    *((name, True) for name in sorted(FLOWS)),
    ("receipt", False),  # the contrast: the search finds a plain ledger's secrets
], ids=lambda value: {True: "encrypted", False: "plain"}.get(value, value))
def test_postgres_dump_of_the_ledger(
    tmp_path: Path, postgres_conninfo: str, run: Run, name: str, encrypt: bool
) -> None:
    kwargs = kwargs_for(tmp_path, name, encrypt=encrypt, postgres=postgres_conninfo)
    drive(run, name, kwargs)

    with open_saver(postgres=postgres_conninfo, encrypt=encrypt) as saver:
        check_read_back(saver, name)
    dump = pg_dump(postgres_conninfo)
    assert "COPY public.effects " in dump  # the search below reads the ledger's rows
    found = tables_holding(dump)
    anywhere = {s for s in SECRETS if s in dump or s.encode().hex() in dump.lower()}
    if encrypt:
        assert not anywhere, (
            f"secrets in the clear in the dump of the encrypted database: "
            f"{ {s: sorted(found.get(s, ())) for s in anywhere} }")
    else:
        for secret in FLOWS[name].ledger_secrets:
            assert "public.effects" in found.get(secret, set()), (secret, found)
