"""Pair authentication: messages carry an HMAC of the sync's secret; strays are refused."""

from __future__ import annotations

import pytest

from arctic_platform.rl.weight_sync.pair_auth import PairAuth, StrayPeerError, new_secret


def test_a_signed_message_reads_back_on_the_same_key_and_port():
    auth = PairAuth(new_secret(), 4100)
    assert auth.check("c1/0/plan", auth.sign("c1/0/plan", '{"v": 1}')) == '{"v": 1}'


def test_a_message_signed_with_another_secret_is_a_stray():
    ours, theirs = PairAuth(new_secret(), 4100), PairAuth(new_secret(), 4100)
    with pytest.raises(StrayPeerError, match="did not carry this sync's secret"):
        ours.check("hello", theirs.sign("hello", "c1:0"))


def test_an_unsigned_message_is_a_stray_when_a_secret_is_set():
    with pytest.raises(StrayPeerError):
        PairAuth(new_secret(), 4100).check("hello", "c1:0")


def test_a_signature_does_not_carry_over_to_another_key_or_port():
    secret = new_secret()
    signed = PairAuth(secret, 4100).sign("c1/0/ack", "ok")
    with pytest.raises(StrayPeerError):
        PairAuth(secret, 4100).check("c1/0/done", signed)
    with pytest.raises(StrayPeerError):
        PairAuth(secret, 4101).check("c1/0/ack", signed)


def test_a_tampered_value_is_refused():
    auth = PairAuth(new_secret(), 4100)
    signed = auth.sign("c1/0/plan", "plan-a")
    with pytest.raises(StrayPeerError):
        auth.check("c1/0/plan", signed.replace("plan-a", "plan-b"))


def test_without_a_secret_messages_pass_as_they_are():
    auth = PairAuth(None, 4100)
    assert not auth.enabled
    assert auth.sign("hello", "c1:0") == "c1:0"
    assert auth.check("hello", "c1:0") == "c1:0"
    assert auth.group_name("pg/c1/1") == "pg/c1/1"


def test_the_group_name_is_derived_from_the_secret_and_never_the_public_name():
    secret = new_secret()
    name = PairAuth(secret, 4100).group_name("pg/c1/1")
    assert name == PairAuth(secret, 4100).group_name("pg/c1/1")
    # the derived part is hex, which may hold "c1" by chance but never the public "c1/1"
    assert name.startswith("pg/") and "c1/1" not in name and secret not in name
    assert name != PairAuth(new_secret(), 4100).group_name("pg/c1/1")
