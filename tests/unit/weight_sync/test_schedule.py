"""TransferSchedule for the topologies of ArcticInference's examples, and impossible ones."""

from __future__ import annotations

import pytest

from arctic_platform.rl.config import WeightSyncConfig
from arctic_platform.rl.weight_sync import TopologyError, TransferSchedule


def _pairs(s: TransferSchedule) -> list[tuple[int, int, int, int]]:
    return [(t.sender, t.replica, t.tp_rank, t.port) for t in s.transfers]


@pytest.mark.parametrize("sharding", ["dp", "fsdp"])
def test_t8_r4_tp2_every_rank_sends_to_one_worker(sharding):
    s = TransferSchedule.build(sharding, 8, 4, 2, base_port=29500)
    assert _pairs(s) == [
        (0, 0, 0, 29500),
        (1, 0, 1, 29501),
        (2, 1, 0, 29502),
        (3, 1, 1, 29503),
        (4, 2, 0, 29504),
        (5, 2, 1, 29505),
        (6, 3, 0, 29506),
        (7, 3, 1, 29507),
    ]
    assert s.num_senders == 8
    assert all(len(s.for_sender(r)) == 1 for r in range(8))


@pytest.mark.parametrize("sharding", ["dp", "fsdp"])
def test_t4_r4_tp2_round_robin_gives_each_sender_two_targets(sharding):
    s = TransferSchedule.build(sharding, 4, 4, 2, base_port=29500)
    assert [t.sender for t in s.transfers] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [t.port for t in s.for_sender(0)] == [29500, 29504]
    assert [t.target for t in s.for_sender(3)] == [(1, 1), (3, 1)]


@pytest.mark.parametrize("sharding", ["dp", "fsdp"])
def test_t1_r3_tp1_one_sender_feeds_three_replicas(sharding):
    s = TransferSchedule.build(sharding, 1, 3, 1, base_port=29500)
    assert _pairs(s) == [(0, 0, 0, 29500), (0, 1, 0, 29501), (0, 2, 0, 29502)]


def test_more_training_ranks_than_targets_leaves_ranks_without_targets():
    s = TransferSchedule.build("fsdp", 8, 1, 2)
    assert s.num_senders == 2
    assert [len(s.for_sender(r)) for r in range(8)] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert s.gather_ranks == tuple(range(8))  # every fsdp rank still joins the gather


def test_dp_needs_no_gather():
    assert TransferSchedule.build("dp", 4, 2, 1).gather_ranks == ()


def test_port_is_base_plus_r_times_tp_plus_t():
    s = TransferSchedule.build("dp", 2, 3, 4, base_port=40000)
    for t in s.transfers:
        assert t.port == 40000 + t.replica * 4 + t.tp_rank
    assert s.for_target(2, 3).port == 40011


def test_from_weight_sync_config():
    s = TransferSchedule.from_config(WeightSyncConfig(training_gpus=2, inference_replicas=2))
    assert _pairs(s) == [(0, 0, 0, 29500), (1, 1, 0, 29501)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tp", 1, 1, 1), "training_sharding"),
        (("dp", 0, 1, 1), "training_gpus"),
        (("dp", 1, 0, 1), "inference_replicas"),
        (("dp", 1, 1, 0), "inference_tp"),
        (("dp", 1, 4, 2, 65530), "do not fit"),
    ],
)
def test_impossible_topologies_are_clear_errors(args, message):
    with pytest.raises(TopologyError, match=message):
        TransferSchedule.build(*args)


def test_unknown_sender_or_target_is_an_error():
    s = TransferSchedule.build("dp", 2, 2, 1)
    with pytest.raises(TopologyError, match="rank 5"):
        s.for_sender(5)
    with pytest.raises(TopologyError, match="replica 7"):
        s.for_target(7, 0)


# --- exact edges (each kills a mutant the tests above let through) --------------------------


@pytest.mark.parametrize("field", ["training_gpus", "inference_replicas", "inference_tp"])
@pytest.mark.parametrize("bad", [0, True, 2.0])
def test_a_count_that_is_not_a_positive_int_is_refused_by_its_exact_name(field, bad):
    counts = {"training_gpus": 1, "inference_replicas": 1, "inference_tp": 1, field: bad}
    with pytest.raises(TopologyError) as info:
        TransferSchedule.build("dp", **counts)
    assert str(info.value) == f"{field} must be an integer >= 1, got {bad!r}"


def test_the_default_base_port_is_29500():
    s = TransferSchedule.build("dp", 1, 1, 1)
    assert s.base_port == 29500 and s.transfers[0].port == 29500


def test_ports_may_run_from_1_up_to_exactly_65535():
    assert TransferSchedule.build("dp", 1, 1, 1, base_port=1).transfers[0].port == 1
    last = TransferSchedule.build("dp", 1, 2, 2, base_port=65532)
    assert [t.port for t in last.transfers] == [65532, 65533, 65534, 65535]


@pytest.mark.parametrize(
    ("base_port", "message"),
    [
        (0, "ports 0..3 for 2 replicas x tp 2 do not fit in 1..65535"),
        (65533, "ports 65533..65536 for 2 replicas x tp 2 do not fit in 1..65535"),
    ],
)
def test_ports_outside_1_to_65535_are_refused_naming_the_range(base_port, message):
    with pytest.raises(TopologyError) as info:
        TransferSchedule.build("dp", 1, 2, 2, base_port=base_port)
    assert str(info.value) == message


@pytest.mark.parametrize("sharding", ["dp", "fsdp"])
def test_the_schedule_keeps_every_input_it_was_built_from(sharding):
    s = TransferSchedule.build(sharding, 3, 2, 2, base_port=31000)
    assert (s.training_sharding, s.training_gpus, s.inference_replicas, s.inference_tp) == (
        sharding,
        3,
        2,
        2,
    )
    assert s.base_port == 31000


def test_from_config_takes_every_field_of_the_config():
    config = WeightSyncConfig(
        training_sharding="fsdp",
        training_gpus=3,
        inference_replicas=2,
        inference_tp=2,
        base_port=31000,
    )
    s = TransferSchedule.from_config(config)
    assert s == TransferSchedule.build("fsdp", 3, 2, 2, base_port=31000)


def test_a_rank_equal_to_the_rank_count_is_outside_with_the_exact_range():
    s = TransferSchedule.build("dp", 2, 2, 1)
    with pytest.raises(TopologyError) as info:
        s.for_sender(2)
    assert str(info.value) == "training rank 2 is outside 0..1"
    assert s.for_sender(1) == (s.transfers[1],)
