"""The CPU demo overlay starts a working job: its pods, run in network namespaces.

Every pod of the rendered manifests (1 scheduler, 2 servers, 2 workers) gets a network
namespace of its own with one address in a private subnet; the namespaces hang off a
bridge that lives in a namespace of its own, so nothing touches the host's network and
no namespace has a route out. Each pod runs exactly the command, arguments and
environment its manifest gives. What the test translates, and nothing more:

- the image: PATH leads to this checkout's venv, and the manifest's workingDir (checked
  equal to the image's WORKDIR in deploy/docker/Dockerfile.cpu) becomes the repository;
- volumes: each mountPath becomes a per-pod directory (a ConfigMap's or Secret's data
  written as files, an emptyDir empty), wherever env values and args name it;
- the downward API: ``status.podIP`` is the namespace's address, the completion-index
  annotation the pod's index; Indexed-Job pods get JOB_COMPLETION_INDEX as in a cluster;
- cluster DNS: each Service name resolves, through /etc/netns/<ns>/hosts (which
  ``ip netns exec`` bind-mounts over /etc/hosts), to the pod it selects; the test
  asserts that the Service forwards its port to the same container port;
- probes: the exec probes run by hand in the pod's namespace with its environment;
- test-only: GRADPRESS_DEMO_MAX_STEPS caps the demo at a few steps.

Resources, security contexts and restarts are not emulated.
"""
from __future__ import annotations

import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gradpress.testing.netns import NetnsCluster, ip
from system.test_k8s_manifests import (K8S, REPO, Pod, config_map, container_env, container_port, expand, find,
                                pod_fields, pods, render, secret_data, service_selecting)

pytestmark = [pytest.mark.integ, pytest.mark.netns, pytest.mark.timeout(150)]

VENV_BIN = REPO / ".venv" / "bin"
DEMO_MAX_STEPS = "3"
JOB_DEADLINE_S = 90.0
NAMESPACE = "default"  # the manifests name none; kubectl applies them to the current one


@pytest.fixture
def netns_allowed():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces, veth pairs and a bridge")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's `ip` to create network namespaces")
    if not (VENV_BIN / "gradpress-launch").exists():
        pytest.skip(f"needs the project venv at {VENV_BIN.parent} (make setup)")


class PodProcess:
    """One pod's container, started as its manifest says, in its namespace."""

    def __init__(self, pod: Pod, docs: list[dict], ns: str, addr: str, root: Path, workdir: str):
        self.pod, self.ns, self.addr = pod, ns, addr
        self.dir = root / pod.name
        c = pod.container
        self.mounts = self._volumes(docs)
        env = container_env(pod, docs, pod_fields(pod, addr))
        if pod.index is not None:
            env["JOB_COMPLETION_INDEX"] = str(pod.index)
        if pod.role == "worker":
            env["GRADPRESS_DEMO_MAX_STEPS"] = DEMO_MAX_STEPS
        self.env = {k: self._local(v) for k, v in env.items()}
        self.env.update(PATH=f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", HOME=str(self.dir))
        assert "command" in c, f"{pod.name}: the manifest must give the command (the test does not guess the image's)"
        self.argv = [self._local(expand(a, self.env)) for a in c["command"] + c.get("args", [])]
        assert c.get("workingDir") == workdir, \
            f"{pod.name}: workingDir {c.get('workingDir')} is not the image's {workdir}"
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "log.txt"

    def _volumes(self, docs: list[dict]) -> dict[str, Path]:
        volumes = {v["name"]: v for v in self.pod.spec.get("volumes", [])}
        mounts = {}
        for m in self.pod.container.get("volumeMounts", []):
            local = self.dir / "volumes" / m["name"]
            local.mkdir(parents=True, exist_ok=True)
            v = volumes[m["name"]]
            if "configMap" in v:
                data = config_map(docs, v["configMap"]["name"])
                items = v["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (local / item["path"]).write_text(data[item["key"]])
            elif "secret" in v:
                data = secret_data(docs, v["secret"]["secretName"])
                for key, value in data.items():
                    (local / key).write_bytes(value)
                    (local / key).chmod(v["secret"].get("defaultMode", 0o644))
            else:
                assert "emptyDir" in v, f"{self.pod.name}: volume {m['name']} is not a ConfigMap, Secret or emptyDir"
            mounts[m["mountPath"].rstrip("/")] = local
        return mounts

    def _local(self, value: str) -> str:
        for path, local in self.mounts.items():
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path):]
        return value

    def start(self) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *self.argv], env=self.env, cwd=REPO,
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def probe(self, kind: str) -> bool:
        """Run the container's exec probe ``kind`` (readinessProbe, ...) as the kubelet would."""
        command = self.pod.container[kind]["exec"]["command"]
        out = subprocess.run(["ip", "netns", "exec", self.ns, *command], env=self.env, cwd=REPO,
                             capture_output=True, timeout=10)
        return out.returncode == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.pod.name} ({self.ns} {self.addr}) exit {self.proc and self.proc.poll()}:\n" + \
            "\n".join(text.splitlines()[-lines:])


def dns_entries(docs: list[dict], addresses: dict[str, str]) -> dict[str, str]:
    """Service DNS names -> the address of the pod behind them, as cluster DNS would answer."""
    entries = {}
    for svc in find(docs, "Service"):
        name, spec = svc["metadata"]["name"], svc["spec"]
        selected = [p for p in pods(docs) if svc in service_selecting(docs, p)]
        assert selected, f"Service {name} selects no pod"
        if spec.get("clusterIP") == "None":  # headless: a name per pod
            targets = {f"{p.name}.{name}": addresses[p.name] for p in selected}
        else:
            assert len(selected) == 1, f"Service {name}: the test emulates a ClusterIP over one pod only"
            for port in spec["ports"]:
                assert container_port(selected[0], port.get("targetPort", port["port"])) == port["port"], \
                    f"Service {name} forwards port {port['port']} elsewhere; the test maps names, not ports"
            targets = {name: addresses[selected[0].name]}
        for short, addr in targets.items():
            entries[short] = entries[f"{short}.{NAMESPACE}"] = entries[f"{short}.{NAMESPACE}.svc"] = addr
            entries[f"{short}.{NAMESPACE}.svc.cluster.local"] = addr
    return entries


def image_workdir() -> str:
    workdirs = re.findall(r"^WORKDIR\s+(\S+)", (REPO / "deploy/docker/Dockerfile.cpu").read_text(), re.M)
    assert workdirs, "deploy/docker/Dockerfile.cpu sets no WORKDIR"
    return workdirs[-1]


def wait_until(condition, timeout_s: float, procs: list[PodProcess], what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        failed = [p for p in procs if p.proc and p.proc.poll() not in (None, 0)]
        assert not failed, f"{what}: {[p.pod.name for p in failed]} failed\n" + "\n".join(p.tail() for p in procs)
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s\n" + "\n".join(p.tail() for p in procs)
        time.sleep(0.2)


def test_cpu_demo_job_runs_in_network_namespaces(netns_allowed, tmp_path):
    docs = render(K8S / "overlays" / "cpu-demo")
    job_pods = pods(docs)
    roles = sorted(p.role for p in job_pods)
    assert roles == ["scheduler", "server", "server", "worker", "worker"], \
        f"the CPU demo overlay should be 1 scheduler, 2 servers, 2 workers; it is {roles}"

    cluster = NetnsCluster(f"gpk{os.getpid() % 100000}{secrets.token_hex(2)}", subnet=f"10.250.{random.randrange(256)}")
    procs: list[PodProcess] = []
    try:
        try:
            cluster.start()
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
        addresses = {p.name: cluster.add_node(p.name) for p in job_pods}
        hosts = dns_entries(docs, addresses)
        for pod in job_pods:
            ns, addr = cluster.ns(pod.name), addresses[pod.name]
            cluster.hosts(pod.name, hosts)
            assert not ip("-n", ns, "route", "show", "default").stdout.strip(), f"{ns} has a route out"
            procs.append(PodProcess(pod, docs, ns, addr, tmp_path, image_workdir()))
        scheduler = [p for p in procs if p.pod.role == "scheduler"]
        servers = [p for p in procs if p.pod.role == "server"]
        workers = [p for p in procs if p.pod.role == "worker"]

        # Scheduler and servers first: the servers must not report ready while the job
        # cannot have registered (no worker yet), so readiness means registration.
        for p in scheduler + servers:
            p.start()
        wait_until(lambda: scheduler[0].probe("readinessProbe"), 30, procs, "scheduler readiness probe")
        # Servers that have announced themselves (the job file logs at INFO) still wait
        # for the address book, so they must not be ready yet.
        wait_until(lambda: scheduler[0].log.read_text().count("registered server") == len(servers), 30, procs,
                   "the scheduler logging every server's registration")
        early = [p.pod.name for p in servers if p.probe("readinessProbe")]
        assert not early, f"{early} report ready before any worker registered"

        for p in workers:
            p.start()
        ready: set[str] = set()

        def all_ready_and_workers_done() -> bool:
            for p in procs:
                if p.pod.name not in ready and p.probe("readinessProbe") and p.probe("livenessProbe"):
                    ready.add(p.pod.name)
            return len(ready) == len(procs) and all(w.proc.poll() == 0 for w in workers)

        wait_until(all_ready_and_workers_done, JOB_DEADLINE_S, procs, "workers finishing, every pod ready and live")
        # The workers are done: the scheduler ends the job and everyone exits cleanly.
        wait_until(lambda: all(p.proc.poll() == 0 for p in procs), 30, procs, "scheduler and servers exiting")
        log = workers[0].log.read_text()
        assert f"steps {int(DEMO_MAX_STEPS):5d}" in log and "final test accuracy" in log, workers[0].tail()
    finally:
        for p in procs:
            p.stop()
        cluster.remove()
    assert not cluster.leftovers(), f"namespaces or /etc/netns entries left behind: {cluster.leftovers()}"
