"""GRADPRESS_TRACE: Chrome-trace JSON of the stages, showing the pipeline overlap."""
import json

import pytest

pytestmark = pytest.mark.integ

WORKER = """
import torch, gradpress.torch as bps
bps.init()
x = torch.randn(40000)
for _ in range(3):
    bps.push_pull_inplace(x, name="g", compression_params={"compressor": "onebit", "ef": "vanilla", "scaling": True})
bps.shutdown()
"""


def test_trace_records_every_stage_on_workers_and_servers_and_shows_overlap(cluster, tmp_path):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_TRACE": str(tmp_path / "trace.json"),
                                           "BYTEPS_PARTITION_BYTES": "16000",  # 10 partitions
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
