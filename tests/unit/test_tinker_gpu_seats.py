"""Where the Tinker front-end seats LoRA pools and base samplers on the server's GPUs
(``gpu_seats``): a pool of its own per GPU, base samplers beside them, and a 409 naming what
holds the GPUs, at once, when a new shape finds none."""

from __future__ import annotations

import pytest

from arctic_rl_tinker.gpu_seats import BUNDLE_WORKERS, GpuSeats, NoGpuRoomError


def test_one_gpu_a_pool_seats_each_pool_on_a_gpu_of_its_own_as_colocated_jobs():
    seats = GpuSeats(total=2)
    first = seats.take_pool("a", "rank 8")
    second = seats.take_pool("b", "rank 32")
    assert (first.gpus.training, first.gpus.sampling, first.gpus.colocate) == (1, 1, True)
    assert {first.group, second.group} == {"tinker-gpu-0", "tinker-gpu-1"}


def test_a_new_shape_with_no_gpu_left_is_a_409_naming_the_holders_and_changes_nothing():
    seats = GpuSeats(total=2)
    seats.take_pool("a", "rank 8 pool")
    seats.take_pool("b", "rank 32 pool")
    with pytest.raises(NoGpuRoomError) as refused:
        seats.take_pool("c", "rank 16 pool")
    assert refused.value.status == 409
    message = str(refused.value)
    assert "rank 16 pool" in message and "rank 8 pool" in message and "rank 32 pool" in message
    seats.release("a")  # a pool gone: its GPU takes the next shape
    assert seats.take_pool("c", "rank 16 pool").group == "tinker-gpu-0"


def test_a_base_sampler_sits_beside_a_pool_while_its_gpus_bundle_has_room():
    seats = GpuSeats(total=1)
    assert BUNDLE_WORKERS == 3  # a pool's two workers and one sampler
    pool = seats.take_pool("a", "rank 8 pool")
    base = seats.take_base("base:m", "a sampler of m")
    assert base.group == pool.group == "tinker-gpu-0"
    with pytest.raises(NoGpuRoomError):
        seats.take_base("base:n", "a sampler of n")
    seats.release("a")
    seats.release("base:m")
    assert seats.take_base("base:n", "a sampler of n").group == "tinker-gpu-0"


def test_several_gpus_a_pool_give_each_pool_gpus_of_its_own_and_count_them():
    seats = GpuSeats(total=5, pool_gpus=2)
    seat = seats.take_pool("a", "rank 8 pool")
    assert (seat.gpus.training, seat.gpus.sampling, seat.gpus.colocate, seat.group) == (
        1,
        1,
        False,
        None,
    )
    seats.take_pool("b", "rank 32 pool")
    base = seats.take_base("base:m", "a sampler of m")  # the pool's sampling half: 1 GPU
    assert (base.gpus.sampling, base.group) == (1, None)
    with pytest.raises(NoGpuRoomError, match="needs 2 GPU"):
        seats.take_pool("c", "rank 16 pool")


def test_a_pool_share_outside_the_servers_gpus_is_refused():
    with pytest.raises(ValueError, match="between 1 and"):
        GpuSeats(total=2, pool_gpus=3)


def test_the_pool_share_comes_from_the_environment(monkeypatch):
    from arctic_platform.rl.api import ServeError
    from arctic_rl_tinker.serve import POOL_GPUS_ENV, pool_gpus

    monkeypatch.delenv(POOL_GPUS_ENV, raising=False)
    assert pool_gpus(4) == 1
    monkeypatch.setenv(POOL_GPUS_ENV, "2")
    assert pool_gpus(4) == 2
    for bad in ("0", "5", "half"):
        monkeypatch.setenv(POOL_GPUS_ENV, bad)
        with pytest.raises(ServeError, match=POOL_GPUS_ENV):
            pool_gpus(4)


def test_the_servers_gpus_are_its_ray_clusters_when_it_knows_them():
    from types import SimpleNamespace

    from arctic_rl_tinker.gpu_seats import server_gpus

    attached = SimpleNamespace(num_gpus=0, cluster=SimpleNamespace(resources={"GPU": 8.0}))
    assert server_gpus(attached) == 8  # an attached GPU cluster: its own count
    assert server_gpus(SimpleNamespace(num_gpus=2, cluster=None)) == 2  # before start
    assert server_gpus(SimpleNamespace(num_gpus=0)) == 1
