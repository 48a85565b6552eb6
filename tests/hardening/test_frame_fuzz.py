"""Hypothesis over safetensors frames: arrays of any dtype and shape where lists are expected.

Schemathesis can only send random bytes as a frame; these are well-formed frames whose
payloads are wrong in every way a numpy-holding client could make them (float or bool token
ids, 0-d and 3-d arrays, NaN/inf, huge ids, rows that disagree). Each must be answered
below 500, and the server must still serve afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from arctic_platform.rl.wire.frames import FRAME_CONTENT_TYPE, encode_frame

pytestmark = pytest.mark.slow

EXAMPLES = 120
DTYPES = st.sampled_from(
    [np.int64, np.int32, np.int8, np.uint8, np.float32, np.float64, np.float16, np.bool_]
)
_arrays = hnp.arrays(
    dtype=DTYPES,
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    elements={"allow_nan": True, "allow_infinity": True},
)
_numbers = st.one_of(
    st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True), st.booleans()
)
_ragged = st.lists(st.lists(_numbers, max_size=6), max_size=4)
_field = st.one_of(_arrays, _ragged, _numbers, st.none(), st.text(max_size=5))


@st.composite
def _frame_payload(draw: st.DrawFn, job_ids: dict[str, int]) -> tuple[str, dict]:
    path = draw(st.sampled_from(["/fwd-bwd", "/fwd-no-grad", "/generate", "/log-probs"]))
    job = draw(st.sampled_from([*job_ids.values(), 0, 10**6]))
    if path in ("/fwd-bwd", "/fwd-no-grad"):
        names = ["input_ids", "loss_mask", "advantages", "old_log_probs", "ref_log_probs"]
        batch = draw(st.dictionaries(st.sampled_from(names), _field, max_size=5))
        if draw(st.booleans()):
            batch["input_ids"] = draw(_field)
        return path, {"job_id": job, "batch": batch}
    if path == "/generate":
        params = draw(
            st.dictionaries(
                st.sampled_from(["n", "max_tokens", "temperature", "top_p", "logprobs", "seed"]),
                st.one_of(_numbers, _arrays),
                max_size=3,
            )
        )
        prompts = draw(st.one_of(_arrays, _ragged, st.lists(st.text(max_size=8), max_size=3)))
        return path, {"job_id": job, "prompts": prompts, "sampling_params": params}
    return path, {
        "job_id": job,
        "prompts": draw(st.one_of(_arrays, _ragged)),
        "completions": draw(st.one_of(_arrays, _ragged)),
        "top_k": draw(st.one_of(st.integers(-2, 30), _arrays)),
    }


def test_well_formed_frames_with_wrong_payloads_are_never_a_server_error(live):
    seen: dict[int, int] = {}
    with live.http() as http:

        @fuzz_settings(EXAMPLES)
        @given(_frame_payload(live.job_ids))
        def send(case: tuple[str, dict]) -> None:
            path, payload = case
            answer = http.post(
                path,
                content=encode_frame(payload),
                headers={"Content-Type": FRAME_CONTENT_TYPE},
            )
            seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
            assert answer.status_code < 500, (path, payload, answer.text)
            assert "message" in answer.json() or answer.status_code == 200

        send()
    print(f"\nframe fuzzing: {sum(seen.values())} frames, by status {dict(sorted(seen.items()))}")
    live.assert_healthy()
