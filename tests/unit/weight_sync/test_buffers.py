"""BufferCache keeps one region per use and cuts it; ChannelCache keeps and evicts channels."""

from __future__ import annotations

from arctic_platform.rl.weight_sync.buffers import BufferCache
from arctic_platform.rl.weight_sync.channels import ChannelCache, PairChannel


def test_same_sizes_reuse_the_same_memory():
    cache = BufferCache()
    first = cache.get("recv", [64, 128], "cpu")
    again = cache.get("recv", [64, 128], "cpu")
    assert [b.numel() for b in again] == [64, 128]
    assert again[0].data_ptr() == first[0].data_ptr()
    assert again[1].data_ptr() == first[0].data_ptr() + 64  # cut from one region
    assert cache.nbytes() == 192


def test_a_plan_of_about_the_same_total_reuses_the_region_and_a_bigger_one_replaces_it():
    cache = BufferCache()
    first = cache.get("recv", [100, 100], "cpu")
    similar = cache.get("recv", [90, 100], "cpu")  # smaller, within the slack
    assert similar[0].data_ptr() == first[0].data_ptr()
    bigger = cache.get("recv", [400], "cpu")
    assert bigger[0].numel() == 400 and cache.nbytes() == 400


def test_uses_are_separate_and_clear_frees_them():
    cache = BufferCache()
    a = cache.get("pack0", [32], "cpu")
    b = cache.get("pack1", [32], "cpu")
    assert a[0].data_ptr() != b[0].data_ptr()
    cache.clear()
    assert cache.nbytes() == 0


def test_channel_cache_keeps_by_port_and_side_and_evicts_other_ports():
    cache = ChannelCache()
    sender = PairChannel(5000, True, store=object())
    receiver = PairChannel(5000, False, store=object())
    other = PairChannel(5001, True, store=object())
    for channel in (sender, receiver, other):
        cache.put(channel)
    assert cache.ports() == [5000, 5001]
    assert cache.peek(5000, True) is sender
    cache.retain([5000])
    assert cache.ports() == [5000] and other.store is None  # closed
    assert cache.take(5000, False) is receiver and cache.take(5000, False) is None
    cache.clear()
    assert cache.ports() == [] and sender.store is None
