"""Chunk envelopes: split, check, reassemble; conflicts and corruption are refused."""

from __future__ import annotations

import pytest

from arctic_rl_dss.chunks import (
    ChunkAssembler,
    ChunkConflictError,
    ChunkError,
    RestartRequiredError,
    decode_chunk,
    encode_chunks,
)

FRAME = bytes(range(256)) * 40  # 10 KiB


def _add_all(assembler, chunks, job="j1", owner="alice"):
    out = None
    for chunk in chunks:
        header, data = decode_chunk(chunk)
        out = assembler.add(owner, job, header, data)
    return out


def test_a_frame_split_into_chunks_reassembles_to_the_same_bytes():
    chunks = encode_chunks(FRAME, "forward-backward", "g1", chunk_bytes=3000)
    assert len(chunks) == 4
    headers = [decode_chunk(c)[0] for c in chunks]
    assert [h.chunk_idx for h in headers] == [0, 1, 2, 3]
    assert {h.total_chunks for h in headers} == {4}
    assert _add_all(ChunkAssembler(), chunks) == FRAME


def test_a_small_frame_is_one_chunk_and_an_empty_frame_too():
    assert len(encode_chunks(FRAME, "generate", "g")) == 1
    assert _add_all(ChunkAssembler(), encode_chunks(b"", "generate", "g")) == b""


def test_a_flipped_byte_in_a_slice_is_refused_and_the_group_can_still_complete():
    chunks = encode_chunks(FRAME, "forward-backward", "g1", chunk_bytes=3000)
    assembler = ChunkAssembler()
    header, data = decode_chunk(chunks[0])
    assert assembler.add("alice", "j1", header, data) is None
    corrupt = bytearray(chunks[1])
    corrupt[-1] ^= 0x01
    with pytest.raises(ChunkError, match="corrupt"):
        decode_chunk(bytes(corrupt))
    assert _add_all(assembler, chunks[1:]) == FRAME


def test_an_unknown_group_must_start_at_chunk_zero():
    chunks = encode_chunks(FRAME, "forward-backward", "g1", chunk_bytes=3000)
    header, data = decode_chunk(chunks[2])
    with pytest.raises(RestartRequiredError):
        ChunkAssembler().add("alice", "j1", header, data)


def test_a_group_id_reused_for_another_frame_is_a_conflict():
    assembler = ChunkAssembler()
    first = encode_chunks(FRAME, "forward-backward", "g1", chunk_bytes=3000)
    other = encode_chunks(FRAME[::-1], "forward-backward", "g1", chunk_bytes=3000)
    header, data = decode_chunk(first[0])
    assembler.add("alice", "j1", header, data)
    header, data = decode_chunk(other[1])
    with pytest.raises(ChunkConflictError):
        assembler.add("alice", "j1", header, data)


def test_groups_of_different_users_or_jobs_do_not_mix():
    assembler = ChunkAssembler()
    chunks = encode_chunks(FRAME, "forward-backward", "same", chunk_bytes=3000)
    _add_all(assembler, chunks[:1])
    header, data = decode_chunk(chunks[1])
    with pytest.raises(RestartRequiredError):
        assembler.add("bob", "j1", header, data)
    with pytest.raises(RestartRequiredError):
        assembler.add("alice", "j2", header, data)


def test_a_frame_whose_whole_hash_does_not_match_is_refused():
    from arctic_platform.rl.wire.frames import decode_frame, encode_frame

    chunk = encode_chunks(FRAME, "forward-backward", "g1")[0]
    payload = decode_frame(chunk, as_lists=False)
    payload["arctic_rl_chunk"]["frame_sha256"] = "0" * 64
    header, data = decode_chunk(encode_frame(payload))
    with pytest.raises(ChunkError, match="does not match"):
        ChunkAssembler().add("alice", "j1", header, data)


def test_a_body_that_is_not_a_chunk_envelope_is_a_clear_error():
    from arctic_platform.rl.wire.frames import FrameError, encode_frame

    with pytest.raises(ChunkError, match="not a chunk"):
        decode_chunk(encode_frame({"batch": {}}))
    with pytest.raises(FrameError):
        decode_chunk(b"\x00" * 16)


def test_a_user_cannot_hold_more_unfinished_bytes_than_the_limit():
    from arctic_rl_dss.chunks import ChunkLimitError

    assembler = ChunkAssembler(max_held_bytes=5000)
    chunks = encode_chunks(FRAME, "forward-backward", "g1", chunk_bytes=3000)
    _add_all(assembler, chunks[:1])
    header, data = decode_chunk(chunks[1])
    with pytest.raises(ChunkLimitError):
        assembler.add("alice", "j1", header, data)
    other = encode_chunks(FRAME, "forward-backward", "g2", chunk_bytes=3000)
    header, data = decode_chunk(other[0])
    assert assembler.add("bob", "j9", header, data) is None  # bob has his own allowance
