"""Key derivation and the effect lifecycle table."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from graph_durable._sha256 import hmac_sha256_hex, sha256_hex
from graph_durable.errors import UnkeyableToolCall
from graph_durable.ledger import EffectRecord, EffectStatus, canonical_json, derive_key

BASE = {"thread_id": "t", "anchor": "msg:m1", "tool_call_id": "c1", "tool": "pay",
        "args": {"cents": 5, "to": "ana"}}


def test_key_is_stable_and_ignores_argument_order() -> None:
    assert derive_key(**BASE) == derive_key(**{**BASE, "args": {"to": "ana", "cents": 5}})


@pytest.mark.parametrize("change", [
    {"thread_id": "u"}, {"anchor": "msg:m2"}, {"tool_call_id": "c2"},
    {"tool": "refund"}, {"args": {"cents": 6, "to": "ana"}},
])
def test_key_changes_with_every_part(change) -> None:
    assert derive_key(**BASE) != derive_key(**{**BASE, **change})


def test_keys_are_the_stdlib_digests_of_their_material() -> None:
    # Keys are SHA-256 (no secret) or HMAC-SHA256 (a key secret) of the canonical JSON
    # of their parts: the same keys as before they were computed without OpenSSL.
    material = canonical_json(["t", "msg:m1", "c1", "pay", canonical_json(BASE["args"])])
    assert derive_key(**BASE) == "gd-" + hashlib.sha256(material.encode()).hexdigest()[:40]
    secret = bytes(range(32))
    assert derive_key(**BASE, secret=secret) == (
        "gd-" + hmac.digest(secret, material.encode(), "sha256").hex()[:40])


@pytest.mark.parametrize("key_length", [0, 1, 32, 63, 64, 65, 200])
@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256)) * 3])
def test_hmac_sha256_is_the_stdlib_hmac(key_length: int, data: bytes) -> None:
    key = bytes((7 * i + key_length) % 256 for i in range(key_length))
    for _ in range(2):  # the second time from the key's padded states, kept
        assert hmac_sha256_hex(key, data) == hmac.digest(key, data, "sha256").hex()
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
    for other in (bytearray(key), memoryview(key)):  # any bytes-like key, as `hmac`
        assert hmac_sha256_hex(other, data) == hmac.digest(key, data, "sha256").hex()


def test_non_json_args_name_the_call_and_the_fix() -> None:
    with pytest.raises(UnkeyableToolCall) as info:
        derive_key(**{**BASE, "args": {"when": object()}})
    assert info.value.tool_call_id == "c1" and "JSON" in str(info.value)


S = EffectStatus


@pytest.mark.parametrize("terminal", [S.FAILED, S.REJECTED, S.SKIPPED, S.COMPENSATED])
def test_terminal_statuses_never_move(terminal) -> None:
    assert not any(terminal.can_become(other) for other in EffectStatus)


def test_an_applied_effect_moves_only_by_its_compensation() -> None:
    assert {other for other in EffectStatus if S.APPLIED.can_become(other)} == {
        S.COMPENSATED, S.COMPENSATION_FAILED, S.COMPENSATION_UNKNOWN}
    assert S.COMPENSATION_FAILED.can_become(S.COMPENSATED)
    assert not S.COMPENSATION_FAILED.can_become(S.APPLIED)


def test_an_unknown_compensation_is_never_a_failed_one_until_it_is_known() -> None:
    assert S.COMPENSATION_UNKNOWN.value == "compensation_unknown"
    assert {other for other in EffectStatus if S.COMPENSATION_UNKNOWN.can_become(other)} == {
        S.COMPENSATION_UNKNOWN, S.COMPENSATED, S.COMPENSATION_FAILED}


def test_unknown_is_never_failed() -> None:
    assert not S.UNKNOWN.can_become(S.FAILED)
    assert S.UNKNOWN.can_become(S.APPLIED) and S.UNKNOWN.can_become(S.IN_FLIGHT)
    assert not S.AWAITING_APPROVAL.can_become(S.APPLIED)


def test_a_trusted_record_is_the_record_model_construct_makes() -> None:
    """`trusted_record` (the ledger's fast path for rows it decoded or planned) keeps
    to the model: the same defaults, fields, equality and immutability."""
    from graph_durable.ledger import trusted_record

    required = dict(key="k", thread_id="t", checkpoint_ns="", tool_call_id="c", tool="x",
                    args={"a": 1}, status=EffectStatus.IN_FLIGHT, created_at=1.0,
                    updated_at=2.0)
    full = {**required, "receipt": {"id": 1}, "error": "e", "attempts": 3,
            "decision": {"type": "approve"}, "asked": True}
    for values in (required, full):
        made, trusted = EffectRecord.model_construct(**values), trusted_record(**values)
        assert trusted == made and repr(trusted) == repr(made)
        assert trusted.model_fields_set == made.model_fields_set
        assert trusted.model_dump() == made.model_dump()
    with pytest.raises(ValueError):
        trusted.key = "other"  # type: ignore[misc]


def test_a_copy_paused_on_its_tools_own_question_has_sent_nothing() -> None:
    """`sent_from` picks, of another family thread's rows of a key, the first that stands
    against sending again: a call paused on its tool's own question there (in flight with
    a `resume_tool` decision) is passed by; the same call on its way (no decision) is not."""
    from graph_durable.ledger import sent_from

    def row(thread: str, status: EffectStatus, decision: dict | None = None) -> EffectRecord:
        return EffectRecord(key="k", thread_id=thread, checkpoint_ns="", tool_call_id="c",
                            tool="email", args={}, status=status, decision=decision,
                            created_at=1.0, updated_at=1.0)

    paused = row("copy-1", EffectStatus.IN_FLIGHT, {"type": "resume_tool"})
    applied = row("copy-2", EffectStatus.APPLIED)
    on_its_way = row("copy-3", EffectStatus.IN_FLIGHT)
    assert sent_from([paused, applied]) is applied
    assert sent_from([paused]) is None
    assert sent_from([on_its_way, applied]) is on_its_way
    assert sent_from([]) is None
