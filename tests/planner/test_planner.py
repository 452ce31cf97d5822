"""gradpress/planner: the timeline simulator against answers worked out by hand, the
decision on profiles whose right answer is known, profiles and plan files, gradpress-plan."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from gradpress.planner.decide import TRIAL_MARGIN, TRIALS, decide, group_by_threshold
from gradpress.planner.fits import fit_linear, fit_link, fit_message, probe_batches
from gradpress.planner.profile import CodecCost, HostShare, LinearCost, Link, Profile, ProfileError, TensorProfile
from gradpress.planner.simulate import predict
from gradpress.planner.synthetic import synthetic_profile

MB = 1 << 20
ZERO = LinearCost(0.0, 0.0)
RAW = CodecCost(ZERO, LinearCost(0.0, 1e-10), LinearCost(0.0, 2e-10), 1.0)  # copy 10 GB/s, sum 5 GB/s


def profile(tensors, workers=1, servers=1, rate=100e6, alpha=1e-4, backward=0.1, step=0.01, codecs=None,
            credit=8, message=0.0) -> Profile:
    return Profile(workers, servers, tuple(TensorProfile(f"t{i}", b, r, -i) for i, (b, r) in enumerate(tensors)),
                   backward, step, codecs or {"none": RAW}, Link(alpha, rate), message, partition_bytes=4 * MB,
                   credit=credit)


def test_one_tensor_by_hand():
    b, rate, alpha, w = MB, 100e6, 1e-4, 1
    prof = profile([(b, 0.1)], workers=w, rate=rate, alpha=alpha)
    arrive = 0.1 + b / rate + alpha                    # up the worker's link (the server's in step)
    done = arrive + w * 2e-10 * b                       # the server sums the push
    land = done + w * b / rate + alpha                  # down the server's and the worker's links
    want = land + 1e-10 * b + 0.01                      # the worker copies the reply out, then steps
    assert predict(prof, [(0,)], ["none"]) == pytest.approx(want, rel=1e-12)


def test_two_tensors_overlap_with_backward():
    # the first gradient's round trip (about 21 ms) hides behind the 50 ms of backward left
    prof = profile([(MB, 0.05), (MB, 0.1)])
    alone = predict(profile([(MB, 0.1)]), [(0,)], ["none"])
    assert predict(prof, [(0,), (1,)], ["none", "none"]) == pytest.approx(alone, rel=1e-12)
    # fused, the pair waits for the second and travels as 2 MB after the copy into the
    # group's buffer (the average comes back as views of it: no copy out)
    fused = predict(prof, [(0, 1)], ["none"])
    copy = 1e-10 * 2 * MB
    b, rate, alpha = 2 * MB, 100e6, 1e-4
    land = 0.1 + copy + b / rate + alpha + 2e-10 * b + b / rate + alpha
    assert fused == pytest.approx(land + 1e-10 * b + 0.01, rel=1e-12)


def test_a_gpu_workers_partition_crosses_the_bus_both_ways_and_a_group_gathers_on_the_device():
    # on a GPU the raw path's compress is the copy off the device and its decompress the
    # copy back with the divide; a fused group's gather costs nothing that counts
    off, back = LinearCost(1e-5, 5e-11), LinearCost(2e-5, 1e-10)
    b, rate, alpha = 2 * MB, 100e6, 1e-4
    trip = b / rate + alpha + 2e-10 * b + b / rate + alpha  # up, the server's sum, down
    prof = replace(profile([(MB, 0.05), (MB, 0.1)], codecs={"none": CodecCost(off, back, LinearCost(0.0, 2e-10), 1.0)}),
                   device="cuda")
    assert predict(prof, [(0, 1)], ["none"]) == pytest.approx(0.1 + off(b) + trip + back(b) + 0.01, rel=1e-12)
    on_host = replace(prof, device="cpu")  # the same costs on a host: no compress, the gather a copy
    assert predict(on_host, [(0, 1)], ["none"]) == pytest.approx(0.1 + back(b) + trip + back(b) + 0.01, rel=1e-12)
    with pytest.raises(ProfileError, match="device 'tpu'"):
        replace(prof, device="tpu")
    assert Profile.from_json(prof.to_json()).device == "cuda"


def test_fp16_raw_sends_half_the_bytes_without_a_codec_and_wins_where_a_codec_costs_the_gpu_more():
    # Compression.fp16's way: the cast and the copy of the halves off the device, half the
    # bytes each way, the server's add of each push and its reply rounded once; no codec
    off, back = LinearCost(1e-5, 2.5e-11), LinearCost(2e-5, 5e-11)
    add, reply = LinearCost(0.0, 1e-10), LinearCost(0.0, 5e-11)
    halves = CodecCost(off, back, add, 0.5, server_compress=reply)
    b, rate, alpha = 2 * MB, 100e6, 1e-4
    codecs = {"none": CodecCost(LinearCost(1e-5, 5e-11), LinearCost(2e-5, 1e-10), LinearCost(0.0, 2e-10), 1.0),
              "fp16_raw": halves,
              # the fp16 codec: the same bytes, its error feedback and encode a kernel per partition
              "fp16": CodecCost(LinearCost(2e-4, 4e-10), LinearCost(1e-4, 1e-10), add, 0.5)}
    prof = replace(profile([(MB, 0.05), (MB, 0.1)], codecs=codecs), device="cuda")
    trip = b / 2 / rate + alpha + add(b) + reply(b) + b / 2 / rate + alpha
    assert predict(prof, [(0, 1)], ["fp16_raw"]) == pytest.approx(0.1 + off(b) + trip + back(b) + 0.01, rel=1e-12)
    plan = decide(prof, ["fp16", "fp16_raw", "none"], 0)
    assert set(plan.options) == {"fp16_raw"}, plan
    assert plan.predicted_s < min(decide(prof, [o], 0).predicted_s for o in ("fp16", "none"))
    # two workers of one machine reducing locally: each casts and copies its halves off the
    # card (that copy is the hand-over), the owner of a partition adds its peer's halves;
    # one push per machine
    halves_only = replace(halves, uncompressed=True)
    local = replace(prof, workers=2, local_size=2, codecs={**codecs, "fp16_raw": halves_only})
    comm = off(b) + add(b) / 2
    assert predict(local, [(0, 1)], ["fp16_raw"]) == pytest.approx(0.1 + comm + trip + back(b) + 0.01, rel=1e-12)
    # on a host: the cast, and a copy of the halves into the segment for the peer's part
    host = replace(local, device="cpu")
    copy = codecs["none"].decompress
    comm = off(b) + (add(b) + 0.5 * copy(b)) / 2
    gather = copy(b)   # the fused group's copy into its buffer, on the training thread
    assert predict(host, [(0, 1)], ["fp16_raw"]) == \
        pytest.approx(0.1 + gather + comm + trip + back(b) + 0.01, rel=1e-12)
    assert Profile.from_json(host.to_json()).codecs["fp16_raw"].uncompressed   # in the broadcast profile


def test_a_bfloat16_model_is_planned_as_its_bytes_travel():
    """bfloat16 travels widened to float32, raw or under ``Compression.fp16`` (float16 would
    overflow it): the profile counts its raw path at 4 bytes an element, and ``fp16_raw``,
    no codec at all for it, is no option where every tensor is bfloat16. The dtype is the one
    the tensors come in, not always their parameter's."""
    import torch

    from gradpress.compressors import auto
    from gradpress.pipeline.planning.clock import StepClock
    from gradpress.pipeline.planning.profiling import raw_bytes, tensors
    params = [torch.zeros(8, 4, dtype=dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)]
    clock = StepClock([id(p) for p in params])
    profiled = tensors(clock, params, {id(p): f"t{i}" for i, p in enumerate(params)}, {id(p): 0 for p in params})
    assert [(t.name, t.nbytes, t.itemsize) for t in profiled] == [("t0", 128, 4), ("t1", 128, 2), ("t2", 128, 4)]
    # the bytes the sockets' CPU per byte is fitted over: the same widths
    assert raw_bytes(params) == 128 + 64 + 128
    # an optimizer's float32 momentum of a float16 parameter travels as the float32 it is
    from gradpress.optim.momentum_codecs import state_dtype
    profiled = tensors(clock, params, {id(p): f"t{i}" for i, p in enumerate(params)}, {id(p): 0 for p in params},
                       state_dtype)
    assert [t.itemsize for t in profiled] == [4, 4, 4]
    every = auto.options({"compressor": "auto"})
    assert "fp16_raw" not in auto.for_dtypes(every, {"torch.bfloat16"})
    assert auto.for_dtypes(every, {"torch.bfloat16"}) == {k: v for k, v in every.items() if k != "fp16_raw"}
    # one group may hold both: its float32 buffer narrowed to float16 would overflow bfloat16's values
    assert "fp16_raw" not in auto.for_dtypes(every, {"torch.bfloat16", "torch.float32"})
    assert auto.for_dtypes(every, {"torch.float16", "torch.float32"}) == every
    assert auto.for_dtypes(every, {"torch.float16"}) == every
    only = auto.options({"compressor": "auto", "allowed": ["fp16_raw"]})
    assert auto.for_dtypes(only, {"torch.bfloat16"}) == {"none": {"compressor": "none"}}


def test_a_codec_allowed_as_a_dict_and_by_name_keeps_both():
    from gradpress.compressors import auto
    mine = {"compressor": "topk", "k": 0.001, "ef": "vanilla"}
    # the name came second and took the dict's place: the user's k was gone without a word
    assert auto.options({"compressor": "auto", "allowed": [mine, "topk"]}) == \
        {"topk": mine, "topk.1": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}}
    assert auto.options({"compressor": "auto", "allowed": ["topk", mine]}) == \
        {"topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}, "topk.1": mine}
    assert list(auto.options({"compressor": "auto", "allowed": ["topk", "none", "topk"]})) == ["topk", "none"]
    # a dict is taken as it is: error feedback only where it says so
    assert auto.options({"compressor": "auto", "allowed": [{"compressor": "topk", "k": 0.001}]}) == \
        {"topk": {"compressor": "topk", "k": 0.001}}


def test_fp16_raw_is_an_option_of_auto_without_parameters():
    from gradpress.compressors import auto
    from gradpress.optim.momentum_codecs import momentum_codec_problem
    assert auto.options({"compressor": "auto"})["fp16_raw"] == {"compressor": "fp16_raw"}  # a default
    assert auto.options({"compressor": "auto", "allowed": [{"compressor": "fp16_raw"}, "none"]}) == \
        {"fp16_raw": {"compressor": "fp16_raw"}, "none": {"compressor": "none"}}
    with pytest.raises(ValueError, match=r"allowed\[0\].*'fp16_raw' takes no parameters"):
        auto.options({"compressor": "auto", "allowed": [{"compressor": "fp16_raw", "ef": "vanilla"}]})
    with pytest.raises(ValueError, match="accepted: .*fp16_raw"):
        auto.options({"compressor": "auto", "allowed": [{"compressor": "fp32_raw"}]})
    # not a codec of its own: as a tensor's compression_params it names what to use instead
    from gradpress.compressors.spec import CodecSpec
    with pytest.raises(ValueError, match="option of compressor 'auto' only.*Compression.fp16"):
        CodecSpec.from_params({"compressor": "fp16_raw"})
    # the momentum path carries it (to rounding, as fp16 without error feedback)
    assert momentum_codec_problem({"compressor": "auto", "allowed": ["fp16_raw", "onebit"]}) is None


def test_fp16_raw_is_calibrated_as_casts_and_float16_sums(tmp_path, monkeypatch):
    from gradpress.planner import calibrate
    monkeypatch.setenv("GRADPRESS_CACHE_DIR", str(tmp_path))
    options = {"fp16_raw": {"compressor": "fp16_raw"}}
    costs = calibrate.codec_costs(options)
    halves, raw = costs["fp16_raw"], costs["none"]
    assert halves.payload_ratio == 0.5 and not halves.low_rank
    for cost in (halves.compress, halves.decompress, halves.add, halves.recompress):
        assert cost.per_byte_s > 0, halves
    assert halves.recompress is halves.server_compress   # the reply's rounding, not the worker's cast
    assert raw.compress == LinearCost(0.0, 0.0)           # (the raw path has no cast on a host)
    # cached: a second call measures nothing
    monkeypatch.setattr(calibrate, "measure", lambda params: 1 / 0)
    assert calibrate.codec_costs(options) == costs


def test_a_server_that_is_the_bottleneck():
    # 4 workers on one server: its link carries 4 copies of every push and every reply
    b, rate, alpha = MB, 100e6, 0.0
    prof = profile([(b, 0.1)], workers=4, rate=rate, alpha=alpha)
    arrive = 0.1 + 4 * b / rate
    done = arrive + 4 * 2e-10 * b
    land = done + 4 * b / rate
    assert predict(prof, [(0,)], ["none"]) == pytest.approx(land + 1e-10 * b + 0.01, rel=1e-12)
    # two servers share the load: two tensors, one each, in parallel
    two = profile([(b, 0.1), (b, 0.1)], workers=4, servers=2, rate=rate, alpha=alpha)
    one = profile([(b, 0.1), (b, 0.1)], workers=4, servers=1, rate=rate, alpha=alpha)
    assert predict(two, [(0,), (1,)], ["none"] * 2) < predict(one, [(0,), (1,)], ["none"] * 2)


def test_the_servers_recompression_costs_what_the_codec_says_the_server_pays():
    # one compressed tensor, 2 workers: the server sums both pushes, then recompresses once;
    # random-k without scaling recompresses its k values (server_compress), not n
    b, rate, alpha, w, ratio = 4 * MB, 1e9, 0.0, 2, 1 / 64
    comp, dec, add, server = 1e-9, 1e-10, 2e-10, 1e-11
    codec = CodecCost(LinearCost(0, comp), LinearCost(0, dec), LinearCost(0, add), ratio)
    pay = ratio * b

    def want(recompress):
        arrive = 0.1 + comp * b + w * pay / rate          # compressed, up the server's link
        done = arrive + w * add * b + recompress * b      # sums both, recompresses the aggregate
        return done + w * pay / rate + dec * b + 0.01     # down, decoded, then the step

    prof = profile([(b, 0.1)], workers=w, rate=rate, alpha=alpha, codecs={"none": RAW, "c": codec})
    assert predict(prof, [(0,)], ["c"]) == pytest.approx(want(comp), rel=1e-12)
    cheap = replace(codec, server_compress=LinearCost(0, server))
    prof = profile([(b, 0.1)], workers=w, rate=rate, alpha=alpha, codecs={"none": RAW, "c": cheap})
    assert predict(prof, [(0,)], ["c"]) == pytest.approx(want(server), rel=1e-12)
    assert Profile.from_json(prof.to_json()).codecs["c"] == cheap  # it travels in profiles


def test_credit_holds_pushes_back():
    b, rate, alpha = MB, 100e6, 1e-4
    tensors = [(b, 0.1)] * 4                            # one partition per server, all ready at 0.1
    free = predict(profile(tensors, credit=8, servers=4), [(i,) for i in range(4)], ["none"] * 4)
    enough = predict(profile(tensors, credit=4, servers=4), [(i,) for i in range(4)], ["none"] * 4)
    one = predict(profile(tensors, credit=1, servers=4), [(i,) for i in range(4)], ["none"] * 4)
    # free: four pushes up the worker's link, then the last one's sum, its reply down, its copy out, the step
    assert free == pytest.approx(0.1 + 5 * b / rate + 2 * alpha + 3e-10 * b + 0.01, rel=1e-12)
    assert enough == pytest.approx(free, rel=1e-12), "a credit that covers every partition holds nothing back"
    # a credit of one: each push after the first waits for the previous one's acknowledgement
    assert one == pytest.approx(free + 3 * alpha, rel=1e-12), "a credit of one adds a latency per push held back"


SLOW_CODEC = CodecCost(LinearCost(0, 1 / 0.5e9), LinearCost(0, 1 / 2e9), LinearCost(0, 1 / 2e9), 1 / 32)


def test_no_compression_where_it_costs_more_than_it_saves():
    # 10 GB/s links: 64 MB of gradients take 6.4 ms raw, 128 ms to compress at 0.5 GB/s
    prof = profile([(16 * MB, 0.02 * (i + 1)) for i in range(4)], rate=10e9, backward=0.1,
                   codecs={"none": RAW, "onebit": SLOW_CODEC})
    plan = decide(prof, ["none", "onebit"])
    assert set(plan.options) == {"none"}, plan.options


def test_a_codec_where_the_link_is_slow():
    # 10 MB/s: 64 MB raw take 6.4 s each way; onebit sends 2 MB
    prof = profile([(16 * MB, 0.02 * (i + 1)) for i in range(4)], rate=10e6, backward=0.1,
                   codecs={"none": RAW, "onebit": SLOW_CODEC})
    plan = decide(prof, ["none", "onebit"])
    assert set(plan.options) == {"onebit"}, plan.options
    assert plan.predicted_s < predict(prof, [(i,) for i in range(4)], ["none"] * 4) / 5


def test_plans_predicted_close_are_left_to_the_job_to_measure():
    # 10 MB/s: two codecs of near cost and payload are close, raw is 16x slower
    near = CodecCost(LinearCost(0, 1 / 0.6e9), LinearCost(0, 1 / 2e9), LinearCost(0, 1 / 2e9), 1 / 30)
    prof = profile([(16 * MB, 0.02 * (i + 1)) for i in range(4)], rate=10e6, backward=0.1,
                   codecs={"none": RAW, "onebit": SLOW_CODEC, "near": near})
    plan = decide(prof, ["none", "onebit", "near"])
    assert 1 <= len(plan.alternatives) <= TRIALS
    seen = [plan]
    for alt in plan.alternatives:
        assert len(set(alt.options)) == 1 and alt.options[0] != "none", alt.options  # uniform, compressed
        assert alt.predicted_s <= TRIAL_MARGIN * plan.predicted_s
        assert alt.predicted_s == pytest.approx(predict(prof, list(alt.groups), list(alt.options)), rel=1e-12)
        assert not any(alt.same_as(p) for p in seen), "a plan measured twice"
        seen.append(alt)
    assert [a.predicted_s for a in plan.alternatives] == sorted(a.predicted_s for a in plan.alternatives)
    # a single option: nothing else to measure
    assert decide(prof, ["onebit"]).alternatives == ()
    assert "to measure too: near x" in plan.table(prof) or "to measure too: onebit x" in plan.table(prof)


def test_plans_predicted_alike_are_measured_least_host_cpu_first():
    # backward long enough to hide every compressed plan (all at the floor, alike); on a shared
    # host the job measures first those whose codecs take its CPUs least, whatever their names
    # or payloads (with more options than trials, the last are left out)
    def codec(ns_per_byte: float, ratio: float) -> CodecCost:
        c = LinearCost(0.0, ns_per_byte * 1e-9)
        return CodecCost(c, c, c, ratio)
    codecs = {"none": RAW, "a_dear": codec(0.8, 0.05), "b_mid": codec(0.4, 0.05), "c_cheap": codec(0.1, 0.001),
              "d_dearer": codec(1.6, 0.03), "e_cheaper": codec(0.05, 0.02)}
    host = HostShare(cores=2.0, workers=2, servers=2, train_cpu_s=0.2, wire_s_per_byte=1e-10)
    # 20 MB/s: raw misses the floor, every codec hides behind the backward
    prof = replace(profile([(4 * MB, 0.1 * (i + 1)) for i in range(4)], workers=2, servers=2, rate=20e6, backward=1.0),
                   codecs=codecs, host=host)
    options = sorted(codecs)
    plan = decide(prof, options, 0)
    uniform = {o: decide(prof, [o], 0).predicted_s for o in options if o != "none"}
    assert len({round(t, 9) for t in uniform.values()}) == 1, uniform   # alike
    assert len(plan.alternatives) == TRIALS
    measured = [a.options[0] for a in plan.alternatives]
    # the decision itself takes the tie by payload (it loses the least): a_dear; the rest by CPU
    assert plan.options[0] == "a_dear" and measured == ["e_cheaper", "c_cheap", "b_mid", "d_dearer"], measured


def test_a_message_costs_the_communication_thread():
    one = predict(profile([(MB, 0.1)]), [(0,)], ["none"])
    assert predict(profile([(MB, 0.1)], message=1e-3), [(0,)], ["none"]) == pytest.approx(one + 1e-3, rel=1e-12)


def test_small_tensors_are_fused_when_messages_dominate():
    # 100 tensors of 4 KB ready in the last 10 ms, 0.5 ms of CPU per message: 50 ms apart
    prof = profile([(4096, 0.09 + 1e-4 * i) for i in range(100)], rate=1e9, backward=0.1, message=5e-4)
    plan = decide(prof, ["none"])
    assert len(plan.groups) < 10, plan.groups
    assert sorted(i for g in plan.groups for i in g) == list(range(100))  # every tensor, once, in order
    # the job measures the same plan unfused too: the copies' cost is what the simulator knows least
    [apart] = plan.alternatives
    assert apart.groups == tuple((i,) for i in range(100)) and set(apart.options) == {"none"}
    assert apart.predicted_s == pytest.approx(predict(prof, list(apart.groups), list(apart.options)), rel=1e-12)
    assert apart.predicted_s > plan.predicted_s


def test_the_unfused_alternative_keeps_each_groups_option():
    # 40 tensors of 128 KB at the end of backward, a slow link, dear messages: compressed and
    # fused into groups; apart, each tensor keeps its group's option
    prof = profile([(128 << 10, 0.09 + 1e-4 * i) for i in range(40)], rate=10e6, backward=0.1, message=5e-3,
                   alpha=1e-3, codecs={"none": RAW, "onebit": SLOW_CODEC})
    plan = decide(prof, ["none", "onebit"])
    assert any(len(g) > 1 for g in plan.groups), plan.groups
    apart = next(a for a in plan.alternatives if all(len(g) == 1 for g in a.groups))
    option_of = {i: o for g, o in zip(plan.groups, plan.options) for i in g}
    assert apart.options == tuple(option_of[i] for (i,) in apart.groups)
    assert "onebit" in apart.options and apart.predicted_s > plan.predicted_s


def test_group_boundaries_keep_backward_order():
    prof = synthetic_profile(50)
    for threshold in (0, 64 << 10, 1 << 20):
        groups = group_by_threshold(prof, threshold)
        assert [i for g in groups for i in g] == list(range(50))
        # a tensor that fills a group alone is never copied into one
        assert all(len(g) == 1 for g in groups if any(prof.tensors[i].nbytes >= threshold for i in g))


def test_only_small_tensors_are_fused_around_a_large_one():
    kb = 1024
    prof = profile([(16 * kb, 0.01), (67 * MB, 0.02), (16 * kb, 0.03), (40 * kb, 0.04), (30 * kb, 0.05),
                    (2 * MB, 0.06), (8 * kb, 0.07)])
    assert group_by_threshold(prof, 64 * kb) == [(0,), (1,), (2, 3, 4), (5,), (6,)]
    assert group_by_threshold(prof, 0) == [(i,) for i in range(7)]
    assert group_by_threshold(prof, 16 * MB) == [(0,), (1,), (2, 3, 4, 5, 6)]


def test_the_decision_is_a_pure_function_of_the_profile():
    prof = synthetic_profile(120, bytes_per_s=30e6)
    again = Profile.from_json(prof.to_json())
    a, b = decide(prof, sorted(prof.codecs)), decide(again, sorted(again.codecs))
    assert (a.groups, a.options, a.predicted_s) == (b.groups, b.options, b.predicted_s)


def test_unknown_or_no_options_are_refused():
    prof = synthetic_profile(10)
    with pytest.raises(ValueError, match=r"options \['gzip'\] have no measured costs"):
        decide(prof, ["none", "gzip"])
    with pytest.raises(ValueError, match="at least one option"):
        decide(prof, [])


def test_fits():
    assert fit_linear([(0, 1.0), (10, 3.0), (20, 5.0)]) == LinearCost(1.0, 0.2)
    m = 2e-4
    link = fit_link([(b, m + 2 * 1e-4 + 2 * 2 * b / 1e8) for b in (1e5, 1e6, 4e6)], workers=2, server_add=ZERO,
                    message_s=m)
    assert link.alpha_s == pytest.approx(1e-4) and link.bytes_per_s == pytest.approx(1e8)
    assert fit_message([(1, 1e-3 + m), (8, 1e-3 + 8 * m), (32, 1e-3 + 32 * m)]) == pytest.approx(m)
    # the probe's batches stay within the credit (past it, pushes wait for acknowledgements)
    assert probe_batches(8) == (1, 4, 8) and probe_batches(32) == (1, 16, 32)
    assert probe_batches(1) == (1, 2) and probe_batches(3) == (1, 2, 3)
    # a link too fast for the probe sizes (flat, noisy times): the rate is bounded from below
    flat = fit_link([(65536, 2.3e-3), (524288, 2.2e-3), (2097152, 2.1e-3)], workers=2, server_add=ZERO)
    assert flat.bytes_per_s == pytest.approx(2 * 2 * 2097152 / 2.1e-3) and flat.alpha_s == pytest.approx(1.05e-3)
    with pytest.raises(ProfileError, match="need two or more"):
        fit_link([(65536, 1e-3)], workers=2, server_add=ZERO)


@pytest.mark.parametrize("text,match", [
    ("not json", "not a gradpress profile"),
    ("[]", "expected a JSON object"),
    ('{"version": 99}', "profile version 99"),
    ('{"version": 1, "workers": 2}', "not a gradpress profile.*KeyError"),
])
def test_a_corrupt_profile_is_named(text, match):
    with pytest.raises(ProfileError, match=match):
        Profile.from_json(text, "plan file x.json")


def test_profile_checks_its_values():
    good = json.loads(synthetic_profile(5).to_json())
    good["link"]["bytes_per_s"] = 0
    with pytest.raises(ProfileError, match="needs a positive rate"):
        Profile.from_json(json.dumps(good))
    good["link"]["bytes_per_s"] = -1
    with pytest.raises(ProfileError, match=r"link.bytes_per_s = -1.0: must be a finite number, at least 0"):
        Profile.from_json(json.dumps(good))


def _set(d: dict, path: str, value) -> dict:
    *head, last = path.split(".")
    for k in head:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[int(last) if isinstance(d, list) else last] = value


@pytest.mark.parametrize("path,value,match", [
    # a NaN time never lands: the simulation's loop ran for ever, in Numba, past Ctrl-C
    ("codecs.onebit.payload_ratio", float("nan"), r"plan file p.json: profile.codecs.onebit.payload_ratio = nan"),
    ("codecs.topk.compress.fixed_s", float("nan"), "profile.codecs.topk.compress.fixed_s = nan"),
    ("backward_end_s", float("inf"), "profile.backward_end_s = inf: must be a finite number"),
    ("step_s", -5.0, "profile.step_s = -5.0: must be a finite number, at least 0"),
    ("codecs.none.add.per_byte_s", -1e-9, "per_byte_s = -1e-09"),
    ("codecs.none.add.fixed_s", -5, "fixed_s = -5.0"),  # (a JSON int)
    ("link.bytes_per_s", float("inf"), "link.bytes_per_s = inf"),
    ("tensors.0.nbytes", 1.7, r"not a gradpress profile \(ValueError: 1.7 is not a whole number"),
    ("tensors.0.nbytes", 6, "a multiple of 4"),
    ("workers", True, "True is not a whole number"),
    ("servers", 10 ** 9, "at most 65536"),
    ("engine_threads", 10 ** 9, "at most 65536"),
    ("partition_bytes", 1, "more than 4194304 partitions"),
])
def test_a_profile_with_a_number_no_job_can_have_is_refused_naming_it(path, value, match):
    d = json.loads(synthetic_profile(40).to_json())
    _set(d, path, value)
    with pytest.raises(ProfileError, match=match):
        Profile.from_json(json.dumps(d), "plan file p.json")


def test_a_plan_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ProfileError, match=r"p.json: not a text file \(invalid start byte at byte 0\)"):
        Profile.load(path)


def test_rates_are_bits_but_a_capital_b_is_bytes():
    from gradpress.planner.cli import rate_bytes_per_s
    assert rate_bytes_per_s("10gbit") == rate_bytes_per_s("10Gbps") == rate_bytes_per_s("10g") == 1.25e9
    assert rate_bytes_per_s("1.25GB") == rate_bytes_per_s("1.25GBps") == 1.25e9  # (read as bits before: 8x too slow)
    assert rate_bytes_per_s("100mbit") == rate_bytes_per_s("100MBIT") == 12.5e6
    for bad in ("abc", "0gbit", "10 Tbit", "-1gbit"):
        with pytest.raises(Exception, match="is not a rate"):
            rate_bytes_per_s(bad)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "gradpress.planner.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.integ  # starts processes
def test_gradpress_plan_prints_the_plan_and_projects_it(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(synthetic_profile(40, bytes_per_s=12.5e6).to_json())
    out = run_cli(str(path))
    assert out.returncode == 0, out.stderr
    assert "predicted iteration:" in out.stdout and "t39" in out.stdout
    out = run_cli(str(path), "--sweep-workers", "8,64", "--sweep-bandwidth", "1gbit,100gbit", "--json")
    rows = json.loads(out.stdout)
    assert [(r["workers"], r["gbit_per_s"]) for r in rows] == [(8, 1), (64, 1), (8, 100), (64, 100)]
    assert rows[2]["predicted_s"] <= rows[0]["predicted_s"]  # a faster link is never slower


@pytest.mark.integ  # starts processes
def test_gradpress_plan_refuses_a_corrupt_file(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("{ truncated")
    out = run_cli(str(path))
    assert out.returncode == 2 and "not a gradpress profile" in out.stderr
    out = run_cli(str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "No such file" in out.stderr
    good = tmp_path / "good.json"
    good.write_text(synthetic_profile(5).to_json())
    out = run_cli(str(good), "--sweep-bandwidth", "abc")  # a usage error, as --bandwidth abc (a traceback before)
    assert out.returncode == 2 and "argument --sweep-bandwidth: 'abc' is not a rate" in out.stderr, out.stderr


# ---- low-rank options (planner/low_rank.py) -------------------------------------------------

# ACP-SGD at rank 1: factor work 16 GB/s of matrix, reconstruction 50 GB/s, one round per step
ACP = CodecCost(LinearCost(0.0, 6e-11), LinearCost(0.0, 2e-11), LinearCost(0.0, 2e-10), 0.0, rank=1, rounds=1,
                min_rate=2.0)


def matrices_profile(rate, rows=1024, cols=1024, n=4):
    """n rows x cols matrices with a small bias after each, ready over 100 ms of backward."""
    tensors = []
    for i in range(n):
        tensors.append(TensorProfile(f"w{i}", 4 * rows * cols, 0.1 * (i + 1) / n, -2 * i, rows))
        tensors.append(TensorProfile(f"b{i}", 4 * rows, 0.1 * (i + 1) / n, -2 * i - 1))
    return Profile(2, 1, tuple(tensors), 0.1, 0.01, {"none": RAW, "acpsgd": ACP}, Link(1e-4, rate), 0.0,
                   partition_bytes=4 * MB)


def test_matrices_travel_as_factors_where_the_link_is_slow():
    plan = decide(matrices_profile(12.5e6), ["none", "acpsgd"])
    assert plan.low_rank_option == "acpsgd"
    assert [plan_name for plan_name in (matrices_profile(12.5e6).tensors[i].name for i in plan.low_rank)] == \
        ["w0", "w1", "w2", "w3"]
    # every other tensor is in exactly one group; the factors are in none
    assert sorted(i for g in plan.groups for i in g) == [1, 3, 5, 7]
    # 16 MB raw over 12.5 MB/s takes seconds; the factors (4 x 4 KB) and their work take milliseconds
    assert plan.predicted_s < 0.2
    text = plan.table(matrices_profile(12.5e6))
    assert "w0" in text and "acpsgd" in text and "4 matrices as factors" in text


def test_no_factors_where_the_link_is_fast_or_the_matrices_small():
    # a 10 GB/s link: the last matrix's raw sum lands about 3.5 ms after backward; factoring the
    # matrices at 1 GB/s would add 16 ms of work after backward
    fast = matrices_profile(10e9)
    slow_factors = CodecCost(LinearCost(0.0, 1e-9), ACP.decompress, ACP.add, 0.0, rank=1, rounds=1, min_rate=2.0)
    fast = Profile(fast.workers, fast.servers, fast.tensors, fast.backward_end_s, fast.step_s,
                   {"none": RAW, "acpsgd": slow_factors}, fast.link, partition_bytes=4 * MB)
    assert decide(fast, ["none", "acpsgd"]).low_rank == ()
    # ... while at 16 GB/s it is cheaper than the last sum (the servers' too), even there
    assert decide(matrices_profile(10e9), ["none", "acpsgd"]).low_rank == (0, 2, 4, 6)
    # 2 x 3 matrices are not worth factoring (rate 2 needs rows * cols >= 2 r (rows + cols))
    plan = decide(matrices_profile(12.5e6, rows=2, cols=3), ["none", "acpsgd"], min_compress_bytes=0)
    assert plan.low_rank == () and plan.low_rank_option is None


def test_the_factor_prediction_by_hand():
    # one 1024 x 1024 matrix ready at 0.1 s on a 12.5 MB/s link, 2 workers, one server
    prof = Profile(2, 1, (TensorProfile("w", 4 * MB, 0.1, 0, 1024),), 0.1, 0.01, {"none": RAW, "acpsgd": ACP},
                   Link(1e-4, 12.5e6), 0.0, partition_bytes=4 * MB)
    plan = decide(prof, ["acpsgd"])
    assert plan.low_rank == (0,) and plan.groups == ()
    factors = 4 * 1 * (1024 + 1024) / 2            # ACP-SGD sends P or Q: 4 KB
    ready = 0.1 + 6e-11 * 4 * MB                     # after backward, the factor work
    arrive = ready + 2 * factors / 12.5e6 + 1e-4     # both workers' pushes up the server's link
    land = arrive + 2 * 2e-10 * factors + 2 * factors / 12.5e6 + 1e-4
    want = land + 1e-10 * factors + 0.01 + 2e-11 * 4 * MB   # copy out, step, reconstruction
    assert plan.predicted_s == pytest.approx(want, rel=1e-9)


def test_factor_costs_re_based_on_what_the_job_measured():
    from gradpress.planner import low_rank
    prof = Profile(2, 1, (TensorProfile("w", 4 * MB, 0.1, 0, 1024),), 0.1, 0.01, {"none": RAW, "acpsgd": ACP},
                   Link(1e-4, 12.5e6), 0.0, partition_bytes=4 * MB)
    plan = decide(prof, ["acpsgd"])
    # calibrated: 0.25 ms of factor work and 0.08 ms of reconstruction; the job measured 3x and 2x that
    work, rebuild = 6e-11 * 4 * MB, 2e-11 * 4 * MB
    rebased = low_rank.measured(prof, "acpsgd", plan.low_rank, 3 * work, 2 * rebuild)
    cost = rebased.codecs["acpsgd"]
    assert cost.compress(4 * MB) == pytest.approx(3 * work) and cost.decompress(4 * MB) == pytest.approx(2 * rebuild)
    assert predict(*plan.simulated(rebased)) == pytest.approx(plan.predicted_s + 2 * work + rebuild, rel=1e-9)
    assert rebased.notes["factor_work_measured_s"] == 3 * work
    assert Profile.from_json(rebased.to_json()).codecs["acpsgd"] == cost  # it travels in the broadcast profile
    # nothing measured (no compressed step yet): the calibration stands
    assert low_rank.measured(prof, "acpsgd", plan.low_rank, 0.0, 0.0) is prof


def test_low_rank_options_of_auto_are_checked():
    from gradpress.compressors import auto
    from gradpress.optim.momentum_codecs import momentum_codec_problem
    assert auto.low_rank(auto.options({"compressor": "auto", "allowed": ["onebit", "acpsgd"]}))[0] == "acpsgd"
    assert auto.low_rank(auto.options({"compressor": "auto"})) is None, "low-rank is not a default option"
    for allowed, match in ((["acpsgd", "powersgd"], "second low-rank codec"),
                           ([{"compressor": "acpsgd", "start_step": 5}], "start_step 5"),
                           ([{"compressor": "powersgd", "rank": 0}], r"\['rank'\] = 0"),
                           ([{"compressor": "acpsgd", "ef": "vanilla"}], "unknown compression_params")):
        with pytest.raises(ValueError, match=match):
            auto.options({"compressor": "auto", "allowed": allowed})
    with pytest.raises(ValueError, match="at most one low-rank option"):
        decide(Profile(1, 1, (TensorProfile("w", 4 * MB, 0.1, 0, 1024),), 0.1, 0.0,
                       {"none": RAW, "a": ACP, "b": ACP}, Link(0.0, 1e8)), ["a", "b"])
    problem = momentum_codec_problem({"compressor": "auto", "allowed": ["onebit", "acpsgd"]})
    assert problem and "does not take low-rank options" in problem


def test_a_profile_with_matrices_and_low_rank_costs_round_trips():
    prof = matrices_profile(12.5e6)
    back = Profile.from_json(prof.to_json())
    assert back == prof and back.tensors[0].rows == 1024 and back.codecs["acpsgd"].rank == 1
    with pytest.raises(ProfileError, match="rows must divide"):
        Profile(1, 1, (TensorProfile("w", 40, 0.1, 0, 3),), 0.1, 0.0, {"none": RAW}, Link(0.0, 1e8))


# ---- a host whose CPUs workers and servers share ----------------------------------------

def test_a_shared_host_bounds_the_iteration_by_its_cpu_work():
    # 2 workers and 2 servers on 2 cores; each worker trains for 0.15 CPU s per iteration
    c, d, add = 1e-9, 0.5e-9, 0.25e-9   # compress, decompress, server add: s per byte
    codec = CodecCost(LinearCost(0, c), LinearCost(0, d), LinearCost(0, add), 1 / 32)
    b, m = 4 * MB, 1e-4
    free = profile([(b, 0.1)], workers=2, servers=2, rate=10e9, alpha=0.0, message=m,
                   codecs={"none": RAW, "onebit": codec})
    timeline = predict(free, [(0,)], ["onebit"])
    shared = replace(free, host=HostShare(cores=2.0, workers=2, servers=2, train_cpu_s=0.15))
    comm = c * b + d * b + m                    # one worker's communication thread
    served = 2 * add * b + c * b + 2 * m        # the one server that sums it: both pushes, recompress,
    #                                             and a message per worker
    want = (2 * (0.15 + comm) + 2 * served / 2) / 2.0
    assert want > timeline
    assert predict(shared, [(0,)], ["onebit"]) == pytest.approx(want, rel=1e-12)
    # on a host of its own (no server, 8 cores) the worker's CPU bounds nothing here
    alone = replace(free, host=HostShare(cores=8.0, workers=1, servers=0, train_cpu_s=0.15))
    assert predict(alone, [(0,)], ["onebit"]) == pytest.approx(timeline, rel=1e-12)


def test_the_bytes_on_the_wire_cost_the_shared_host_its_sockets_cpu():
    # as above, with each byte sent or received costing its node's sockets w CPU s
    c, d, add, w = 1e-9, 0.5e-9, 0.25e-9, 2e-9
    codec = CodecCost(LinearCost(0, c), LinearCost(0, d), LinearCost(0, add), 1 / 32)
    b, m = 4 * MB, 1e-4
    free = profile([(b, 0.1)], workers=2, servers=2, rate=10e9, alpha=0.0, message=m,
                   codecs={"none": RAW, "onebit": codec})
    shared = replace(free, host=HostShare(cores=2.0, workers=2, servers=2, train_cpu_s=0.15, wire_s_per_byte=w))
    comm, served = c * b + d * b + m, 2 * add * b + c * b + 2 * m
    pushed = b / 32                             # one worker's payload, pushed and pulled back
    sockets = w * (2 * 2 * pushed + 2 * 2 * pushed)  # 2 workers move 2x theirs; the server 2x both
    want = (2 * (0.15 + comm) + served + sockets) / 2.0
    assert predict(shared, [(0,)], ["onebit"]) == pytest.approx(want, rel=1e-12)
    # raw: 32x the bytes through the sockets, which here makes it slower than onebit's CPU
    raw = (2 * (0.15 + 1e-10 * b + m) + 2 * 2e-10 * b + 2 * m + 32 * sockets) / 2.0  # RAW's copy and sum
    assert predict(shared, [(0,)], ["none"]) == pytest.approx(raw, rel=1e-12)
    assert decide(shared, ["none", "onebit"]).options == ("onebit",)
    cheap_wire = replace(shared, host=replace(shared.host, wire_s_per_byte=0.0))
    assert decide(cheap_wire, ["none", "onebit"]).options == ("none",)


def test_on_a_shared_host_the_planner_prefers_the_codec_that_costs_less_cpu():
    # "heavy" sends half of "light"'s bytes for 4x its compression CPU: on a slow link of
    # its own, the iteration is the wire's and heavy wins; where two workers and two servers
    # share 2 cores and training takes most of them, CPU sets the iteration and light wins
    light = CodecCost(LinearCost(0, 1 / 4e9), LinearCost(0, 1 / 8e9), LinearCost(0, 1 / 8e9), 1 / 32)
    heavy = replace(light, compress=LinearCost(0, 1 / 1e9), payload_ratio=1 / 64)
    tensors = [(16 * MB, 0.02 * (i + 1)) for i in range(4)]
    base = profile(tensors, workers=2, servers=2, rate=12.5e6, backward=0.1,
                   codecs={"none": RAW, "light": light, "heavy": heavy})
    assert set(decide(base, ["heavy", "light"]).options) == {"heavy"}
    shared = replace(base, host=HostShare(cores=2.0, workers=2, servers=2, train_cpu_s=0.5))
    plan = decide(shared, ["heavy", "light"])
    assert set(plan.options) == {"light"}, plan.options
    assert plan.predicted_s < predict(shared, list(plan.groups), ["heavy"] * len(plan.groups))


def test_a_host_share_round_trips_scales_and_is_checked():
    prof = replace(synthetic_profile(5), host=HostShare(2.0, 2, 2, 0.3))
    assert Profile.from_json(prof.to_json()) == prof
    # a projection shares each host as rank 0's was, never with more nodes than the job has
    assert prof.scaled(workers=64, servers=8).host == HostShare(2.0, 2, 2, 0.3)
    assert prof.scaled(workers=1, servers=1).host == HostShare(2.0, 1, 1, 0.3)
    assert Profile.from_json(synthetic_profile(5).to_json()).host is None  # older profiles: no bound
    wired = replace(prof, host=HostShare(2.0, 2, 2, 0.3, 1e-9))
    assert Profile.from_json(wired.to_json()) == wired
    older = json.loads(wired.to_json())
    del older["host"]["wire_s_per_byte"]  # a profile saved before the sockets' cost was measured
    assert Profile.from_json(json.dumps(older)).host == HostShare(2.0, 2, 2, 0.3, 0.0)
    for field, value, why in (("cores", 0, "cores > 0"), ("workers", 3, "1 to 2 workers"),
                              ("train_cpu_s", -1, "host.train_cpu_s = -1.0: must be a finite number, at least 0"),
                              ("wire_s_per_byte", -1e-9, "host.wire_s_per_byte = -1e-09")):
        bad = json.loads(prof.to_json())
        bad["host"][field] = value
        with pytest.raises(ProfileError, match=why):
            Profile.from_json(json.dumps(bad))


def test_a_plans_training_cpu_is_the_median_of_its_steps():
    # (training, sockets) CPU marks at step ends: steps of 0.16, 0.21 (a slow one after a
    # switch) and 0.16 CPU s give 0.16, where their mean would be 0.177
    from gradpress.pipeline.planning.clock import train_cpu_s
    assert train_cpu_s([(1.0, 0.0), (1.16, 0.0), (1.37, 0.0), (1.53, 0.0)]) == pytest.approx(0.16)
    assert train_cpu_s([(1.0, 0.0)]) == 0.0


def test_the_trial_keeps_the_fastest_measured_and_lets_the_model_part_plans_within_its_noise():
    from gradpress.planner.decide import Plan
    from gradpress.pipeline.planning import PlanTuning
    from gradpress.pipeline.planning.profiling import choose as choose_within
    TRIAL_NOISE = PlanTuning().trial_noise

    def choose(trials):
        return choose_within(trials, TRIAL_NOISE)
    light = CodecCost(LinearCost(0, 1 / 4e9), LinearCost(0, 1 / 8e9), LinearCost(0, 1 / 8e9), 1 / 32)
    heavy = replace(light, compress=LinearCost(0, 1 / 1e9))
    base = profile([(16 * MB, 0.05 * (i + 1)) for i in range(4)], workers=2, servers=2, rate=1e9, backward=0.2,
                   codecs={"none": RAW, "light": light, "heavy": heavy})
    groups = tuple((i,) for i in range(4))
    plans = [Plan(groups, (o,) * 4, 0.0, 0.0) for o in ("heavy", "light")]

    def trial(train_cpu_s, measured):  # each plan re-based on its own steps: its own training CPU
        return [(p, replace(base, host=HostShare(2.0, 2, 2, t)), m) for p, t, m in zip(plans, train_cpu_s, measured)]
    # heavy measured faster, but within the noise: the model (heavy costs the host more) decides
    kept, modelled = choose(trial([0.5, 0.5], [0.600, 0.600 * (1 + TRIAL_NOISE / 2)]))
    assert kept == 1 and modelled[1] < modelled[0]
    # beyond the noise, the measurement decides whatever the model says
    assert choose(trial([0.5, 0.5], [0.600, 0.600 * (1 + 2 * TRIAL_NOISE)]))[0] == 0
    # the model runs both on one training CPU (their median): heavy's steps measuring less
    # training CPU does not make it modelled faster
    kept, modelled = choose(trial([0.3, 0.7], [0.600, 0.610]))
    assert kept == 1 and modelled[1] < modelled[0]
    # no host shared: the timeline alone, still within the noise
    alone = [(p, base, m) for p, m in zip(plans, [0.600, 0.605])]
    kept, modelled = choose(alone)
    assert modelled[1] < modelled[0] and kept == 1


def test_one_tensor_by_hand_with_local_reduction():
    """4 workers of one machine reducing locally: a worker owns one partition in 4, summing 3
    peers' parts for it and copying its own part into a segment for the other 3 (the mean of
    that mix on its communication thread); the server sums one push per machine and sends one
    copy back."""
    b, rate, alpha = MB, 100e6, 1e-4
    prof = replace(profile([(b, 0.1)], workers=4, rate=rate, alpha=alpha), local_size=4)
    local = (3 * 2e-10 * b + 3 * 1e-10 * b) / 4        # sums of the owned part, copies of the others
    arrive = 0.1 + local + b / rate + alpha
    done = arrive + 1 * 2e-10 * b                       # one push per machine
    land = done + 1 * b / rate + alpha
    want = land + 1e-10 * b + 0.01
    assert predict(prof, [(0,)], ["none"]) == pytest.approx(want, rel=1e-12)
    flat = profile([(b, 0.1)], workers=4, rate=rate, alpha=alpha)
    assert predict(flat, [(0,)], ["none"]) > want   # four pushes through the server's link


def test_a_profile_keeps_its_local_size_and_refuses_one_that_does_not_divide_the_workers():
    prof = replace(profile([(MB, 0.1)], workers=4), local_size=2)
    again = Profile.from_json(prof.to_json())
    assert again.local_size == 2 and again.pushers == 2
    assert prof.scaled(workers=8).local_size == 2 and prof.scaled(workers=6).local_size == 2
    assert prof.scaled(workers=3).local_size == 1
    old = json.loads(prof.to_json())
    del old["local_size"]                              # a profile written before local reduction
    assert Profile.from_json(json.dumps(old)).local_size == 1
    with pytest.raises(ProfileError, match="local_size 3"):
        replace(prof, local_size=3)


def test_the_profiled_steps_as_a_plan_keep_their_fused_groups():
    """``profiling.profiled_plan``: what the profiled steps sent, uncompressed: the groups the
    pipeline fused (members in ready order, wherever they lie) and every other tensor apart;
    a group with a member the profile left out (row-sparse) is not one."""
    from gradpress.pipeline.planning.profiling import profiled_plan
    prof = replace(profile([(MB, 0.01), (4096, 0.02), (MB, 0.03), (4096, 0.04), (256, 0.05)]),
                   notes={"profiled_s": 0.2})
    plan, _, measured = profiled_plan(prof, {"none": {}, "onebit": {}}, [("t3", "t1"), ("t4", "gone")])
    assert plan.groups == ((0,), (1, 3), (2,), (4,)) and plan.options == ("none",) * 4 and measured == 0.2
    assert plan.predicted_s == pytest.approx(predict(prof, list(plan.groups), list(plan.options)))
    assert profiled_plan(prof, {"onebit": {}}, []) is None  # the user asked for codecs only


def test_a_gpu_workers_cost_per_partition_is_fitted_to_the_profiled_steps_and_then_plans_fewer_partitions():
    """``profiling.message_fitted``: on a GPU worker the probe's message cost (tiny host
    push_pulls) misses what each partition of a CUDA tensor costs; the model is fitted to the
    profiled steps (every tensor raw, apart) by raising it. Here the steps took what a cost of
    300 us a partition gives where the probe said 20 us: the fit finds 300 us, and the decision
    then fuses the halves into fewer groups, which the true cost puts faster than the plan
    decided on the probe's. Never lowered, and a host's profile is left as it is."""
    from gradpress.pipeline.planning.profiling import message_fitted, profiled_plan
    halves = CodecCost(LinearCost(1e-5, 2.5e-11), LinearCost(2e-5, 5e-11), LinearCost(0.0, 1e-10), 0.5,
                       server_compress=LinearCost(0.0, 5e-11))
    codecs = {"none": CodecCost(LinearCost(1e-5, 5e-11), LinearCost(2e-5, 1e-10), LinearCost(0.0, 2e-10), 1.0),
              "fp16_raw": halves}
    probed = replace(profile([(MB // 4, 0.05 + 1e-4 * i) for i in range(40)], workers=2, servers=2, rate=5e9,
                             backward=0.054, codecs=codecs, message=20e-6), device="cuda", notes={"profiled_s": 1.0})
    true = replace(probed, message_s=300e-6)
    raw_apart, _, _ = profiled_plan(probed, {"none": {}})
    took = predict(*raw_apart.simulated(true))
    assert took > 1.1 * predict(*raw_apart.simulated(probed)), "the case must be one the message cost decides"
    probed = replace(probed, notes={"profiled_s": took})
    fitted = message_fitted(probed)
    assert fitted.message_s == pytest.approx(300e-6, rel=1e-6) and fitted.notes["message_s_probed"] == 20e-6
    assert predict(*raw_apart.simulated(fitted)) == pytest.approx(took, rel=1e-6)
    on_probe, on_fit = decide(probed, ["fp16_raw", "none"], 0), decide(fitted, ["fp16_raw", "none"], 0)
    assert len(on_fit.groups) < len(on_probe.groups) == 40
    assert predict(*on_fit.simulated(true)) < 0.95 * predict(*on_probe.simulated(true))
    assert message_fitted(replace(probed, notes={"profiled_s": 0.5 * took})) == replace(
        probed, notes={"profiled_s": 0.5 * took}), "lowered"
    assert message_fitted(replace(probed, device="cpu")).message_s == 20e-6
    assert message_fitted(replace(probed, notes={})).message_s == 20e-6  # nothing measured


def test_partitions_are_cut_at_the_bytes_each_option_sends():
    """The worker cuts a tensor into partitions of ``partition_bytes`` of what goes on the
    wire: a codec's float32 (it widens half precision), the raw path's own dtype,
    ``fp16_raw``'s float16. Where a message is the only cost, the step counts them."""
    m = 1e-3
    zero = CodecCost(ZERO, ZERO, ZERO, 1.0)
    codecs = {"none": zero, "onebit": replace(zero, payload_ratio=1 / 32),
              "fp16_raw": replace(zero, payload_ratio=0.5, uncompressed=True)}

    def made(tensors, costs=codecs, **kw):
        prof = profile([(b, 0.1) for b, _ in tensors], codecs=costs, credit=64, message=m, **kw)
        return replace(prof, tensors=tuple(replace(t, itemsize=size) for t, (_, size) in zip(prof.tensors, tensors)))

    def partitions(tensors, groups, options):
        # every partition ready at 0.1 s, the link and the codecs free: a message each
        return (predict(made(tensors, rate=1e18, alpha=0.0), groups, options) - 0.1 - 0.01) / m

    for size, raw in ((4, 4), (2, 2), (8, 8)):    # float32, float16, float64 (16 MB as float32)
        assert partitions([(16 * MB, size)], [(0,)], ["none"]) == pytest.approx(raw, abs=1e-6), size
        assert partitions([(16 * MB, size)], [(0,)], ["onebit"]) == pytest.approx(4, abs=1e-6), size
        assert partitions([(16 * MB, size)], [(0,)], ["fp16_raw"]) == pytest.approx(2, abs=1e-6), size
    assert partitions([(20 * MB, 4)], [(0,)], ["fp16_raw"]) == pytest.approx(3, abs=1e-6)  # 4, 4, 2 MB of halves
    assert partitions([(16 * MB, 4), (6 * MB, 4)], [(0,), (1,)], ["fp16_raw", "none"]) == pytest.approx(4, abs=1e-6)
    assert partitions([(16 * MB, 4), (6 * MB, 4)], [(0, 1)], ["fp16_raw"]) == pytest.approx(3, abs=1e-6)
    assert partitions([(16 * MB, 2), (4 * MB, 4)], [(0, 1)], ["none"]) == pytest.approx(5, abs=1e-6)  # as float32
    # with real costs on a GPU, two workers and two servers: a float16 tensor raw is a float32
    # one of half the bytes, partition for partition
    costly = {"none": CodecCost(LinearCost(1e-5, 5e-11), LinearCost(2e-5, 1e-10), LinearCost(0.0, 2e-10), 1.0)}
    half, as_float32 = (replace(made([(b, size)], costly, workers=2, servers=2), device="cuda")
                        for b, size in ((16 * MB, 2), (8 * MB, 4)))
    assert predict(half, [(0,)], ["none"]) == pytest.approx(predict(as_float32, [(0,)], ["none"]), rel=1e-12)


def test_a_half_precision_tensor_goes_raw_at_its_own_bytes_and_through_a_codec_as_float32():
    """A float16 or bfloat16 gradient (``itemsize`` 2) travels raw at 2 bytes an element, so
    the model sends it as a float32 tensor of half the bytes; a codec widens it on the device,
    so there it costs what a float32 one does; a group whose members' dtypes differ travels
    in float32 (``routes/bucket.py``). On a host and on a GPU."""
    codecs = {"none": CodecCost(LinearCost(1e-5, 5e-11), LinearCost(2e-5, 1e-10), LinearCost(0.0, 2e-10), 1.0),
              "onebit": CodecCost(LinearCost(1e-4, 1e-10), LinearCost(1e-4, 1e-10), LinearCost(0.0, 1e-10), 1 / 32)}
    for device in ("cpu", "cuda"):
        def made(tensors):
            prof = replace(profile([(MB, 0.05), (MB, 0.1)], workers=2, codecs=codecs), device=device)
            return replace(prof, tensors=tuple(replace(t, nbytes=b, itemsize=size)
                                               for t, (b, size) in zip(prof.tensors, tensors)))
        half, as_float32 = made([(MB, 2), (MB, 2)]), made([(MB // 2, 4), (MB // 2, 4)])
        for groups in ([(0,), (1,)], [(0, 1)]):
            raw = ["none"] * len(groups)
            assert predict(half, groups, raw) == pytest.approx(predict(as_float32, groups, raw), rel=1e-12)
        full = made([(MB, 4), (MB, 4)])
        assert predict(half, [(0,), (1,)], ["onebit"] * 2) == predict(full, [(0,), (1,)], ["onebit"] * 2)
        mixed = made([(MB, 2), (MB, 4)])
        assert predict(mixed, [(0, 1)], ["none"]) == predict(full, [(0, 1)], ["none"])
        assert predict(half, [(0,), (1,)], ["none"] * 2) < predict(full, [(0,), (1,)], ["none"] * 2)
    assert Profile.from_json(half.to_json()).tensors[0].itemsize == 2
    old = json.loads(full.to_json())
    for t in old["tensors"]:
        del t["itemsize"]                                # a profile written before half precision
    assert Profile.from_json(json.dumps(old)).tensors[0].itemsize == 4
    with pytest.raises(ProfileError, match="itemsize 3"):
        replace(full, tensors=(replace(full.tensors[0], itemsize=3),))


def test_a_change_in_how_the_gpu_times_the_codecs_measures_them_again():
    """The calibration's cache is keyed by the source of the codecs and of what times them,
    the GPU's timing included."""
    from gradpress.planner import calibrate
    names = {(p.parent.name, p.name) for p in calibrate.measured_sources()}
    assert {("planning", "gpu_costs.py"), ("planner", "calibrate.py"), ("compressors", "onebit.py"),
            ("cuda", "onebit.py")} <= names
    assert all(p.is_file() for p in calibrate.measured_sources())


@pytest.mark.parametrize("method, rounds", [("powersgd", 2), ("acpsgd", 1)])
def test_a_gpu_workers_low_rank_option_is_timed_as_torch_ops_on_its_device(monkeypatch, method, rounds):
    """A GPU worker's reducer runs the factor steps as torch ops (``TorchMath``), not the
    host's Numba kernels: the calibration times those, on the worker's device, each finished
    there. Here on the host's torch, with the device's wait a no-op."""
    import torch

    from gradpress.compressors.lowrank import LowRankParams
    from gradpress.pipeline.planning import gpu_costs
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    cost = gpu_costs.measure_on_device({"compressor": method, "rank": 2}, torch.device("cpu"))
    assert waits and set(waits) == {torch.device("cpu")}
    assert cost.rank == 2 and cost.rounds == rounds and cost.payload_ratio == 0.0
    assert cost.compress(4 << 20) > 0 and cost.decompress(4 << 20) > 0   # (fitted lines: noise may flatten one)
    assert cost.min_rate == LowRankParams.parse({"compressor": method}).min_compression_rate


def test_without_none_allowed_the_greedy_search_still_tries_a_compressed_group_hidden_behind_backward():
    # docs/planner.md, "The decision": only an *uncompressed* group landing before backward
    # ends is passed over. The search passed over a group on the option that sends the most,
    # onebit here, so this plan stayed 0.2% slower than topk for the 9 MB tensor
    def cost(a, b):
        return LinearCost(a, b)
    codecs = {"none": CodecCost(cost(0, 0), cost(3.2e-6, 1.08e-10), cost(6.2e-6, 1.29e-10), 1.0),
              "onebit": CodecCost(cost(9.43e-5, 1.02e-10), cost(5.58e-5, 4.33e-11), cost(6.7e-5, 2.19e-10), 1 / 32),
              "topk": CodecCost(cost(1.40e-5, 9.32e-10), cost(6.61e-5, 2.37e-10), cost(9.44e-5, 1.78e-10), 0.02)}
    tensors = (TensorProfile("t0", 70000, 0.003524, 0), TensorProfile("t1", 9437184, 0.003648, -1),
               TensorProfile("t2", 40000, 0.004295, -2))
    profile = Profile(1, 1, tensors, 0.004738, 0.002170, codecs, Link(1.266e-4, 1.25e9), 2.017e-4, credit=1)
    plan = decide(profile, ["onebit", "topk"])
    for g in range(len(plan.groups)):  # no other option for any one group does better
        if sum(tensors[i].nbytes for i in plan.groups[g]) < 65536:
            continue
        for other in ("onebit", "topk"):
            options = list(plan.options)
            options[g] = other
            assert predict(profile, list(plan.groups), options) >= plan.predicted_s - 1e-12, (plan.summary(), g, other)
