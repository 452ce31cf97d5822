"""A member (it holds the job secret) floods a server with INIT_KEYs for ever new keys of 4
MB each (gradpress/server/budget.py): past the cap each is refused with an ERROR naming
the cap, the server's memory stays bounded, and the job's own push_pulls go on, exact."""
import json
import sys
import time
from pathlib import Path

import pytest
import zmq

from cluster import LocalCluster
from gradpress.config import Settings
from gradpress.net import transport
from gradpress.net.protocol import Op

pytestmark = pytest.mark.integ
CAP = 48 << 20
FLOOD, COUNT = 60, 1_000_000   # 60 keys of 4 MB (one partition each): 240 MB asked for

WORKER = """
import json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, d = bps.rank(), os.environ["GP_TEST_DIR"]
got = bps.push_pull(torch.full((1000,), float(r + 1)), average=False, name="w")
assert torch.all(got == 3), got[:3]
if r == 0:
    with open(os.path.join(d, "servers.json"), "w") as fh:
        json.dump([[s.host, s.port] for s in ops._require().book.servers], fh)
open(os.path.join(d, f"round0-{r}"), "w").close()
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.05)
got = bps.push_pull(torch.full((1000,), float(r + 1)), average=False, name="w")
assert torch.all(got == 3), ("round 1 sum is not exact", got[:3])
print(f"OK rank {r}: survived the flood", flush=True)
bps.shutdown()
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_an_init_key_flood_is_refused_past_the_cap_and_the_job_survives(tmp_path):
    c = LocalCluster(tmp_path, workers=2, servers=1,
                     env={"GRADPRESS_SERVER_MAX_KEY_BYTES": str(CAP), "GRADPRESS_SHM": "0"})
    ctx = zmq.Context()
    try:
        c.start_scheduler()
        c.start_server(0)
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        for i in range(2):
            c.start_worker(i, [sys.executable, str(script)], GP_TEST_DIR=str(tmp_path))
        deadline = time.monotonic() + 90
        while not all((tmp_path / n).exists() for n in ("round0-0", "round0-1", "servers.json")):
            assert time.monotonic() < deadline and all(p.poll() in (None, 0) for p in c.procs.values()), c.logs()
            time.sleep(0.05)
        (host, port), = json.loads((tmp_path / "servers.json").read_text())
        before = _rss_mb(c.procs["server 0"].pid)
        member = transport.dealer(ctx, Settings(job_secret=c.secret), host, port, b"flooder")
        for i in range(FLOOD):
            transport.send(member, Op.INIT_KEY, "worker 0", key=(1000 + i) << 16, name=f"flood.{i}", count=COUNT,
                           dtype="float32")
        errors, end = [], time.monotonic() + 20
        while len(errors) < FLOOD - CAP // (4 * COUNT) and time.monotonic() < end:
            if member.poll(500):
                _, header, _ = transport.recv(member, routed=False)
                if header is not None and header["op"] == Op.ERROR:
                    errors.append(header["message"])
        grown = _rss_mb(c.procs["server 0"].pid) - before
        member.close()
        (tmp_path / "go").touch()
        codes = c.wait(timeout_s=90)
    finally:
        c.kill()
        ctx.destroy(linger=0)
    refused = FLOOD - CAP // (4 * COUNT)
    assert len(errors) >= refused, f"{len(errors)} ERRORs for {FLOOD} keys past a cap of {CAP} bytes: {errors[:2]}"
    assert all(f"over its cap of {CAP} (GRADPRESS_SERVER_MAX_KEY_BYTES)" in e for e in errors), errors[:2]
    assert grown < CAP / (1 << 20) + 64, f"the server grew by {grown:.0f} MB for a cap of {CAP >> 20} MB"
    assert all(code == 0 for code in codes.values()), f"exit codes {codes}\n{c.logs()}"
    for r in range(2):
        assert f"OK rank {r}: survived the flood" in c.log(f"worker {r}"), c.logs()
