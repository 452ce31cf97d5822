#!/usr/bin/env python3
"""Smoke run: the cpu-demo overlay's job, started from the CPU image, one network namespace per pod.

    sudo .venv/bin/python deploy/docker/smoke.py [--base IMAGE] [--no-build] [--remove-image]

It builds the image with deploy/docker/build.sh (what `make images` runs), renders
deploy/k8s/overlays/cpu-demo with kubectl, and runs each of its five pods (scheduler,
2 servers, 2 workers) as a podman container in a network namespace of its own
(gradpress.testing.netns: a private subnet on a bridge, no route out), with the pod's
command, arguments, environment (passed on unchanged), working directory, user,
capabilities and volumes. Then:

1. the job trains the demo to the end: every worker exits 0, then the scheduler and servers;
2. each container's readiness and liveness probes (``podman exec`` of the manifest's
   command) succeed once it has registered, and no server is ready before the workers came;
3. drill: the job again, a server container killed mid-training; the job must stop, the
   scheduler naming the killed server's address and the workers failing on the loss;
4. containers and namespaces are removed (and the image with --remove-image), also when
   a step fails or the run is interrupted.

What is translated, as in tests/system/test_k8s_netns_integ.py: the downward API (the pod IP is
the namespace's address, the completion index the pod's), cluster DNS (``--add-host``
for each Service name), ConfigMap and Secret volumes (files in a directory mounted
read-only; the job secret made as docs/deploy.md says, in a copy of deploy/k8s) and
emptyDir volumes (a tmpfs). Resource limits and restart policies are not.

Needs root, podman, iproute2 and kubectl; the venv (make setup) for PyYAML and the
manifest helpers in tests/. Exit status: 0 passed, 1 a check failed, 2 cannot run here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OVERLAY = REPO / "deploy" / "k8s" / "overlays" / "cpu-demo"
DEFAULT_IMAGE = "gradpress-cpu:0.1.0"
JOB_DEADLINE_S = 600.0   # the demo's 10 epochs took about 10 s here once all were ready: room for slower hosts
DRILL_DEADLINE_S = 120.0  # heartbeat_timeout_s (30 s in configs/demo.toml) and exits
STEPS = 6


class Failed(Exception):
    """A check of the smoke run failed (exit 1)."""


def say(step: int, text: str, start=time.monotonic()) -> None:
    print(f"[{step}/{STEPS}] {time.monotonic() - start:6.1f} s  {text}", flush=True)


def stop(message: str) -> None:
    print(f"smoke.py: {message}", file=sys.stderr)
    sys.exit(2)


def preflight(args) -> None:
    """Everything that can be known before a build, checked at once (exit 2 otherwise)."""
    check = [shutil.which("bash") or "/bin/bash", str(HERE / "build.sh"), "--check", "--tag", args.image]
    if args.base:
        check += ["--base", args.base]
    out = subprocess.run(check, capture_output=True, text=True)
    if out.returncode != 0:  # a bad base name, no build tool, no mmdebstrap for the default base
        stop((out.stderr or out.stdout).strip().removeprefix("build.sh: "))
    if shutil.which("podman") is None:
        stop("podman is not installed: the containers run with podman (Debian: apt-get install podman runc)")
    for tool, why in (("ip", "iproute2's ip makes the network namespaces"),
                      ("kubectl", "kubectl renders the cpu-demo overlay")):
        if shutil.which(tool) is None:
            stop(f"{tool} is not installed: {why}")
    if os.geteuid() != 0:
        stop("needs root: creates network namespaces and runs podman as root")


def podman(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise Failed(f"podman {' '.join(argv[:3])} ...: {out.stderr.strip()}")
    return out


class Container:
    """One pod of the rendered manifests, run as a podman container in its namespace."""

    def __init__(self, pod, docs, netns: str, addr: str, hosts: dict[str, str], image: str, run_id: str,
                 workdir: Path):
        from system.test_k8s_manifests import config_map, container_env, expand, pod_fields, secret_data
        self.pod, self.addr = pod, addr
        self.name = f"{run_id}-{pod.name}"
        c = pod.container
        env = container_env(pod, docs, pod_fields(pod, addr))
        if pod.index is not None:
            env["JOB_COMPLETION_INDEX"] = str(pod.index)  # Indexed Job pods get it from Kubernetes
        sc = {**pod.spec.get("securityContext", {}), **c.get("securityContext", {})}
        argv = ["run", "--detach", "--name", self.name, "--label", f"gradpress-smoke={run_id}",
                "--network", f"ns:/run/netns/{netns}", "--hostname", pod.name,
                "--user", f"{sc['runAsUser']}:{sc['runAsGroup']}", "--workdir", c["workingDir"],
                "--entrypoint", json.dumps(c["command"])]
        argv += [f"--add-host={host}:{ip}" for host, ip in hosts.items()]
        argv += [f"--cap-drop={cap}" for cap in sc.get("capabilities", {}).get("drop", [])]
        if sc.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        if sc.get("readOnlyRootFilesystem"):
            argv += ["--read-only"]
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "configMap" in v:
                local = workdir / pod.name / m["name"]
                local.mkdir(parents=True)
                data = config_map(docs, v["configMap"]["name"])
                for item in v["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                    (local / item["path"]).write_text(data[item["key"]])
                local.chmod(0o755)
                argv += ["--volume", f"{local}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}"]
            elif "secret" in v:  # as the kubelet writes it: the mode asked for, group fsGroup
                local = workdir / pod.name / m["name"]
                local.mkdir(parents=True)
                for key, value in secret_data(docs, v["secret"]["secretName"]).items():
                    (local / key).write_bytes(value)
                    os.chown(local / key, 0, sc.get("fsGroup", 0))
                    (local / key).chmod(v["secret"].get("defaultMode", 0o644))
                local.chmod(0o755)
                argv += ["--volume", f"{local}:{m['mountPath']}:ro"]
            elif "emptyDir" in v:
                argv += ["--tmpfs", f"{m['mountPath']}:rw,mode=1777"]  # emptyDir: writable by any user
            else:
                raise Failed(f"{pod.name}: volume {m['name']} is {sorted(v)}; smoke.py knows configMap, secret "
                             "and emptyDir")
        argv += [f"--env={k}={v}" for k, v in env.items()]
        self.argv = argv + [image] + [expand(a, env) for a in c.get("args", [])]
        self.started = False

    def start(self) -> None:
        podman(*self.argv)
        self.started = True

    def probe(self, kind: str) -> bool:
        """The container's exec probe ``kind`` (readinessProbe, ...), run as the kubelet runs it."""
        return podman("exec", self.name, *self.pod.container[kind]["exec"]["command"], check=False,
                      timeout=30).returncode == 0

    def exit_code(self) -> int | None:
        """None while running."""
        state = json.loads(podman("inspect", "--format", "{{json .State}}", self.name).stdout)
        return None if state["Running"] else state["ExitCode"]

    def log(self) -> str:
        out = podman("logs", self.name, check=False)
        return out.stdout + out.stderr

    def tail(self, lines: int = 20) -> str:
        if not self.started:
            return f"--- {self.name}: not started"
        last = "\n".join(self.log().splitlines()[-lines:])
        return f"--- {self.name} ({self.addr}), exit {self.exit_code()}:\n{last}"


def wait_until(condition, timeout_s: float, what: str, containers: list[Container], may_fail=()) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        failed = [c.name for c in containers if c.started and c not in may_fail and c.exit_code() not in (None, 0)]
        if failed:
            raise Failed(f"{what}: {failed} failed\n" + "\n".join(c.tail() for c in containers))
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {timeout_s:g} s\n" + "\n".join(c.tail() for c in containers))
        time.sleep(1)


def start_job(docs, cluster, image: str, run_id: str, workdir: Path, step: int) -> list[Container]:
    """The five containers, scheduler and servers first; returns them once all are ready."""
    from system.test_k8s_manifests import pods
    from system.test_k8s_netns_integ import dns_entries
    job_pods = pods(docs)
    addresses = {p.name: (cluster.addr(p.name) if p.name in cluster.nodes else cluster.add_node(p.name))
                 for p in job_pods}
    hosts = dns_entries(docs, addresses)
    containers = [Container(p, docs, cluster.ns(p.name), addresses[p.name], hosts, image, run_id, workdir)
                  for p in job_pods]
    first = [c for c in containers if c.pod.role in ("scheduler", "server")]
    workers = [c for c in containers if c.pod.role == "worker"]
    for c in first:
        c.start()
    scheduler = first[0]
    n_servers = len(first) - 1
    wait_until(lambda: scheduler.log().count("registered server") == n_servers, 120,
               "the scheduler logging every server's registration", containers)
    # Registered servers still wait for the address book: ready would be a lie before the workers come.
    early = [c.name for c in first[1:] if c.probe("readinessProbe")]
    if early:
        raise Failed(f"{early} report ready before any worker registered")
    say(step, f"scheduler and {n_servers} servers registered; no server ready before the workers came")
    for c in workers:
        c.start()
    ready: set[str] = set()

    def all_ready() -> bool:
        for c in containers:
            if c.name not in ready and c.probe("readinessProbe") and c.probe("livenessProbe"):
                ready.add(c.name)
        return len(ready) == len(containers)

    wait_until(all_ready, 120, "every container's readiness and liveness probes", containers)
    return containers


def remove(run_id: str) -> None:
    ids = podman("ps", "--all", "--quiet", "--filter", f"label=gradpress-smoke={run_id}", check=False).stdout.split()
    if ids:
        podman("rm", "--force", "--time", "0", *ids, check=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default=DEFAULT_IMAGE, help="the image the overlay names (default %(default)s)")
    p.add_argument("--base", default=os.environ.get("BASE_IMAGE", ""),
                   help="base image for the build (default: a Debian base made with mmdebstrap)")
    p.add_argument("--no-build", action="store_true", help="use the image as it is")
    p.add_argument("--remove-image", action="store_true", help="remove the image at the end")
    args = p.parse_args()
    preflight(args)
    os.environ.setdefault("CONTAINERS_CONF", str(HERE / "containers.conf"))
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from gradpress.testing.netns import Interrupted, NetnsCluster, cleanup_on_signals
    from system.test_k8s_manifests import pods, render

    run_id = f"gpsmoke{os.getpid() % 100000}"
    cluster = NetnsCluster(run_id)
    cleanup_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix=f"{run_id}-"))
    started = time.monotonic()
    try:
        if args.no_build:
            say(1, f"using {args.image} as built")
            if podman("image", "exists", args.image, check=False).returncode != 0:
                raise Failed(f"--no-build, but there is no image {args.image}")
        else:
            say(1, f"building {args.image} with deploy/docker/build.sh")
            build = ["bash", str(HERE / "build.sh"), "--tag", args.image] + (["--base", args.base] if args.base else [])
            if subprocess.run(build).returncode != 0:
                raise Failed("the image build failed (its output is above)")
        say(2, f"rendering {OVERLAY.relative_to(REPO)}")
        docs = render(OVERLAY)
        job_pods = pods(docs)
        images = {pd.container["image"] for pd in job_pods}
        if images != {args.image}:
            raise Failed(f"the overlay's pods run {sorted(images)}, not the image built here ({args.image})")
        say(2, "pods: " + ", ".join(f"{pd.name} ({pd.role})" for pd in job_pods))

        say(3, "starting the job: a network namespace and a container per pod")
        cluster.start()
        containers = start_job(docs, cluster, args.image, f"{run_id}a", workdir / "a", 3)
        say(3, "every container ready and live (gradpress-health): " + ", ".join(c.name for c in containers))
        workers = [c for c in containers if c.pod.role == "worker"]
        wait_until(lambda: all(w.exit_code() == 0 for w in workers), JOB_DEADLINE_S, "the workers training",
                   containers)
        wait_until(lambda: all(c.exit_code() == 0 for c in containers), 60, "the scheduler and servers exiting",
                   containers)
        rank0 = workers[0].log()
        if "final test accuracy" not in rank0:
            raise Failed("worker 0 exited 0 without reporting the final test accuracy\n" + workers[0].tail())
        say(4, "the job trained and every container exited 0; worker 0 printed:")
        for line in rank0.splitlines():
            if line.startswith(("epoch", "final")):
                print("        " + line, flush=True)
        remove(f"{run_id}a")

        say(5, "drill: the job again, a server container killed during training")
        containers = start_job(docs, cluster, args.image, f"{run_id}b", workdir / "b", 5)
        workers = [c for c in containers if c.pod.role == "worker"]
        wait_until(lambda: "epoch" in workers[0].log(), JOB_DEADLINE_S, "training under way", containers)
        victim = [c for c in containers if c.pod.role == "server"][-1]
        podman("kill", victim.name)
        say(5, f"killed {victim.name} ({victim.addr})")
        others = [c for c in containers if c is not victim]
        wait_until(lambda: all(c.exit_code() is not None for c in others), DRILL_DEADLINE_S,
                   "the job stopping after the kill", containers, may_fail=containers)
        scheduler = next(c for c in containers if c.pod.role == "scheduler")
        lost = [line for line in scheduler.log().splitlines() if "lost server" in line and f"on {victim.addr})" in line]
        if not lost:
            raise Failed(f"the scheduler did not name {victim.addr} as lost\n" + scheduler.tail())
        codes = {c.name: c.exit_code() for c in others}
        if any(codes[w.name] == 0 for w in workers) or codes[scheduler.name] == 0:
            raise Failed(f"the job went on as if nothing happened: exit codes {codes}")
        reports = {w.name: next((line for line in w.log().splitlines() if "lost server" in line), None)
                   for w in workers}
        if not all(reports.values()):
            raise Failed("a worker did not report the lost server\n" + "\n".join(w.tail() for w in workers))
        say(5, f"the job stopped; the scheduler: {lost[0].strip()}")
        for name, line in reports.items():
            say(5, f"{name.removeprefix(run_id + 'b-')}: {line.strip()}")
        say(5, "exit codes: " + ", ".join(f"{n.removeprefix(run_id + 'b-')} {c}" for n, c in codes.items()))
        outcome = 0
    except (Failed, Interrupted) as e:
        print(f"smoke.py: FAILED: {e}", file=sys.stderr, flush=True)
        outcome = 1
    finally:
        say(6, "removing containers and namespaces" + (f", and the image {args.image}" if args.remove_image else ""))
        for suffix in "ab":
            remove(f"{run_id}{suffix}")
        cluster.remove()
        shutil.rmtree(workdir, ignore_errors=True)
        if args.remove_image:
            podman("rmi", "--force", args.image, check=False)
    left = podman("ps", "--all", "--quiet", "--filter", f"label=gradpress-smoke={run_id}a", check=False).stdout.split()
    left += cluster.leftovers()
    if left:
        print(f"smoke.py: FAILED: left behind: {left}", file=sys.stderr)
        return 1
    print(f"smoke.py: {'passed' if outcome == 0 else 'failed'} in {time.monotonic() - started:.0f} s", flush=True)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
