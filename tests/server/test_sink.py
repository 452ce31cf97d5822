"""Result sinks: where a completed round's aggregate lives and what each pull's reply carries."""
import numpy as np
import pytest

from gradpress.net.protocol import Op
from gradpress.net.shm import Arena
from gradpress.server.sink import FrameSink, SharedSlots, sum_dtype

A, B = b"A", b"B"


@pytest.fixture
def segments():
    """Make result regions as the engine does, in an arena of small chunks."""
    arena = Arena("s", chunk_bytes=4096)

    def make(count, dtype, key=7):
        return arena.alloc(2 * count * np.dtype(dtype).itemsize)
    yield make
    arena.close()


def _sum_round(sink, rnd, values):
    acc = sink.accumulator(rnd)
    acc[:] = values
    sink.publish(rnd, acc)
    return acc


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_frames_reply_with_the_accumulator_and_the_next_round_gets_a_fresh_one(dtype):
    sink = FrameSink(key=3, count=4, dtype=dtype)
    first = sink.accumulator(0)
    assert first.dtype == sum_dtype(dtype) and not first.any(), "round 0 must start from zeros"
    _sum_round(sink, 0, [1, 2, 3, 4])
    reply = sink.reply(A, 0)
    assert reply.op == Op.PULL_REPLY and reply.to == A
    assert reply.fields == {"key": 3, "round": 0, "dtype": dtype, "count": 4}
    assert reply.buffers[0] is first, "the aggregate should travel without a copy"
    assert sink.accumulator(1) is not first, "round 1 would overwrite a reply still in flight"
    _sum_round(sink, 1, [9, 9, 9, 9])
    assert np.array_equal(reply.buffers[0], [1, 2, 3, 4]), "round 1 changed round 0's reply"


def test_frames_round_fp16_once_from_an_fp32_sum():
    sink = FrameSink(key=3, count=2, dtype="float16")
    acc = sink.accumulator(0)
    assert acc.dtype == np.float32
    _sum_round(sink, 0, [1024.25, 0.1])
    [values] = sink.reply(A, 0).buffers
    assert values.dtype == np.float16
    assert np.array_equal(values, np.array([1024.25, 0.1], np.float32).astype(np.float16))
    assert sink.accumulator(1) is acc, "fp16 results are a new array; the fp32 accumulator is reused"


def test_frames_carry_a_compressed_aggregate_as_published():
    sink = FrameSink(key=3, count=64, dtype="float32")
    bufs = [np.arange(8, dtype=np.uint8), np.array([0.5], np.float32)]
    sink.publish_compressed(2, {"codec": "onebit", "meta": {"n": 64}}, bufs)
    reply = sink.reply(B, 2)
    assert reply.fields == {"key": 3, "round": 2, "dtype": "float32", "count": 64,
                            "codec": "onebit", "meta": {"n": 64}}
    assert reply.buffers is bufs
    _sum_round(sink, 3, np.ones(64))  # an uncompressed aggregate replaces the compressed one
    assert "codec" not in sink.reply(B, 3).fields


def test_snapshot_is_a_copy_in_the_wire_dtype():
    for dtype in ("float32", "float16"):
        sink = FrameSink(key=1, count=3, dtype=dtype)
        acc = sink.accumulator(0)
        acc[:] = [1, 2, 3]
        [values] = sink.snapshot(A, 5, acc).buffers
        acc += 10
        assert values.dtype == np.dtype(dtype) and np.array_equal(values, [1, 2, 3]), dtype


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shared_slots_sum_in_place_and_alternate_by_round(segments, dtype):
    sink = SharedSlots(key=7, count=4, dtype=dtype, region=segments(4, dtype))
    sink.readers.add(A)
    for rnd in range(4):
        acc = sink.accumulator(rnd)
        assert acc is sink.slots[rnd % 2], "the round must sum straight into its shared slot"
        acc[:] = rnd + 1
        sink.publish(rnd, acc)
        shared, framed = sink.reply(A, rnd), sink.reply(B, rnd)
        assert shared.fields == {"key": 7, "round": rnd, "dtype": dtype, "count": 4,
                                 "shm": sink.region.ref, "slot": rnd % 2}
        assert shared.buffers == [], "a co-located reader needs no data frame"
        assert "shm" not in framed.fields and framed.buffers[0] is sink.slots[rnd % 2]
        assert np.all(sink.slots[rnd % 2] == rnd + 1)
    assert np.all(sink.slots[0] == 3) and np.all(sink.slots[1] == 4)


def test_shared_slots_round_fp16_into_the_slot_from_a_private_fp32_sum(segments):
    sink = SharedSlots(key=7, count=2, dtype="float16", region=segments(2, "float16"))
    acc = sink.accumulator(1)
    assert acc.dtype == np.float32 and not np.shares_memory(acc, sink.slots[1])
    acc[:] = [1024.25, 3.0]
    sink.publish(1, acc)
    assert sink.slots[1].dtype == np.float16
    assert np.array_equal(sink.slots[1], np.array([1024.25, 3.0], np.float32).astype(np.float16))
    assert sink.accumulator(2) is acc


def test_shared_slots_publish_a_sum_made_elsewhere(segments):
    sink = SharedSlots(key=7, count=3, dtype="float32", region=segments(3, "float32"))
    sink.publish(0, np.array([1, 2, 3], np.float32))
    assert np.array_equal(sink.slots[0], [1, 2, 3])


def test_shared_slots_refuse_a_compressed_aggregate_and_a_short_segment(segments):
    sink = SharedSlots(key=7, count=4, dtype="float32", region=segments(4, "float32"))
    with pytest.raises(TypeError, match="uncompressed results only"):
        sink.publish_compressed(0, {"codec": "onebit", "meta": {}}, [])
    with pytest.raises(ValueError, match="two slots need 32"):
        SharedSlots(key=8, count=4, dtype="float32", region=segments(2, "float32", key=8))
