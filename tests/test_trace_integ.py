"""GRADPRESS_TRACE: Chrome-trace JSON of the stages, showing the pipeline overlap."""
import json

import pytest

pytestmark = pytest.mark.integ

WORKER = """
import torch, gradpress.torch as bps
bps.init()
x = torch.randn(400000)
for _ in range(3):
    bps.push_pull_inplace(x, name="g", compression_params={"compressor": "onebit", "ef": "vanilla", "scaling": True})
bps.shutdown()
"""


def test_trace_records_every_stage_on_workers_and_servers_and_shows_overlap(cluster, tmp_path):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_TRACE": str(tmp_path / "trace.json"),
                                           "BYTEPS_PARTITION_BYTES": "160000",  # 10, above INLINE_MAX_BYTES
                                           "BYTEPS_SERVER_ENGINE_THREAD": "2"})
    c.start(WORKER).assert_success()
    files = {p.name: json.loads(p.read_text())["traceEvents"] for p in tmp_path.glob("trace-*.json")}
    assert set(files) == {"trace-worker0.json", "trace-worker1.json", "trace-server0.json"}, sorted(files)
    worker = [e for e in files["trace-worker0.json"] if e["ph"] == "X"]
    server = [e for e in files["trace-server0.json"] if e["ph"] == "X"]
    assert {e["name"] for e in worker} == {"compress", "push to reply", "decompress"}
    assert {e["name"] for e in server} == {"server sum", "server compress"}
    assert len([e for e in worker if e["name"] == "compress"]) == 30  # 10 partitions x 3 rounds
    # pipelining: some partition is compressed while another one is on the wire
    transfers = [e for e in worker if e["name"] == "push to reply"]
    compresses = [e for e in worker if e["name"] == "compress"]
    overlapping = [(c["args"]["key"], t["args"]["key"]) for c in compresses for t in transfers
                   if c["args"]["key"] != t["args"]["key"] and t["ts"] < c["ts"] < t["ts"] + t["dur"]]
    assert overlapping, "no partition was compressed while another was in flight"
    # the server's keys are spread over both engine threads
    assert len({e["tid"] for e in server}) == 2, {e["tid"] for e in server}


SIZES = """
import torch, gradpress.torch as bps
bps.init()
small, big = torch.full((1000,), float(bps.rank() + 1)), torch.full((100000,), float(bps.rank() + 1))
for _ in range(2):
    for name, x in (("small", small), ("big", big)):
        assert torch.all(bps.push_pull(x, average=False, name=name) == 3.0), name  # 1 + 2
bps.shutdown()
"""


def test_small_keys_are_summed_on_the_io_thread_and_large_ones_on_engine_threads(cluster, tmp_path):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_TRACE": str(tmp_path / "trace.json"),
                                           "BYTEPS_SERVER_ENGINE_THREAD": "2"})
    c.start(SIZES).assert_success()
    server = [e for e in json.loads((tmp_path / "trace-server0.json").read_text())["traceEvents"]
              if e["ph"] == "X" and e["name"] == "server sum"]
    threads = {}
    for e in server:
        threads.setdefault(e["args"]["key"], set()).add(e["tid"])
    assert len(threads) == 2 and len(server) == 8, server  # 2 keys x 2 rounds x 2 workers
    by_size = sorted(threads.values(), key=lambda tids: "MainThread" in tids)
    assert by_size[0] <= {"gp-engine-0", "gp-engine-1"} and by_size[1] == {"MainThread"}, threads


def test_a_trace_goes_into_a_folder_made_for_it(tmp_path):
    from gradpress.trace import Tracer
    tracer = Tracer(str(tmp_path / "not" / "yet" / "trace.json"))
    tracer.add("compress", 1.0, 3.0, key=7)
    path = tracer.write("worker 0")
    assert path == str(tmp_path / "not" / "yet" / "trace-worker0.json")
    events = json.loads(open(path).read())["traceEvents"]
    assert [(e["name"], e["dur"], e["args"]) for e in events if e["ph"] == "X"] == [("compress", 2.0, {"key": 7})]


def test_a_trace_that_cannot_be_written_is_logged_and_the_process_goes_on(tmp_path, caplog):
    from gradpress.trace import Tracer
    (tmp_path / "file").write_text("")  # a file where the folder should be
    tracer = Tracer(str(tmp_path / "file" / "trace.json"))
    tracer.add("push", 1.0, 2.0)
    assert tracer.write("server 1") is None
    assert "could not write server 1's trace to " + str(tmp_path / "file" / "trace-server1.json") in caplog.text
