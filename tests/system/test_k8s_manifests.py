"""deploy/k8s: every overlay renders, validates strictly offline, and wires one working job.

Also the helpers that read rendered manifests the way Kubernetes would (pods of each
controller, a container's environment); tests/system/test_k8s_netns_integ.py starts those pods.
"""
from __future__ import annotations

import atexit
import base64
import math
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
# Schemas kubernetes-validate ships offline; 1.32 matches the kubectl used here.
SCHEMA_VERSION = "1.32.0"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"  # a StatefulSet pod's ordinal
JOB_SETTINGS = ("DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT")


# ---- reading manifests ------------------------------------------------------

_deployed: list[Path] = []


def deploy_tree() -> Path:
    """deploy/k8s as a user deploys it: a copy (with configs/) holding a job secret made as
    docs/deploy.md says. The checkout holds none (git ignores deploy/k8s/base/job-secret)."""
    if not _deployed:
        root = Path(tempfile.mkdtemp(prefix="gradpress-k8s-"))
        atexit.register(shutil.rmtree, root, True)
        shutil.copytree(K8S, root / "deploy" / "k8s")
        shutil.copytree(REPO / "configs", root / "configs")
        (root / "deploy" / "k8s" / "base" / "job-secret").write_text(secrets.token_hex(32) + "\n")
        _deployed.append(root / "deploy" / "k8s")
    return _deployed[0]


def render(path: Path, with_secret: bool = True) -> list[dict]:
    """``kubectl kustomize path`` as a list of objects; skips the test without kubectl.

    Args:
        with_secret: a path under deploy/k8s is rendered from :func:`deploy_tree`, with a job secret.
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    if with_secret and path.resolve().is_relative_to(K8S):
        path = deploy_tree() / path.resolve().relative_to(K8S)
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {path} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def config_map(docs: list[dict], name: str) -> dict[str, str]:
    found = find(docs, "ConfigMap", name)
    assert found, f"no ConfigMap {name!r} in the rendered manifests"
    return found[0].get("data", {})


@dataclass
class Pod:
    """One pod a controller would create: its name, role label, spec and completion index
    (an Indexed Job's) or ordinal (a StatefulSet's)."""
    name: str
    role: str
    spec: dict
    index: int | None = None
    ordinal: int | None = None

    @property
    def container(self) -> dict:
        assert len(self.spec["containers"]) == 1, f"{self.name}: expected one container"
        return self.spec["containers"][0]


def pods(docs: list[dict]) -> list[Pod]:
    """The pods of every Deployment, StatefulSet and Indexed Job, named as their controllers name them."""
    out = []
    for d in docs:
        kind, name, spec = d["kind"], d["metadata"]["name"], d.get("spec", {})
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        template = spec["template"]
        role = template["metadata"]["labels"]["app.kubernetes.io/component"]
        if kind == "Job":
            assert spec.get("completionMode") == "Indexed", f"Job {name}: must be an Indexed Job"
            out += [Pod(f"{name}-{i}", role, template["spec"], i) for i in range(spec["completions"])]
        elif kind == "StatefulSet":
            out += [Pod(f"{name}-{i}", role, template["spec"], ordinal=i) for i in range(spec.get("replicas", 1))]
        else:
            out += [Pod(f"{name}-{i}", role, template["spec"]) for i in range(spec.get("replicas", 1))]
    return out


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in env values, command and args (``$$`` escapes)."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, text)


def container_env(pod: Pod, docs: list[dict], fields: dict[str, str]) -> dict[str, str]:
    """The environment Kubernetes gives the pod's container (without image defaults).

    Args:
        fields: values of the downward-API fieldPaths (``status.podIP``, ...).
    Raises:
        AssertionError: naming a fieldPath, ConfigMap or key the manifest uses but cannot get.
    """
    c = pod.container
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        assert "configMapRef" in src, f"{pod.name}: envFrom {src} not understood"
        prefix = src.get("prefix", "")
        env.update({prefix + k: v for k, v in config_map(docs, src["configMapRef"]["name"]).items()})
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "fieldRef" in var.get("valueFrom", {}):
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"{pod.name}: {var['name']} reads fieldPath {path!r}, which no pod here has"
            env[var["name"]] = fields[path]
        elif "resourceFieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = resource_value(pod, var["valueFrom"]["resourceFieldRef"])
        elif "configMapKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["configMapKeyRef"]
            data = config_map(docs, ref["name"])
            assert ref["key"] in data, f"{pod.name}: {var['name']}: ConfigMap {ref['name']} has no key {ref['key']!r}"
            env[var["name"]] = data[ref["key"]]
        else:
            raise AssertionError(f"{pod.name}: env {var['name']}: source {var.get('valueFrom')} not understood")
    return env


def cpu_cores(quantity) -> float:
    """A CPU quantity ("2", "500m", 1.5) in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def resource_value(pod: Pod, ref: dict) -> str:
    """A resourceFieldRef as the kubelet resolves it: the container's value / divisor, rounded up."""
    assert ref["resource"] in ("requests.cpu", "limits.cpu"), f"{pod.name}: resourceFieldRef {ref} not emulated"
    kind, resource = ref["resource"].split(".")
    value = pod.container.get("resources", {}).get(kind, {}).get(resource)
    assert value is not None, f"{pod.name}: resourceFieldRef {ref['resource']} but the container sets none"
    return str(math.ceil(cpu_cores(value) / cpu_cores(ref.get("divisor", "1"))))


def pod_fields(pod: Pod, ip: str) -> dict[str, str]:
    """Downward-API values for a pod at address ``ip``."""
    fields = {"status.podIP": ip, "metadata.name": pod.name}
    if pod.index is not None:
        fields[COMPLETION_INDEX_FIELD] = str(pod.index)
    if pod.ordinal is not None:
        fields[POD_INDEX_FIELD] = str(pod.ordinal)
    return fields


def service_selecting(docs: list[dict], pod: Pod) -> list[dict]:
    """Services whose selector matches the pod's labels (template labels)."""
    labels = next(d["spec"]["template"]["metadata"]["labels"] for d in docs
                  if d["kind"] in ("Deployment", "StatefulSet", "Job") and d["spec"]["template"]["spec"] is pod.spec)
    return [s for s in find(docs, "Service") if s["spec"].get("selector")
            and all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]


def container_port(pod: Pod, port) -> int:
    """A Service targetPort (number or name) as the container's port number."""
    if isinstance(port, int):
        return port
    for p in pod.container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise AssertionError(f"{pod.name}: no container port named {port!r}")


# ---- rendering and schemas --------------------------------------------------

@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(K8S / "overlays" / request.param)


def test_overlays_exist():
    assert {"cpu-demo", "gpu"} <= set(OVERLAYS), f"overlays found: {OVERLAYS}"


@pytest.mark.integ  # starts processes
@pytest.mark.parametrize("target", ["base"] + [f"overlays/{o}" for o in OVERLAYS])
def test_manifests_validate_strictly(target):
    import kubernetes_validate
    docs = render(K8S / target)
    errors = []
    for d in docs:
        try:
            kubernetes_validate.validate(d, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{d['kind']}/{d['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")
    assert not errors, f"{target} fails Kubernetes {SCHEMA_VERSION} schemas:\n" + "\n".join(errors)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Job", "Secret", "Service", "Service",
                     "StatefulSet"], kinds


@pytest.mark.integ  # starts processes
def test_strict_validation_rejects_an_unknown_field():
    """Guards the test above: a misspelt field must fail, or 'validates' means nothing."""
    import kubernetes_validate
    deployment = find(render(K8S / "base"), "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSION, strict=True)


# ---- one job, wired ---------------------------------------------------------

def test_controllers(overlay):
    name, docs = overlay
    job_env = _job_settings(docs)
    (deployment,) = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1, f"{name}: exactly one scheduler"
    assert deployment["spec"]["strategy"]["type"] == "Recreate", f"{name}: two schedulers must never overlap"
    (sts,) = find(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == int(job_env["DMLC_NUM_SERVER"]), f"{name}: server replicas != DMLC_NUM_SERVER"
    assert sts["spec"]["podManagementPolicy"] == "Parallel", \
        f"{name}: servers are ready only once all registered; OrderedReady would deadlock"
    (headless,) = find(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"].get("clusterIP") == "None", f"{name}: the servers' Service must be headless"
    assert headless["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (job,) = find(docs, "Job")
    n = int(job_env["DMLC_NUM_WORKER"])
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (n, n), \
        f"{name}: worker completions/parallelism != DMLC_NUM_WORKER={n}"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def _job_settings(docs: list[dict]) -> dict[str, str]:
    """The job-wide settings as the worker 0 pod sees them."""
    worker = next(p for p in pods(docs) if p.role == "worker")
    return container_env(worker, docs, pod_fields(worker, "10.0.0.1"))


def test_every_role_gets_the_dmlc_environment(overlay):
    name, docs = overlay
    all_pods = pods(docs)
    assert sorted({p.role for p in all_pods}) == ["scheduler", "server", "worker"]
    shared = None
    for i, pod in enumerate(all_pods):
        ip = f"10.0.0.{i + 2}"
        env = container_env(pod, docs, pod_fields(pod, ip))
        assert env.get("DMLC_ROLE") == pod.role, f"{name}/{pod.name}: DMLC_ROLE={env.get('DMLC_ROLE')}"
        assert env.get("DMLC_NODE_HOST") == ip, f"{name}/{pod.name}: DMLC_NODE_HOST must be the pod's IP"
        missing = [k for k in JOB_SETTINGS if not env.get(k)]
        assert not missing, f"{name}/{pod.name}: missing {missing}"
        mine = {k: env[k] for k in JOB_SETTINGS}
        assert shared is None or mine == shared, f"{name}/{pod.name}: {mine} differs from {shared}"
        shared = mine
        if pod.role == "worker":
            assert env.get("DMLC_WORKER_ID") == str(pod.index), \
                f"{name}/{pod.name}: DMLC_WORKER_ID must be the completion index"
        if pod.role == "server":  # server N in the logs is the pod named -N
            assert env.get("GRADPRESS_SERVER_ID") == str(pod.ordinal), \
                f"{name}/{pod.name}: GRADPRESS_SERVER_ID must be the pod's index"
        assert pod.spec.get("enableServiceLinks") is False, \
            f"{name}/{pod.name}: service links would inject *_PORT variables that clash with settings"


def test_scheduler_service_reaches_the_scheduler(overlay):
    name, docs = overlay
    env = _job_settings(docs)
    scheduler = next(p for p in pods(docs) if p.role == "scheduler")
    (svc,) = find(docs, "Service", env["DMLC_PS_ROOT_URI"].split(".")[0]) or [None]
    assert svc is not None, f"{name}: DMLC_PS_ROOT_URI={env['DMLC_PS_ROOT_URI']} names no Service"
    assert svc in service_selecting(docs, scheduler), f"{name}: Service {svc['metadata']['name']} misses the scheduler"
    port = int(env["DMLC_PS_ROOT_PORT"])
    (sp,) = [p for p in svc["spec"]["ports"] if p["port"] == port] or [None]
    assert sp is not None, f"{name}: Service {svc['metadata']['name']} does not expose DMLC_PS_ROOT_PORT={port}"
    # The scheduler binds DMLC_PS_ROOT_PORT; the Service must forward to that very port.
    assert container_port(scheduler, sp.get("targetPort", port)) == port


def test_servers_declare_their_port(overlay):
    name, docs = overlay
    server = next(p for p in pods(docs) if p.role == "server")
    env = container_env(server, docs, pod_fields(server, "10.0.0.1"))
    port = int(env.get("GRADPRESS_SERVER_PORT", "0"))
    assert port, f"{name}: servers need a fixed GRADPRESS_SERVER_PORT to declare"
    assert port in [p["containerPort"] for p in server.container["ports"]]


def test_job_file_loads_as_deployed(overlay, tmp_path):
    """Each pod's settings load from the mounted ConfigMap with its environment on top."""
    from gradpress.config import Settings
    name, docs = overlay
    for pod in pods(docs):
        env = container_env(pod, docs, pod_fields(pod, "10.0.0.1"))
        path = env.get("GRADPRESS_CONFIG", "")
        mounts = {m["mountPath"]: m["name"] for m in pod.container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod.spec["volumes"]}
        mount = str(Path(path).parent)
        assert mount in mounts, f"{name}/{pod.name}: GRADPRESS_CONFIG={path} is not in a mounted volume"
        data = config_map(docs, volumes[mounts[mount]]["configMap"]["name"])
        assert Path(path).name in data, f"{name}/{pod.name}: the ConfigMap has no {Path(path).name}"
        local = tmp_path / Path(path).name
        local.write_text(data[Path(path).name])
        s = Settings.load(dict(env, GRADPRESS_CONFIG=str(local)))
        assert (s.role, s.num_worker, s.num_server) == (
            pod.role, int(env["DMLC_NUM_WORKER"]), int(env["DMLC_NUM_SERVER"]))


def test_probes_use_the_health_file(overlay):
    name, docs = overlay
    for pod in pods(docs):
        c = pod.container
        env = container_env(pod, docs, pod_fields(pod, "10.0.0.1"))
        for probe, check in (("startupProbe", "ready"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
            command = c.get(probe, {}).get("exec", {}).get("command", [])
            assert command[:2] == ["gradpress-health", check], f"{name}/{pod.name}: {probe} is {c.get(probe)}"
        health = env.get("GRADPRESS_HEALTH_FILE", "")
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volume = mounts.get(str(Path(health).parent))
        assert volume and "emptyDir" in next(v for v in pod.spec["volumes"] if v["name"] == volume), \
            f"{name}/{pod.name}: GRADPRESS_HEALTH_FILE={health!r} must lie in a writable emptyDir mount"


def test_resources(overlay):
    name, docs = overlay
    for pod in pods(docs):
        res = pod.container.get("resources", {})
        assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{name}/{pod.name}: requests {res}"
        gpus = res.get("limits", {}).get("nvidia.com/gpu")
        if name == "gpu" and pod.role == "worker":
            assert gpus and int(gpus) >= 1, f"{name}/{pod.name}: GPU workers must ask for nvidia.com/gpu"
            assert any(t.get("key") == "nvidia.com/gpu" for t in pod.spec.get("tolerations", []))
        else:
            assert gpus is None, f"{name}/{pod.name}: only GPU workers ask for GPUs"
        if pod.role == "worker":
            env = container_env(pod, docs, pod_fields(pod, "10.0.0.1"))
            cpus = env.get("GRADPRESS_CPUS")
            assert cpus == str(math.ceil(cpu_cores(res["requests"]["cpu"]))), \
                f"{name}/{pod.name}: GRADPRESS_CPUS={cpus} should follow the CPU request {res['requests']['cpu']}"
            # gradpress-launch shares GRADPRESS_CPUS among a pod's processes; a fixed
            # OMP_NUM_THREADS would give each of them every core the pod asked for
            assert "OMP_NUM_THREADS" not in env, f"{name}/{pod.name}: OMP_NUM_THREADS is set"


@pytest.mark.integ  # starts processes
def test_one_place_sets_counts_port_and_image(tmp_path):
    """An overlay that changes counts, scheduler port and image changes every field that must follow."""
    rel = os.path.relpath(deploy_tree(), tmp_path)  # kustomize refuses absolute paths
    (tmp_path / "kustomization.yaml").write_text(f"""
resources: [{rel}/base]
components: [{rel}/components/wiring]
namePrefix: run7-
images: [{{name: gradpress, newName: example.org/gp, newTag: v9}}, {{name: gradpress-worker, newName: example.org/gpw}}]
configMapGenerator:
- name: gradpress-job
  behavior: merge
  literals: [DMLC_NUM_WORKER=3, DMLC_NUM_SERVER=5, DMLC_PS_ROOT_PORT=9555]
""")
    docs = render(tmp_path)
    assert find(docs, "StatefulSet")[0]["spec"]["replicas"] == 5
    # the prefix renames the scheduler's Service: the address every node is given follows it
    service = "run7-gradpress-scheduler"
    assert find(docs, "Service", service), [d["metadata"]["name"] for d in find(docs, "Service")]
    job = next(d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith("run7-gradpress-job-"))
    assert job["data"]["DMLC_PS_ROOT_URI"] == service
    job = find(docs, "Job")[0]["spec"]
    assert (job["completions"], job["parallelism"]) == (3, 3)
    scheduler = next(p for p in pods(docs) if p.role == "scheduler")
    assert [p["containerPort"] for p in scheduler.container["ports"]] == [9555]
    assert [p["port"] for p in find(docs, "Service", service)[0]["spec"]["ports"]] == [9555]
    images = {p.role: p.container["image"] for p in pods(docs)}
    assert images == {"scheduler": "example.org/gp:v9", "server": "example.org/gp:v9", "worker": "example.org/gpw"}


@pytest.mark.integ  # starts processes
def test_only_gpu_workers_run_the_cuda_image():
    # the CUDA image is several GB and sees the node's GPUs: the scheduler and the servers,
    # CPU pods, run the CPU image (docs/deploy.md, the images' table)
    images = {p.role: p.container["image"] for p in pods(render(K8S / "overlays" / "gpu"))}
    assert images == {"scheduler": "gradpress-cpu:0.1.0", "server": "gradpress-cpu:0.1.0",
                      "worker": "gradpress-cuda:0.1.0"}
    images = {p.container["image"] for p in pods(render(K8S / "overlays" / "cpu-demo"))}
    assert images == {"gradpress-cpu:0.1.0"}


@pytest.mark.integ  # starts processes
def test_gpu_workers_keep_every_base_mount_and_get_a_dev_shm_in_memory():
    # the overlay's patch adds /dev/shm (DataLoader workers) to the base's mounts, merged by path
    for pod in pods(render(K8S / "overlays" / "gpu")):
        if pod.role != "worker":
            continue
        mounts = {m["mountPath"]: m["name"] for m in pod.container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod.spec["volumes"]}
        assert {"/etc/gradpress", "/run/gradpress", "/var/run/gradpress-secret", "/dev/shm"} <= set(mounts), mounts
        assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_every_job_file_is_in_the_config_map():
    shipped = yaml.safe_load((REPO / "configs" / "kustomization.yaml").read_text())
    files = {f for g in shipped["configMapGenerator"] for f in g.get("files", [])}
    assert files == {p.name for p in (REPO / "configs").glob("*.toml")}, \
        "configs/kustomization.yaml must list every configs/*.toml"


# ---- the job secret -----------------------------------------------------------

def secret_data(docs: list[dict], name: str) -> dict[str, bytes]:
    found = find(docs, "Secret", name)
    assert found, f"no Secret {name!r} in the rendered manifests"
    return {k: base64.b64decode(v) for k, v in found[0].get("data", {}).items()}


def test_every_role_mounts_the_job_secret_and_derives_the_jobs_keys(overlay, tmp_path):
    """Each pod's GRADPRESS_JOB_SECRET_FILE lies in a mounted Secret volume holding a usable
    secret, the same for every pod: all of them derive the same CURVE keys."""
    from gradpress.config import Settings
    from gradpress.net import auth
    name, docs = overlay
    keys = set()
    for pod in pods(docs):
        env = container_env(pod, docs, pod_fields(pod, "10.0.0.1"))
        path = env.get("GRADPRESS_JOB_SECRET_FILE", "")
        assert path and not env.get("GRADPRESS_JOB_SECRET") and not env.get("GRADPRESS_INSECURE"), \
            f"{name}/{pod.name}: the secret must come from a file (GRADPRESS_JOB_SECRET_FILE={path!r})"
        mounts = {m["mountPath"]: m for m in pod.container["volumeMounts"]}
        mount = mounts.get(str(Path(path).parent))
        assert mount and mount.get("readOnly"), f"{name}/{pod.name}: {path} is not in a read-only mount"
        volume = next(v for v in pod.spec["volumes"] if v["name"] == mount["name"])
        assert "secret" in volume, f"{name}/{pod.name}: {path} is mounted from {volume}, not a Secret"
        assert volume["secret"].get("defaultMode", 0o644) & 0o007 == 0, \
            f"{name}/{pod.name}: the secret is world-readable"
        data = secret_data(docs, volume["secret"]["secretName"])
        assert Path(path).name in data, f"{name}/{pod.name}: the Secret has no key {Path(path).name}"
        local = tmp_path / pod.name
        local.write_bytes(data[Path(path).name])
        keys.add(auth.job_keys(Settings.load(dict(env, GRADPRESS_CONFIG="", GRADPRESS_JOB_SECRET_FILE=str(local)))))
    assert len(keys) == 1, f"{name}: the pods derive different keys"


@pytest.mark.integ  # starts processes
def test_without_a_job_secret_nothing_renders(tmp_path):
    """No secret file, no manifests: a job cannot be deployed without one by mistake."""
    tree = tmp_path / "deploy" / "k8s"
    shutil.copytree(deploy_tree(), tree)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    (tree / "base" / "job-secret").unlink()
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    out = subprocess.run([kubectl, "kustomize", str(tree / "overlays" / "cpu-demo")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "job-secret" in out.stderr, out
