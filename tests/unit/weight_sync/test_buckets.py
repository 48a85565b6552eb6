"""Bucket plans: cutting a weight stream into buckets, the JSON plan, checks, pack/unpack."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from arctic_platform.rl.weight_sync.buckets import (  # noqa: E402
    Bucket,
    TensorMeta,
    WeightMismatchError,
    WeightSyncError,
    check_plan,
    direct_view,
    expected_from_checkpoint,
    pack,
    plan_buckets,
    plan_from_json,
    plan_to_json,
    unpack,
)


def f32(n: int) -> torch.Tensor:
    """A float32 tensor of ``n`` elements (4 n bytes) holding 0..n-1."""
    return torch.arange(n, dtype=torch.float32)


def _layout(buckets: list[Bucket]) -> list[tuple[int, int, list[tuple[str, int, int]]]]:
    return [(b.index, b.nbytes, [(t.name, t.offset, t.nbytes) for t in b.tensors]) for b in buckets]


def test_small_tensors_share_a_bucket_each_at_a_64_byte_aligned_offset():
    named = [("a", f32(3)), ("b", f32(16)), ("c", f32(1))]
    assert _layout(plan_buckets(named, bucket_size=4096)) == [
        (0, 192, [("a", 0, 12), ("b", 64, 64), ("c", 128, 4)])
    ]


def test_a_tensor_that_exactly_fills_the_bucket_stays_and_the_next_one_starts_a_new_bucket():
    named = [("a", f32(3)), ("b", f32(16)), ("c", f32(1))]
    assert _layout(plan_buckets(named, bucket_size=128, direct_bytes=1000)) == [
        (0, 128, [("a", 0, 12), ("b", 64, 64)]),
        (1, 64, [("c", 0, 4)]),
    ]


def test_a_tensor_of_direct_bytes_or_more_gets_its_own_unaligned_bucket():
    named = [("a", f32(3)), ("big", f32(25)), ("c", f32(1)), ("bigger", f32(26))]
    assert _layout(plan_buckets(named, bucket_size=4096, direct_bytes=100)) == [
        (0, 64, [("a", 0, 12)]),
        (1, 100, [("big", 0, 100)]),
        (2, 64, [("c", 0, 4)]),
        (3, 104, [("bigger", 0, 104)]),
    ]


def test_a_tensor_bigger_than_a_bucket_is_sent_on_its_own():
    plan = plan_buckets([("w", f32(40))], bucket_size=64, direct_bytes=10**9)
    assert _layout(plan) == [(0, 160, [("w", 0, 160)])]


def test_each_tensor_keeps_its_dtype_name_and_shape():
    named = [
        ("w", torch.zeros(2, 3, dtype=torch.bfloat16)),
        ("n", torch.zeros(4, dtype=torch.int64)),
    ]
    (bucket,) = plan_buckets(named, bucket_size=4096)
    assert [(t.dtype, t.shape) for t in bucket.tensors] == [("bfloat16", (2, 3)), ("int64", (4,))]


@pytest.mark.parametrize("size", [0, -8])
def test_a_bucket_size_must_be_positive(size):
    with pytest.raises(ValueError) as info:
        plan_buckets([("a", f32(1))], bucket_size=size)
    assert str(info.value) == f"bucket_size must be > 0, got {size}"
    assert _layout(plan_buckets([("a", f32(1))], bucket_size=1)) == [(0, 4, [("a", 0, 4)])]


def test_a_name_twice_in_the_stream_is_an_error_naming_it():
    with pytest.raises(WeightSyncError) as info:
        plan_buckets([("a", f32(1)), ("b", f32(1)), ("a", f32(1))], bucket_size=4096)
    assert str(info.value) == "parameter 'a' appears twice in the weight stream"


def test_the_plan_travels_as_json_and_comes_back_equal():
    plan = plan_buckets([("a", f32(3)), ("b", torch.zeros(2, 2))], bucket_size=4096)
    text = plan_to_json(plan, version=7)
    assert json.loads(text) == {
        "version": 7,
        "buckets": [
            {
                "index": 0,
                "nbytes": 128,
                "tensors": [["a", "float32", [3], 0, 12], ["b", "float32", [2, 2], 64, 16]],
            }
        ],
    }
    assert plan_from_json(text) == (7, plan)


EXPECTED = {"a": ((3,), "float32"), "b": ((2, 2), None)}


def _plan() -> list[Bucket]:
    return plan_buckets([("a", f32(3)), ("b", torch.zeros(2, 2, dtype=torch.float16))], 4096)


def test_a_plan_that_fits_passes_and_none_means_no_check():
    check_plan(_plan(), EXPECTED)  # b: any dtype
    check_plan([Bucket(0, 4, (TensorMeta("zzz", "int8", (9,), 0, 4),))], None)


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        ({"b": ((2, 2), None)}, "the sender has parameter 'a' that the receiver does not know"),
        (
            {**EXPECTED, "a": ((1, 3), None)},
            "parameter 'a': sender shape [3], receiver expects [1, 3]",
        ),
        (
            {**EXPECTED, "a": ((3,), "bfloat16")},
            "parameter 'a': sender dtype float32, receiver expects bfloat16",
        ),
        (
            {**EXPECTED, "d": ((1,), None), "c": ((1,), None), "f": ((1,), None), "e": ((), None)},
            "the sender did not send 4 parameter(s) the receiver needs, e.g. ['c', 'd', 'e']",
        ),
    ],
)
def test_a_plan_that_does_not_fit_is_refused_naming_the_parameter(expected, message):
    with pytest.raises(WeightMismatchError) as info:
        check_plan(_plan(), expected)
    assert str(info.value) == message


def test_pack_then_unpack_gives_the_tensors_back_as_views_of_the_buffer():
    tensors = {"a": f32(3), "b": torch.tensor([[1, -2], [3, -4]], dtype=torch.int64)}
    (bucket,) = plan_buckets(list(tensors.items()), bucket_size=4096)
    out = torch.full((bucket.nbytes + 32,), 255, dtype=torch.uint8)
    buf = pack(bucket, tensors, out)
    assert buf.numel() == bucket.nbytes and buf.data_ptr() == out.data_ptr()
    assert bytes(buf[12:64].tolist()) == b"\xff" * 52  # the alignment gap is not written
    back = unpack(bucket, buf)
    assert [name for name, _ in back] == ["a", "b"]
    for name, view in back:
        assert torch.equal(view, tensors[name]) and view.dtype == tensors[name].dtype
    assert back[1][1].data_ptr() == buf.data_ptr() + 64  # a view, no copy


def test_pack_takes_a_non_contiguous_tensor_by_value():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    (bucket,) = plan_buckets([("t", t)], bucket_size=4096)
    buf = pack(bucket, {"t": t}, torch.empty(bucket.nbytes, dtype=torch.uint8))
    assert torch.equal(unpack(bucket, buf)[0][1], t)


def test_a_bucket_of_one_whole_contiguous_tensor_is_sent_from_its_own_memory():
    w = f32(40)
    (bucket,) = plan_buckets([("w", w)], bucket_size=4096, direct_bytes=100)
    view = direct_view(bucket, {"w": w})
    assert view is not None and view.dtype == torch.uint8 and view.numel() == 160
    assert view.data_ptr() == w.data_ptr()


def test_no_direct_view_for_several_tensors_padding_or_a_strided_tensor():
    a, b = f32(3), f32(1)
    (two,) = plan_buckets([("a", a), ("b", b)], bucket_size=4096)
    assert direct_view(two, {"a": a, "b": b}) is None
    (padded,) = plan_buckets([("a", a)], bucket_size=4096)  # 12 bytes in a 64-byte bucket
    assert direct_view(padded, {"a": a}) is None
    t = torch.zeros(30, 20).t()
    (strided,) = plan_buckets([("t", t)], bucket_size=4096, direct_bytes=100)
    assert direct_view(strided, {"t": t}) is None


def test_expected_names_shapes_and_dtypes_come_from_safetensors_headers(tmp_path):
    from safetensors.torch import save_file

    save_file(
        {"w": torch.zeros(2, 3), "n": torch.zeros(4, dtype=torch.int64)},
        tmp_path / "a.safetensors",
        metadata={"format": "pt"},
    )
    save_file({"h": torch.zeros(5, dtype=torch.bfloat16)}, tmp_path / "b.safetensors")
    (tmp_path / "notes.txt").write_text("not a shard")
    assert expected_from_checkpoint(tmp_path) == {
        "w": ((2, 3), None),
        "n": ((4,), None),
        "h": ((5,), None),
    }
    assert expected_from_checkpoint(str(tmp_path), check_dtype=True) == {
        "w": ((2, 3), "float32"),
        "n": ((4,), "int64"),
        "h": ((5,), "bfloat16"),
    }


def test_a_directory_without_shards_is_an_error_naming_it(tmp_path):
    with pytest.raises(WeightSyncError) as info:
        expected_from_checkpoint(tmp_path)
    assert str(info.value) == f"no *.safetensors files in {tmp_path}"


def test_alignment_holds_for_many_tensors_in_one_bucket():
    plan = plan_buckets([(f"p{i}", f32(3)) for i in range(80)], bucket_size=1 << 20)
    assert [t.offset for t in plan[0].tensors] == [64 * i for i in range(80)]


def test_a_direct_bucket_keeps_its_tensors_dtype_and_shape():
    (bucket,) = plan_buckets([("w", torch.zeros(5, 8, dtype=torch.float16))], 4096, direct_bytes=64)
    assert bucket.tensors == (TensorMeta("w", "float16", (5, 8), 0, 80),)


def test_an_unlisted_safetensors_dtype_is_lowercased(tmp_path):
    header = json.dumps({"x": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})
    raw = header.encode()
    (tmp_path / "m.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0\0")
    assert expected_from_checkpoint(tmp_path, check_dtype=True) == {"x": ((2,), "f8_e4m3")}
