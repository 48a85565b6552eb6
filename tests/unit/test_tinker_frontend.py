"""The tinker transport's pieces without a server: losses, protobuf mapping, seq_id lanes."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from arctic_platform.rl.errors import LossConfigError
from arctic_platform.rl.plugins import get_registry
from arctic_rl_tinker import convert
from arctic_rl_tinker.futures import Lane
from arctic_rl_tinker.losses import TINKER_LOSSES

tinker = pytest.importorskip("tinker")

LP = torch.tensor([[0.0, -1.0, -2.0, -0.5]], requires_grad=True)
OLD = torch.tensor([[0.0, -1.2, -1.5, -0.5]])
ADV = torch.tensor([[0.0, 1.0, -2.0, 0.5]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0]])


def _batch() -> dict:
    return {"loss_mask": MASK, "old_log_probs": OLD, "advantages": ADV}


def _loss(name: str, **config: float):
    fn = get_registry().get("loss", f"tinker.{name}").create()
    return fn(LP, _batch(), **fn.configure(config))


def test_every_tinker_loss_is_a_registered_loss_plugin():
    names = set(get_registry().names("loss"))
    assert {f"tinker.{n}" for n in TINKER_LOSSES} <= names


def test_cross_entropy_is_the_weighted_sum_of_negative_log_probs():
    out = _loss("cross_entropy")
    assert out.loss.item() == pytest.approx(3.5)


def test_importance_sampling_is_minus_the_sum_of_ratio_times_advantage():
    r = torch.exp(LP.detach() - OLD)[0, 1:]
    expected = -(r * ADV[0, 1:]).sum().item()
    assert _loss("importance_sampling").loss.item() == pytest.approx(expected, rel=1e-6)


def test_ppo_clips_the_ratio_with_the_configured_thresholds():
    r = torch.exp(LP.detach() - OLD)[0, 1:]
    a = ADV[0, 1:]
    clipped = r.clamp(0.9, 1.1)
    expected = -torch.minimum(r * a, clipped * a).sum().item()
    out = _loss("ppo", clip_low_threshold=0.9, clip_high_threshold=1.1)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


def test_cispo_gradient_flows_through_log_probs_only():
    LP.grad = None
    out = _loss("cispo")
    out.loss.backward()
    r = torch.exp(LP.detach() - OLD).clamp(0.8, 1.2)
    expected = (-r * ADV * MASK)[0]
    assert torch.allclose(LP.grad[0], expected)


def test_dro_is_the_quadratic_penalty_objective():
    d = (LP.detach() - OLD)[0, 1:]
    expected = -(LP.detach()[0, 1:] * ADV[0, 1:] - 0.5 * 0.1 * d * d).sum().item()
    assert _loss("dro", beta=0.1).loss.item() == pytest.approx(expected, rel=1e-6)


def test_an_unknown_loss_fn_config_key_is_refused():
    fn = get_registry().get("loss", "tinker.ppo").create()
    with pytest.raises(LossConfigError, match="clip_eps"):
        fn.configure({"clip_eps": 0.2})


def _request(data, loss_fn="importance_sampling", **config):
    from tinker.proto.request_conv import forward_backward_request_to_proto

    request = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=config or None
        ),
        model_id="m",
        seq_id=3,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _datum(tokens, targets, **floats):
    inputs = {"target_tokens": tinker.TensorData(data=targets, dtype="int64", shape=[len(targets)])}
    for name, values in floats.items():
        inputs[name] = tinker.TensorData(data=values, dtype="float32", shape=[len(values)])
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def test_a_datum_becomes_a_row_scoring_its_targets_after_its_inputs():
    body = _request(
        [_datum([5, 6, 7], [6, 7, 8], logprobs=[-1.0, -2.0, -3.0], advantages=[0.0, 1.0, 1.0])],
        clip_low_threshold=0.5,
    )
    batch = convert.parse_forward_backward(body)
    assert (batch.model_id, batch.seq_id, batch.loss_fn) == ("m", 3, "importance_sampling")
    assert batch.loss_config == {"clip_low_threshold": 0.5}
    assert batch.batch["input_ids"] == [[5, 6, 7, 8]]
    assert batch.batch["target_tokens"] == [[0, 6, 7, 8]]
    assert batch.batch["old_log_probs"] == [[0.0, -1.0, -2.0, -3.0]]
    assert batch.batch["loss_mask"] == [[0.0, 1.0, 1.0, 1.0]]


def test_targets_and_inputs_of_different_length_are_refused():
    with pytest.raises(convert.TinkerInputError, match="target_tokens has 2 entries"):
        convert.parse_forward_backward(_request([_datum([5, 6, 7], [6, 7])]))


@pytest.mark.parametrize(
    "datum",
    [
        pytest.param(lambda: _datum([5, 6, 7], [6, 7]), id="targets of another length"),
        pytest.param(lambda: _datum([], []), id="a zero-length datum"),
        pytest.param(lambda: _datum([5, 6], [6, 7], weights=[1.0]), id="weights of another length"),
    ],
)
def test_a_datum_refused_at_parse_time_names_the_requests_model_and_seq_id(datum):
    """The front-end frees that seq_id in the model's order; without them it cannot."""
    with pytest.raises(convert.TinkerInputError) as refused:
        convert.parse_forward_backward(_request([datum()]))
    assert (refused.value.model_id, refused.value.seq_id) == ("m", 3)


def test_a_malformed_body_is_refused():
    with pytest.raises(convert.TinkerInputError, match="ForwardBackwardRequest"):
        convert.parse_forward_backward(b"\xff\x00garbage")


def test_the_sdk_reads_our_forward_backward_output():
    from tinker.proto.response_conv import deserialize_forward_backward_output

    batch = convert.parse_forward_backward(
        _request([_datum([1, 2], [2, 3]), _datum([4, 5, 6], [5, 6, 7])], loss_fn="cross_entropy")
    )
    result = {"loss.sum": 4.5, "log_probs": [[0.0, -1.0, -2.0], [0.0, -0.5, -0.25, -0.125]]}
    out = deserialize_forward_backward_output(convert.forward_backward_output(batch, result))
    assert out.metrics == {"loss:sum": 4.5}
    assert out.loss_fn_outputs[0]["logprobs"].to_numpy().tolist() == [-1.0, -2.0]
    assert out.loss_fn_outputs[1]["logprobs"].to_numpy().tolist() == [-0.5, -0.25, -0.125]


def test_the_sdk_reads_our_sample_output():
    from tinker.proto.response_conv import deserialize_sample_response

    completions = [{"token_ids": [3, 4], "logprobs": [-0.5, -1.5], "finish_reason": "length"}]
    out = deserialize_sample_response(convert.sample_output(completions, [None, -2.0]))
    assert out.sequences[0].tokens == [3, 4]
    assert np.allclose(out.sequences[0].logprobs, [-0.5, -1.5])
    assert out.sequences[0].stop_reason == "length"
    assert out.prompt_logprobs == [None, -2.0]


def test_a_lane_runs_requests_in_seq_id_order_whatever_order_they_arrive_in():
    lane = Lane("m")
    ran: list[int] = []
    done = threading.Event()

    def work(seq: int):
        def run() -> None:
            ran.append(seq)
            if len(ran) == 4:
                done.set()

        return run

    for seq in (3, 1, 4, 2):
        lane.submit(seq, f"r{seq}", work(seq))
    assert done.wait(10)
    assert ran == [1, 2, 3, 4]
    lane.close()


def test_a_refused_seq_id_does_not_hold_up_the_next_one():
    lane = Lane("m")
    done = threading.Event()
    lane.submit(2, "r2", done.set)
    lane.skip(1)
    assert done.wait(10)
    lane.close()


def _coalescer(window: float = 5.0, quiet: float = 0.2, max_items: int = 100):
    from concurrent.futures import ThreadPoolExecutor

    from arctic_rl_tinker.futures import Coalescer

    batches: list[tuple[str, list[int]]] = []
    done = threading.Event()

    def dispatch(key: str, items: list[int]) -> None:
        batches.append((key, list(items)))
        done.set()

    pool = ThreadPoolExecutor(4)
    return Coalescer(dispatch, pool.submit, quiet=quiet, window=window, max_items=max_items), (
        batches,
        done,
        pool,
    )


def test_items_of_one_key_that_arrive_together_go_as_one_batch_and_keys_never_mix():
    coalescer, (batches, _, pool) = _coalescer(quiet=0.3)
    for i in range(5):
        coalescer.add("a", i)
        coalescer.add("b", 10 + i)
    pool.shutdown(wait=True)
    assert sorted(batches) == [("a", [0, 1, 2, 3, 4]), ("b", [10, 11, 12, 13, 14])]


def test_a_batch_goes_when_its_key_is_quiet_and_a_later_item_opens_a_new_one():
    coalescer, (batches, done, pool) = _coalescer(quiet=0.05)
    coalescer.add("a", 1)
    assert done.wait(10)
    done.clear()
    coalescer.add("a", 2)
    assert done.wait(10)
    pool.shutdown(wait=True)
    assert batches == [("a", [1]), ("a", [2])]


def test_a_full_batch_goes_at_once_without_waiting_for_its_window():
    coalescer, (batches, done, pool) = _coalescer(window=600.0, quiet=600.0, max_items=3)
    for i in range(3):
        coalescer.add("a", i)
    assert done.wait(10)  # neither the quiet time nor the window has passed
    pool.shutdown(wait=False)
    assert batches == [("a", [0, 1, 2])]


def test_a_key_that_keeps_getting_items_still_goes_at_its_window():
    coalescer, (batches, done, pool) = _coalescer(window=0.2, quiet=600.0)
    for i in range(100):  # an item every 20 ms for 2 s: never quiet
        coalescer.add("a", i)
        threading.Event().wait(0.02)
    assert done.wait(10)
    pool.shutdown(wait=False)
    assert batches[0][1] == list(range(len(batches[0][1])))
    assert len(batches[0][1]) < 100


def test_losses_given_the_samplers_log_probs_report_the_mismatch_and_the_answer_names_it():
    """importance_sampling's sampler log-probs (``old_log_probs``, Tinker's ``logprobs``)
    against the log-probs being trained: k1 is Tinker's ``kl_sample_train_v1``."""
    from tinker.proto.response_conv import deserialize_forward_backward_output

    out = _loss("importance_sampling")
    trained = [(1, -1.0, -1.2), (2, -2.0, -1.5), (3, -0.5, -0.5)]  # (position, lp, sampler)
    k1 = sum(q - lp for _, lp, q in trained) / 3
    total, count = out.metrics["mismatch_k1"]
    assert float(total) / float(count) == pytest.approx(k1)
    assert "mismatch_k1" not in _loss("cross_entropy").metrics  # no sampler log-probs
    batch = convert.parse_forward_backward(_request([_datum([1, 2], [2, 3])]))
    result = {"loss.sum": 1.0, "log_probs": [[0.0, -1.0, -2.0]], "mismatch_k1": k1}
    result["mismatch_k3"] = 0.01
    result["mismatch_ratio.min"], result["mismatch_ratio.max"] = 0.5, 1.25
    answer = deserialize_forward_backward_output(convert.forward_backward_output(batch, result))
    assert answer.metrics["kl_sample_train_v1:mean"] == pytest.approx(k1, rel=1e-6)
    assert answer.metrics["mismatch_k3:mean"] == pytest.approx(0.01)
    assert (answer.metrics["mismatch_ratio:min"], answer.metrics["mismatch_ratio:max"]) == (
        0.5,
        1.25,
    )
    low, high = out.extrema["mismatch_ratio"]  # exp(lp - q) over the trained tokens
    assert (float(low), float(high)) == (
        pytest.approx(math.exp(-0.5)),
        pytest.approx(math.exp(0.2)),
    )
