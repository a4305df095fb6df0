"""What the ledger keeps about a call: sealed with the saver's serde, redacted by policy,
and keyed by an HMAC a provider cannot reverse. (Byte-level searches of whole database
files after crashes are in `test_secrets_at_rest.py`.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.types import Command

from graph_durable import DurableSqliteSaver, Effect, EffectStatus, NotApplied, current_effect
from graph_durable.ledger import derive_key
from graph_durable.secrets import (
    SEALED,
    SEALED_PREFIX,
    SET_CHARS,
    SET_MEMBERS,
    KeySecrets,
    LedgerCodec,
    SecretUnavailable,
    column_json,
    redact_keys,
)
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.nodes.test_guard import CONFIG, build, call, run

KEY = b"k" * 32
CARD = "4111111111111111"
TOKEN = "tok-secret-9f3a"


def aes(key: bytes = KEY) -> EncryptedSerializer:
    return EncryptedSerializer.from_pycryptodome_aes(key=key)


def open_saver(db: Path, **kwargs: Any) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(db, check_same_thread=False), **kwargs)


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def charge_agent(saver: Any, provider: FakeProvider, policy: Effect | None = None,
                 *, fail: bool = False):
    seen: list[dict[str, Any]] = []

    @tool
    def charge(card: str, cents: int) -> dict:
        """Charge a card."""
        seen.append({"card": card, "cents": cents})
        if fail:
            raise NotApplied(f"card {card} declined")
        receipt = provider.apply(current_effect().key, {"cents": cents})
        return {"charge": receipt["id"], "token": TOKEN}

    graph = build(saver, [charge], {"charge": policy or Effect(lookup=provider.find)},
                  call("charge", {"card": CARD, "cents": 500}))
    return graph, seen


def ledger_rows(db: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return [*conn.execute("SELECT args, receipt, error, decision FROM effects"),
                *conn.execute("SELECT data, '', '', '' FROM effect_events")]
    finally:
        conn.close()


def ledger_text(db: Path) -> str:
    return "\n".join(str(value) for row in ledger_rows(db) for value in row)


# -- sealing -------------------------------------------------------------------------------


def test_an_encrypting_serde_seals_args_receipts_and_journal_and_the_saver_reads_them(
    tmp_path,
) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    saver = open_saver(db, serde=aes())
    graph, seen = charge_agent(saver, provider)
    result = run(graph)

    assert seen == [{"card": CARD, "cents": 500}]
    assert TOKEN in result["messages"][2].content
    [record] = saver.effects("t")
    assert record.args == {"card": CARD, "cents": 500}
    assert record.receipt["token"] == TOKEN
    assert [e.data["status"] for e in saver.events("t")] == ["in_flight", "applied"]
    text = ledger_text(db)
    assert CARD not in text and TOKEN not in text
    args, receipt, _, _ = ledger_rows(db)[0]
    assert args.startswith(SEALED_PREFIX) and receipt.startswith(SEALED_PREFIX)


class CountingAes(EncryptedSerializer):
    """LangGraph's AES serde, counting the ledger's seals and opens (the values it
    seals are bytes; checkpoints are not; `encrypts` probes with empty bytes)."""

    def __init__(self) -> None:
        base = aes()
        super().__init__(base.cipher, base.serde)
        self.sealed = self.opened = 0

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.sealed += isinstance(obj, bytes) and obj != b""
        return super().dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        value = super().loads_typed(data)
        self.opened += isinstance(value, bytes)
        return value


def test_values_sealed_together_open_alone_with_one_cipher_call_a_set() -> None:
    """`seal_together` seals up to `SET_MEMBERS` values (and `SET_CHARS` characters) as
    one set; each column opens on its own, in any order, and a set is opened once for
    all its members; a value too large for a set, or alone, is sealed as `seal` seals."""
    serde = CountingAes()
    codec = LedgerCodec(serde)
    values = [{"card": CARD, "n": n, "é": "ü"} for n in range(SET_MEMBERS + 3)]
    big = {"blob": "x" * SET_CHARS}
    texts = [column_json(v) for v in [*values, big]]
    sealed = codec.seal_together(texts)

    assert serde.sealed == 3  # a full set, a set of three, the large value alone
    assert all(t.startswith(SEALED_PREFIX + "set.") for t in sealed[:-1])
    assert not sealed[-1].startswith(SEALED_PREFIX + "set.")
    assert len({t.partition(":")[2].partition(":")[2] for t in sealed[:SET_MEMBERS]}) == 1
    assert CARD not in "".join(sealed)

    reader_serde = CountingAes()
    reader = LedgerCodec(reader_serde)  # another process: nothing remembered
    assert [reader.load(t) for t in reversed(sealed)] == [big, *reversed(values)]
    assert reader_serde.opened == 3
    assert codec.seal_together(texts[:1]) != texts[:1] and reader_serde.opened == 3
    assert LedgerCodec(None).seal_together(texts) == texts  # a plain ledger stays plain
    with pytest.raises(SecretUnavailable):
        LedgerCodec(aes(b"x" * 32)).load(sealed[0])

    # The bound is on the set as sealed, where quotes are escaped: 6 values of 669
    # characters (1,335 escaped) make 2 sets of 3.
    quoted = [column_json({"k": '"' * 330})] * 6
    serde.sealed = 0
    assert [reader.load(t) for t in codec.seal_together(quoted)] == [{"k": '"' * 330}] * 6
    assert serde.sealed == 2

    # A damaged index is a value that cannot be opened, never another member's.
    body = sealed[0].partition(":")[2].partition(":")[2]
    for index in ("x", "", "-1", "99", "1e1"):
        damaged = f"{SEALED_PREFIX}set.{index}:{body}"
        with pytest.raises(SecretUnavailable):
            LedgerCodec(aes()).load(damaged)
        assert LedgerCodec(aes(), strict=False).load(damaged) is SEALED


def test_a_steps_calls_seal_their_args_together_and_their_receipts_together(
        make_saver, tmp_path) -> None:
    """Three looked-up calls of one step: their intents' args are one sealed set (one
    cipher call), their receipts, committed with the step, another; another saver on the
    database reads each call's own args and receipt back."""
    serde = CountingAes()
    saver = make_saver(serde=serde)
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")

    @tool
    def charge(card: str, cents: int) -> dict:
        """Charge a card."""
        return {**provider.apply(current_effect().key, {"cents": cents}), "token": card[-4:]}

    cards = {f"c{n}": f"{CARD[:-1]}{n}" for n in range(3)}
    graph = build(saver, [charge], {"charge": Effect(lookup=provider.find)},
                  *(call("charge", {"card": card, "cents": 100}, call_id)
                    for call_id, card in cards.items()))
    set_up = saver.setup()
    if set_up is not None:  # an async saver, driven from this thread
        saver._sync(set_up)
    serde.sealed = 0  # the set-up sealed the database's key secret
    run(graph)

    assert provider.count() == 3
    assert serde.sealed == 2  # the step's args, then its receipts
    query = ("SELECT tool_call_id, args, receipt FROM effects WHERE thread_id = ?", ("t",))
    rows = saver._query(*query) if hasattr(saver, "_query") else saver._sync(
        saver._aquery(*query))
    for column in (1, 2):
        texts = [row[column] for row in rows]
        assert all(t.startswith(SEALED_PREFIX + "set.") for t in texts)
        assert len({t.partition(":")[2].partition(":")[2] for t in texts}) == 1
    assert not any(card in str(rows) for card in cards.values())
    reader = make_saver(serde=aes())
    by_call = {r.tool_call_id: r for r in reader.effects("t")}
    assert {c: r.args["card"] for c, r in by_call.items()} == cards
    assert {c: r.receipt["token"] for c, r in by_call.items()} == {
        c: card[-4:] for c, card in cards.items()}


def test_a_plain_serde_keeps_the_ledger_plain_json(tmp_path) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    run(charge_agent(open_saver(db), provider)[0])
    args, receipt, _, _ = ledger_rows(db)[0]
    assert CARD in args and TOKEN in receipt
    assert SEALED_PREFIX not in ledger_text(db)


def test_a_sealed_tool_error_and_a_humans_receipt_are_read_back(tmp_path) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")
    saver = open_saver(db, serde=aes())
    graph, _ = charge_agent(saver, provider, Effect())
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    paused = run(graph, None)
    [question] = paused["__interrupt__"]
    assert question.value["args"]["card"] == CARD  # the reviewer sees the real call
    human = {"charge": "p-1", "token": "human-" + TOKEN}
    run(graph, Command(resume={"c1": {"type": "applied", "receipt": human}}))
    [record] = saver.effects("t")
    assert record.status is EffectStatus.APPLIED and record.receipt == human
    assert "human-" + TOKEN not in ledger_text(db)

    failing_db = tmp_path / "b.sqlite"
    failing = open_saver(failing_db, serde=aes())
    run(charge_agent(failing, provider, Effect(), fail=True)[0])
    [failed] = failing.effects("t")
    assert failed.status is EffectStatus.FAILED and CARD in failed.error
    assert CARD not in ledger_text(failing_db)


def test_a_sealed_ledger_without_the_key_is_one_clear_error_and_nothing_is_sent(
    tmp_path,
) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")
    graph, _ = charge_agent(open_saver(db, serde=aes()), provider, Effect())
    arm(FaultPlan("after_intent", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()

    for wrong in (open_saver(db), open_saver(db, serde=aes(b"w" * 32))):
        with pytest.raises(SecretUnavailable, match="encrypted .aes. and this saver cannot"):
            wrong.effects("t")
        with pytest.raises(SecretUnavailable, match="LANGGRAPH_AES_KEY"):
            wrong.effect(wrong._query("SELECT key FROM effects")[0][0], "t")
        # A journal entry that only names statuses is kept readable.
        assert [e.data for e in wrong.events("t")] == [
            {"status": "in_flight", "tool": "charge", "tool_call_id": "c1"}]
        with pytest.raises(SecretUnavailable, match="key secret .keying thread 't'"):
            wrong.keying("t")  # the database's key secret is sealed too
    assert provider.count() == 0

    reader = DurableSqliteSaver.open_read_only(str(db))
    [record] = reader.effects("t")
    assert record.args is SEALED or record.args == SEALED
    assert str(record.args) == "<encrypted>" and record.status is EffectStatus.IN_FLIGHT
    with_key = DurableSqliteSaver.open_read_only(str(db), serde=aes())
    assert with_key.effects("t")[0].args == {"card": CARD, "cents": 500}


def test_a_plain_ledger_keeps_working_once_encryption_is_turned_on(tmp_path) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")
    graph, _ = charge_agent(open_saver(db), provider, Effect())
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()

    sealed = open_saver(db, serde=aes())
    graph, seen = charge_agent(sealed, provider, Effect())
    assert run(graph, None)["__interrupt__"]  # the plain intent is read and reconciled
    run(graph, Command(resume={"c1": {"type": "applied", "receipt": {"token": TOKEN}}}))
    assert seen == [] and provider.count() == 1
    [record] = sealed.effects("t")
    assert record.args == {"card": CARD, "cents": 500}  # written plain, read plain
    assert record.receipt == {"token": TOKEN}
    assert TOKEN not in ledger_text(db)  # written after: sealed


# -- redaction -----------------------------------------------------------------------------


def test_redaction_stores_no_redacted_field_while_the_tool_and_model_see_everything(
    tmp_path,
) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    saver = open_saver(db)
    policy = Effect(lookup=provider.find, redact=redact_keys("card", "token"))
    graph, seen = charge_agent(saver, provider, policy)
    arm(FaultPlan("after_effect", action="raise"))  # the receipt is not durable yet
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    result = run(graph, None)  # reconciled by lookup under the same key

    assert seen == [{"card": CARD, "cents": 500}] and provider.count() == 1
    [record] = saver.effects("t")
    assert record.status is EffectStatus.APPLIED
    assert record.args == {"card": "[redacted]", "cents": 500}
    full = derive_key(thread_id="t", anchor=_anchor(saver), tool_call_id="c1",
                      tool="charge", args={"card": CARD, "cents": 500},
                      secret=saver._key_secrets.by_id[saver._key_secrets.current])
    assert record.key == full  # keyed on the full args, not the stored ones
    assert CARD not in ledger_text(db) and TOKEN not in ledger_text(db)
    assert isinstance(result["messages"][2], ToolMessage)


def test_a_redacted_stored_result_is_what_a_replay_shows(tmp_path) -> None:
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    saver = open_saver(db)
    graph, seen = charge_agent(
        saver, provider, Effect(lookup=provider.find, redact=redact_keys("token")))
    arm(FaultPlan("after_receipt", action="raise"))  # receipt durable, step not
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    replayed = run(graph, None)["messages"][2]
    assert len(seen) == 1 and provider.count() == 1
    assert '"token": "[redacted]"' in replayed.content and TOKEN not in replayed.content
    assert TOKEN not in ledger_text(db)


def test_redact_keys_walks_nested_values_and_json_strings() -> None:
    redact = redact_keys("card")
    assert redact({"a": [{"card": 1}], "card": {"x": 2}}) == {"a": [{"card": "[redacted]"}],
                                                              "card": "[redacted]"}
    assert redact('{"card": "4111", "n": 1}') == '{"card": "[redacted]", "n": 1}'
    assert redact("card 4111 declined") == "card 4111 declined"
    with pytest.raises(ValueError):
        redact_keys()


# -- keys ----------------------------------------------------------------------------------


def keys_of(db: Path, **kwargs: Any) -> str:
    provider = FakeProvider(str(db.with_suffix(".p")), "lookup", name="p")
    saver = open_saver(db, **kwargs)
    run(charge_agent(saver, provider)[0])
    return saver.effects("t")[0].key


def expected_key(db: Path, secret: bytes | None) -> str:
    return derive_key(thread_id="t", anchor=_anchor(open_saver(db)), tool_call_id="c1",
                      tool="charge", args={"card": CARD, "cents": 500}, secret=secret)


def test_keys_are_an_hmac_under_the_deployments_secret(tmp_path, monkeypatch) -> None:
    secret = "s" * 32
    given = tmp_path / "given.sqlite"
    assert keys_of(given, key_secret=secret) == expected_key(given, secret.encode())
    monkeypatch.setenv("GRAPH_DURABLE_KEY_SECRET", secret)
    env = tmp_path / "env.sqlite"
    assert keys_of(env) == expected_key(env, secret.encode())
    monkeypatch.delenv("GRAPH_DURABLE_KEY_SECRET")
    own = tmp_path / "own.sqlite"  # no secret given: the database's own, kept in it
    key = keys_of(own)
    [(stored,)] = sqlite3.connect(own).execute(
        "SELECT value FROM ledger_meta WHERE name = 'key_secret'")
    assert len(stored) == 64 and key == expected_key(own, stored.encode())
    for db in (given, env, own):
        assert expected_key(db, None) not in (keys_of(db.with_name("x" + db.name)), key)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        KeySecrets.configured("short")


def test_a_thread_keeps_the_key_scheme_it_started_with(tmp_path) -> None:
    """A thread pinned to a key secret the saver lacks is refused before anything is
    sent; given that secret among others (rotation), it resumes under its old keys."""
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    old, new = "o" * 32, "n" * 32
    graph, _ = charge_agent(open_saver(db, key_secret=old), provider)
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    first_key = open_saver(db).effects("t")[0].key

    graph, seen = charge_agent(open_saver(db, key_secret=new), provider)
    with pytest.raises(SecretUnavailable, match="does not hold; nothing was sent"):
        run(graph, None)
    assert seen == [] and provider.count() == 1

    rotated = open_saver(db, key_secret=[new, old])
    graph, seen = charge_agent(rotated, provider)
    run(graph, None)
    assert seen == [] and provider.count() == 1  # found by lookup under the old key
    [record] = rotated.effects("t")
    assert record.key == first_key and record.status is EffectStatus.APPLIED


def test_a_thread_with_effects_from_before_key_secrets_keeps_plain_keys(tmp_path) -> None:
    """Migration 4 pins threads that already have effects to plain SHA-256 keys, so an
    effect in flight across the upgrade is found under the key the provider saw."""
    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    saver = open_saver(db)
    graph, _ = charge_agent(saver, provider)
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    # Make the database look as an older release left it: plain keys, no pins.
    [record] = saver.effects("t")
    conn = sqlite3.connect(db)
    old_key = derive_key(thread_id="t", anchor=_anchor(saver), tool_call_id="c1",
                         tool="charge", args={"card": CARD, "cents": 500})
    with conn:
        conn.execute("UPDATE effects SET key = ?", (old_key,))
        conn.execute("UPDATE effect_events SET key = ?", (old_key,))
        conn.execute("DROP TABLE thread_key_schemes")
        conn.execute("DROP TABLE ledger_meta")
        conn.execute("ALTER TABLE effects DROP COLUMN edited_key")
        conn.execute("DROP TABLE task_runs")  # migration 5, which came later
        conn.execute("DROP TABLE copy_points")  # migration 8, later still
        conn.execute("DROP TABLE step_anchors")
        conn.execute("DELETE FROM graph_durable_migrations WHERE v >= 4")
    conn.close()
    provider_conn = sqlite3.connect(tmp_path / "p.sqlite")
    with provider_conn:
        tables = [r[0] for r in provider_conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [r[1] for r in provider_conn.execute(f"PRAGMA table_info({table})")]
            if "key" in columns:
                provider_conn.execute(f"UPDATE {table} SET key = ?", (old_key,))
    provider_conn.close()

    upgraded = open_saver(db, key_secret="n" * 32)
    graph, seen = charge_agent(upgraded, provider)
    run(graph, None)
    assert seen == [] and provider.count() == 1
    [after] = upgraded.effects("t")
    assert after.key == old_key and after.status is EffectStatus.APPLIED
    assert record.key != old_key


def _anchor(saver: DurableSqliteSaver) -> str:
    from graph_durable.nodes.anchor import call_anchor

    state = saver.get_tuple(CONFIG).checkpoint["channel_values"]
    return call_anchor(state, "c1", "", "messages")


def test_a_compensation_is_sealed_like_the_effect_it_undoes(tmp_path) -> None:
    """A refund's args (built from the charge's receipt), its receipt and the decision that
    asked for it are sealed too; the raw file holds none of them."""
    from graph_durable import Compensation, compensate

    db = tmp_path / "a.sqlite"
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    refunds = FakeProvider(str(tmp_path / "r.sqlite"), "dedupe", name="r")
    saver = open_saver(db, serde=aes())
    undo = Compensation(
        lambda record, receipt: {**refunds.apply(current_effect().key, {}), "token": TOKEN},
        effect=Effect(idempotent=True), args=lambda record, receipt: {"card": CARD, **receipt},
        name="refund")
    graph, _ = charge_agent(saver, provider, Effect(lookup=provider.find, compensate=undo))
    run(graph)
    record = compensate(graph, saver, "t", "c1", reviewer="ana")  # owners stay clear
    assert record.status is EffectStatus.COMPENSATED and refunds.count() == 1
    undone = next(r for r in saver.effects("t") if r.tool == "refund")
    assert undone.args["card"] == CARD and undone.receipt["token"] == TOKEN
    saver.conn.close()
    raw = b"".join(path.read_bytes() for path in tmp_path.glob("a.sqlite*"))
    assert CARD.encode() not in raw and TOKEN.encode() not in raw
