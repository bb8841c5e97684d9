"""The put path's fixed-place reading of a committed message agrees with the full decoder."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from dledger_commitlog.log.message_layout import placement_of, uniq_of
from store.message import StoredMessage, encode_message, peek_header
from tests.test_message import messages


@given(messages)
def test_route_of_reads_what_peek_header_decodes(msg: StoredMessage) -> None:
    raw = encode_message(msg)
    head = peek_header(raw)
    route = placement_of(raw)
    assert route == (
        head.topic,
        head.queue_id,
        head.queue_offset,
        head.store_timestamp_ms,
        head.uniq_key,
    )
    assert uniq_of(raw) == head.uniq_key


@given(messages, st.text("ABCXYZ_", min_size=1, max_size=6), st.text("kv", max_size=4))
def test_a_property_name_ending_in_uniq_key_is_not_taken_for_it(
    msg: StoredMessage, prefix: str, value: str
) -> None:
    props = {**msg.properties, prefix + "UNIQ_KEY": "decoy" + value}
    raw = encode_message(dataclasses.replace(msg, properties=props))
    assert uniq_of(raw) == peek_header(raw).uniq_key


def test_a_body_holding_the_property_name_is_not_taken_for_it() -> None:
    msg = StoredMessage(
        topic="t", body=b"\x02UNIQ_KEY\x01fake\x02", properties={"UNIQ_KEY": "real"}
    )
    assert uniq_of(encode_message(msg)) == "real"
    assert uniq_of(encode_message(dataclasses.replace(msg, properties={}))) is None
    assert uniq_of(b"\x00" * 10) is None
