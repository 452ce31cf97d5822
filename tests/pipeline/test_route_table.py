"""Which route each parameter takes (gradpress/pipeline/pipeline.py), decided once when a
pipeline is built, for the settings of each front end: none, fp16, a codec, rules,
row-sparse, low-rank and auto; and the moves allowed at a step boundary."""
import zlib

import pytest
import torch

from fake_comm import FakeComm
from gradpress.compressors.policy import CompressionPolicy
from gradpress.pipeline import GradientPipeline, ParameterTable
from gradpress.pipeline.routes.planned import PlannedRoute
from gradpress.torch.compression import Compression

ONEBIT = {"compressor": "onebit", "scaling": True, "ef": "vanilla"}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 300), torch.nn.Linear(300, 4))


def routes(params=None, rules=None, min_bytes=4096, m_given=None, **kwargs):
    m = m_given if m_given is not None else model()
    table = ParameterTable(list(m.parameters()), list(m.named_parameters()),
                           CompressionPolicy(params, rules, min_bytes))
    pipe = GradientPipeline(table, comm=FakeComm(), **kwargs)
    return pipe, m, {name: pipe.route_of(p) for name, p in m.named_parameters()}


NAMES = ["0.weight", "1.weight", "1.bias", "2.weight", "2.bias"]


@pytest.mark.parametrize("params,rules,kwargs,want", [
    (None, None, {}, ["direct"] * 5),                                                   # none
    (None, None, {"compression": Compression.fp16}, ["direct"] * 5),                    # Compression.fp16
    (ONEBIT, None, {}, ["direct"] * 5),                                                 # a codec (small ones raw)
    (ONEBIT, [("0.*", {"compressor": "acpsgd"}), ("2.*", {"compressor": "acpsgd"})], {},  # rules: low-rank for two
     ["lowrank", "direct", "direct", "lowrank", "lowrank"]),
    ({"compressor": "powersgd"}, None, {}, ["lowrank"] * 5),                             # low-rank: every tensor
    ({"compressor": "auto"}, [("1.*", {"compressor": "none"})], {},                     # auto: direct until planned
     ["direct"] * 5),
    (None, None, {"bucket_bytes": 64 << 20}, ["bucket"] * 5),                           # DDP's buckets
    (None, None, {"bucket_bytes": 0}, ["direct"] * 5),                                  # bucket_cap_mb=0
])
def test_each_setting_gives_each_parameter_one_route(params, rules, kwargs, want):
    pipe, _, table = routes(params, rules, **kwargs)
    assert [table[n] for n in NAMES] == want, table


def test_specs_of_a_codec_follow_size_and_rules():
    pipe, m, _ = routes(ONEBIT, [("2.*", {"compressor": "none"})])
    spec = {n: pipe.table.spec[id(p)] for n, p in m.named_parameters()}
    assert spec["1.weight"] is not None and spec["1.bias"] is None and spec["2.weight"] is None


def test_the_planner_manages_the_auto_parameters_only():
    pipe, m, _ = routes({"compressor": "auto"}, [("1.*", {"compressor": "none"})])
    planned = {pipe.table.names[id(p)] for p in pipe.planner.params}
    assert planned == {"0.weight", "2.weight", "2.bias"}


def test_a_plan_moves_its_parameters_at_a_step_boundary_and_nothing_else_moves():
    pipe, m, before = routes({"compressor": "auto"})
    planned = pipe.planner.params
    route = PlannedRoute.__new__(PlannedRoute)   # (an empty route: only the table is under test)
    route.kind = "planned"
    pipe._install(route, planned[:2])
    after = {n: pipe.route_of(p) for n, p in m.named_parameters()}
    assert [after[pipe.table.names[id(p)]] for p in planned[:2]] == ["planned", "planned"]
    assert sum(v == "planned" for v in after.values()) == 2


def test_row_sparse_routes_move_at_the_step_boundary_or_with_a_sparse_tensor():
    pipe, m, _ = routes(sparse_density=0.5)
    emb, lin = m[0].weight, m[1].weight
    g_emb = torch.zeros(50, 8)
    g_emb[3] = 1.0                      # 1 row of 50: row-sparse
    grads = {id(p): torch.ones_like(p) for p in m.parameters()}
    grads[id(emb)] = g_emb
    for p in m.parameters():
        pipe.submit(p, grads[id(p)])
    assert pipe.route_of(emb) == "direct", "decided at the step's end, not during it"
    pipe.finish()
    assert pipe.route_of(emb) == "rows" and pipe.route_of(lin) == "direct"
    pipe2, m2, _ = routes()
    pipe2.submit(m2[0].weight, torch.zeros(50, 8).to_sparse(1))   # a sparse COO gradient: rows at once
    assert pipe2.route_of(m2[0].weight) == "rows"


def test_a_mostly_zero_rows_gradient_fused_compressed_stays_fused_and_the_log_says_what_it_costs(caplog):
    pipe, m, table = routes(ONEBIT, None, min_bytes=0, fuse_compressed=65536, sparse_density=0.5)
    emb = m[0].weight
    assert table["0.weight"] == "bucket", table
    grads = {id(p): torch.ones_like(p) for p in m.parameters()}
    grads[id(emb)] = torch.zeros(50, 8)
    grads[id(emb)][3] = 1.0              # 1 row of 50: row-sparse, were it on its own
    for p in m.parameters():
        pipe.submit(p, grads[id(p)])
    with caplog.at_level("WARNING", logger="gradpress.pipeline.pipeline"):
        pipe.finish()
    assert pipe.route_of(emb) == "bucket"
    assert "'0.weight' is mostly zero rows" in caplog.text and "'compressor': 'none'" in caplog.text, caplog.text


def test_a_sparse_tensor_in_a_bucket_is_refused_by_name():
    pipe, m, _ = routes(bucket_bytes=64 << 20)
    with pytest.raises(ValueError, match="'0.weight' has a sparse gradient, but it travels bucket"):
        pipe.submit(m[0].weight, torch.zeros(50, 8).to_sparse(1))


@pytest.mark.parametrize("params,rules,message", [
    ({"compressor": "acpsgd"}, [("2.*", {"compressor": "acpsgd", "rank": 2})], "same compression_params"),
    ({"compressor": "auto"}, [("2.*", {"compressor": "auto", "allowed": ["onebit"]})], "same compression_params"),
])
def test_low_rank_and_auto_parameters_share_one_spec(params, rules, message):
    with pytest.raises(ValueError, match=message):
        routes(params, rules)


@pytest.mark.parametrize("params", [{"compressor": "acpsgd"}, {"compressor": "auto"}])
def test_low_rank_and_auto_refuse_a_tensor_level_compression(params):
    with pytest.raises(ValueError, match="leave compression=Compression.none"):
        routes(params, compression=Compression.fp16)


@pytest.mark.parametrize("params,min_bytes,fuse_below,fused", [
    (None, 4096, 65536, ["2.bias", "1.bias"]),     # no codec: both biases, last first
    (ONEBIT, 4096, 65536, ["2.bias", "1.bias"]),   # a codec, but both under BYTEPS_MIN_COMPRESS_BYTES
    (ONEBIT, 0, 65536, []),                        # compressed one by one: not fused
    (None, 4096, 1000, []),                        # only 2.bias is small enough: a bucket of one is none
    (None, 4096, 0, []),                           # GRADPRESS_FUSE_BELOW_BYTES=0
])
def test_small_1d_tensors_that_travel_uncompressed_are_fused_in_backward_order(params, min_bytes, fuse_below, fused):
    pipe, m, table = routes(params, None, min_bytes=min_bytes, fuse_below=fuse_below)
    assert [n for n in NAMES if table[n] == "bucket"] == sorted(fused, key=NAMES.index)
    assert all(table[n] == "direct" for n in NAMES if n not in fused)  # matrices never: rows, codecs
    if fused:
        bucket = pipe._route[id(m[2].bias)]
        crc = f"{zlib.crc32(','.join(fused).encode()):08x}"  # named by its members
        assert bucket.spec is None and bucket.name == f"Gradient.small-fused.{crc}"
        assert [pipe.table.names[id(p)] for p in bucket.members] == fused


def test_two_pipelines_fuse_under_keys_of_their_own():
    """Two optimizers in one process (a model per dtype, a GAN's two) each fuse their small
    tensors: the buckets are named by their members, so their keys never meet."""
    names = []
    for prefix in ("gen.", "disc."):
        m = model()
        named = [(prefix + n, p) for n, p in m.named_parameters()]
        table = ParameterTable(list(m.parameters()), named, CompressionPolicy(None, None, 4096))
        pipe = GradientPipeline(table, comm=FakeComm(), fuse_below=65536)
        names.append(pipe._route[id(m[2].bias)].name)
    assert names[0] != names[1] and all(n.startswith("Gradient.small-fused.") for n in names), names


def test_fusion_stops_where_the_dtype_changes():
    m = model()
    m[1].bias.data = m[1].bias.data.half()
    table = ParameterTable(list(m.parameters()), list(m.named_parameters()), CompressionPolicy(None, None, 4096))
    pipe = GradientPipeline(table, comm=FakeComm(), fuse_below=65536)
    assert pipe.route_of(m[1].bias) == pipe.route_of(m[2].bias) == "direct"


def test_fusion_stops_where_the_device_changes_and_auto_and_low_rank_refuse_two_devices():
    """A model placed across GPUs in one process: a bucket's buffer lives on one device (meta
    stands in for a second one here), and the low-rank factors and the planner's groups would
    mix them: those say so, by name, when the pipeline is built."""
    m = model()
    m[1].bias = torch.nn.Parameter(m[1].bias.detach().to("meta"))
    table = ParameterTable(list(m.parameters()), list(m.named_parameters()), CompressionPolicy(None, None, 4096))
    pipe = GradientPipeline(table, comm=FakeComm(), fuse_below=65536)
    assert pipe.route_of(m[1].bias) == pipe.route_of(m[2].bias) == "direct"
    m[1].weight = torch.nn.Parameter(m[1].weight.detach().to("meta"))
    with pytest.raises(ValueError, match=r"'1.weight' is on meta, the tensors before it on cpu; low-rank"):
        routes({"compressor": "acpsgd"}, m_given=m)
    with pytest.raises(ValueError, match=r"'auto' plans one device's tensors; these are on \['cpu', 'meta'\]"):
        routes({"compressor": "auto"}, m_given=m)


TOPK = {"compressor": "topk", "k": 0.1, "ef": "vanilla"}


@pytest.mark.parametrize("rules,min_bytes,cap,fused", [
    (None, 4096, 65536, ["2.weight", "1.weight"]),  # the compressed ones, last first, past the raw 1.bias
    (None, 0, 65536, ["2.bias", "2.weight", "1.bias", "1.weight", "0.weight"]),  # every one compressed
    (None, 4096, 10000, []),                      # 9600 + 4800 bytes: over the cap, each alone
    (None, 4096, 9600, []),                       # 1.weight is not under the cap: 2.weight would be alone
    ([("2.*", TOPK)], 4096, 65536, []),           # another codec: not fused with onebit
    (None, 4096, 0, []),                          # GRADPRESS_FUSE_COMPRESSED_BYTES=0
])
def test_compressed_gradients_of_one_codec_are_fused_in_backward_order(rules, min_bytes, cap, fused):
    pipe, m, table = routes(ONEBIT, rules, min_bytes=min_bytes, fuse_below=65536, fuse_compressed=cap)
    coded = [n for n in NAMES if table[n] == "bucket" and pipe._route[id(dict(m.named_parameters())[n])].spec]
    assert coded == sorted(fused, key=NAMES.index), table
    if fused:
        bucket = pipe._route[id(m[1].weight)]
        crc = f"{zlib.crc32(','.join(fused).encode()):08x}"  # named by its members
        assert bucket.name == f"Gradient.fused.{crc}" and bucket.spec.codec == "onebit", bucket.name
        assert [pipe.table.names[id(p)] for p in bucket.members] == fused
    if min_bytes:  # the small raw ones still fuse among themselves
        assert table["1.bias"] == table["2.bias"] == "bucket" and not pipe._route[id(m[2].bias)].spec


def test_compressed_fusion_stops_where_the_dtype_changes_and_leaves_auto_alone():
    m = model()
    m[2].weight.data = m[2].weight.data.half()
    table = ParameterTable(list(m.parameters()), list(m.named_parameters()), CompressionPolicy(ONEBIT, None, 4096))
    pipe = GradientPipeline(table, comm=FakeComm(), fuse_compressed=65536)
    assert pipe.route_of(m[1].weight) == pipe.route_of(m[2].weight) == "direct"
    pipe, m, table = routes({"compressor": "auto"}, None, min_bytes=0, fuse_compressed=65536)
    assert all(v == "direct" for v in table.values()), table  # the planner fuses auto's itself
    # 1.weight (300 x 8) in a param group of another learning rate: corrected EF scales by it
    pipe, m, table = routes(ONEBIT, None, fuse_compressed=65536, lr_of=lambda p: 0.1 if p.shape == (300, 8) else 0.5)
    assert table["1.weight"] == table["2.weight"] == "direct", table


def test_auto_s_small_tensors_are_fused_while_profiling_and_go_back_to_their_bucket():
    """auto's small 1-D tensors travel fused while it profiles (as without a codec), in
    buckets of their own (a plan takes them all away at once), which the planner is told of;
    a plan's tensors sent back (route None) return to those buckets, not one message each."""
    pipe, m, table = routes({"compressor": "auto"}, None, fuse_below=65536)
    assert [n for n in NAMES if table[n] == "bucket"] == ["1.bias", "2.bias"]
    bucket = pipe._route[id(m[2].bias)]
    assert pipe.planner.fused == [tuple(pipe.names[id(p)] for p in bucket.members)]
    route = PlannedRoute.__new__(PlannedRoute)
    route.kind = "planned"
    pipe._install(route, pipe.planner.params)
    assert {pipe.route_of(p) for p in m.parameters()} == {"planned"}
    pipe._install(None, pipe.planner.params)
    assert pipe._route[id(m[1].bias)] is bucket and pipe.route_of(m[1].weight) == "direct"


@pytest.mark.parametrize("params,spec_kept", [(ONEBIT, True), ({"compressor": "powersgd"}, False),
                                              ({"compressor": "auto"}, False)])
def test_a_parameter_unfrozen_later_joins_the_direct_route_under_the_policy(params, spec_kept):
    m = model()
    frozen = m[1].weight.requires_grad_(False)
    table = ParameterTable(list(m.parameters()), list(m.named_parameters()), CompressionPolicy(params, None, 4096))
    other = table.with_policy(None)  # an optimizer's second pipeline keeps a table of its own
    pipe = GradientPipeline(table, comm=FakeComm())
    frozen.requires_grad_(True)
    pipe.adopt(frozen, "1.weight")
    assert pipe.route_of(frozen) == "direct" and pipe.names[id(frozen)] == "Gradient.1.weight"
    assert id(frozen) in map(id, pipe.table.trainable) and id(frozen) not in map(id, other.trainable)
    # its place in the optimizer's order is kept; a low-rank or auto set is fixed, so it goes raw
    assert pipe.table.priority[id(frozen)] == -1
    assert (pipe.table.spec[id(frozen)] is not None) == spec_kept
    added = torch.nn.Parameter(torch.ones(3))
    pipe.adopt(added, "param_group1.0")
    assert pipe.table.priority[id(added)] == -(len(list(m.parameters())) + 1)
    pipe.submit(frozen, torch.ones_like(frozen))
    assert not pipe.all_submitted
