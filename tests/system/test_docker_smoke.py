"""deploy/docker/smoke.py and build.sh: they run what the manifests say, and stop at once when they cannot run.

The smoke run itself needs root, podman and minutes (docs/deploy.md has its output); here
nothing is built or started. The podman arguments smoke.py would give each pod of the
rendered cpu-demo overlay are read and compared with the manifests and the Dockerfile:
image name, entry point, working directory, user, ports and environment.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

from system.test_k8s_images import DOCKERFILES, instructions
from system.test_k8s_manifests import K8S, REPO, container_env, pod_fields, pods, render

SMOKE = REPO / "deploy/docker/smoke.py"
BUILD = REPO / "deploy/docker/build.sh"


def load_smoke():
    spec = importlib.util.spec_from_file_location("gradpress_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_without_podman(argv: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """Run with a PATH that holds no podman, buildah or anything else (an empty directory)."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                         env={"PATH": str(empty), "HOME": str(tmp_path)})
    return out, time.monotonic() - start


def podman_options(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """``run`` arguments as {option: [values]}, the image and the arguments after it."""
    assert argv[0] == "run"
    opts: dict[str, list[str]] = {}
    i = 1
    flags = {"--detach"}
    while argv[i].startswith("--"):
        if "=" in argv[i]:
            key, value = argv[i].split("=", 1)
            i += 1
        elif argv[i] in flags:
            key, value = argv[i], ""
            i += 1
        else:
            key, value = argv[i], argv[i + 1]
            i += 2
        opts.setdefault(key, []).append(value)
    return opts, argv[i], argv[i + 1:]


@pytest.fixture(scope="module")
def smoke_pods(tmp_path_factory):
    """(pod, its environment as the manifests give it, smoke.py's podman run arguments) per pod."""
    smoke = load_smoke()
    docs = render(K8S / "overlays" / "cpu-demo")
    job_pods = pods(docs)
    out = []
    for i, pod in enumerate(job_pods):
        addr = f"10.250.0.{i + 2}"
        c = smoke.Container(pod, docs, f"ns-{pod.name}", addr, {"gradpress-scheduler": "10.250.0.2"},
                            smoke.DEFAULT_IMAGE, "gpsmoketest", tmp_path_factory.mktemp(pod.name))
        out.append((pod, container_env(pod, docs, pod_fields(pod, addr)), podman_options(c.argv)))
    return smoke, out


def test_image_name_is_the_manifests_and_the_builds(smoke_pods):
    smoke, per_pod = smoke_pods
    build_default = next(line for line in BUILD.read_text().splitlines() if line.startswith("image="))
    assert build_default == f"image=${{IMAGE:-{smoke.DEFAULT_IMAGE}}}", \
        f"build.sh's default tag ({build_default}) is not smoke.py's {smoke.DEFAULT_IMAGE}"
    for pod, _, (_, image, _) in per_pod:
        assert pod.container["image"] == smoke.DEFAULT_IMAGE, \
            f"{pod.name} runs {pod.container['image']}; build.sh and smoke.py build {smoke.DEFAULT_IMAGE}"
        assert image == smoke.DEFAULT_IMAGE


def test_entry_point_workdir_and_user_are_the_images(smoke_pods):
    _, per_pod = smoke_pods
    steps = instructions(DOCKERFILES["cpu"])
    entrypoint = json.loads([a for i, a in steps if i == "ENTRYPOINT"][-1])
    workdir = [a for i, a in steps if i == "WORKDIR"][-1]
    user = [a for i, a in steps if i == "USER"][-1]
    for pod, env, (opts, _, args) in per_pod:
        assert json.loads(opts["--entrypoint"][0]) == pod.container["command"] == entrypoint, pod.name
        assert args == pod.container.get("args", []), f"{pod.name}: the container's arguments are not the manifest's"
        assert opts["--workdir"] == [workdir] and opts["--user"] == [user], pod.name
        # The probes run inside the container: their program must be one the image installs.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            program = pod.container[probe]["exec"]["command"][0]
            assert f"\n{program} = " in (REPO / "pyproject.toml").read_text(), \
                f"{pod.name}: {probe} runs {program}, which is not one of gradpress's installed commands"


def test_environment_is_passed_on_unchanged(smoke_pods):
    """Every variable the manifests give (DMLC_*, GRADPRESS_*, BYTEPS_* and the rest) reaches the container as is."""
    _, per_pod = smoke_pods
    image_env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for i, a in instructions(DOCKERFILES["cpu"]) if i == "ENV")))
    for pod, env, (opts, _, _) in per_pod:
        given = dict(e.split("=", 1) for e in opts["--env"])
        extra = {k: v for k, v in given.items() if k not in env}
        assert extra == ({"JOB_COMPLETION_INDEX": str(pod.index)} if pod.index is not None else {}), \
            f"{pod.name}: smoke.py adds {extra}"
        assert {k: given[k] for k in env} == env, f"{pod.name}: smoke.py changes the manifest's environment"
        assert {"DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "GRADPRESS_HEALTH_FILE"} <= set(given)
        clobbered = {k: v for k, v in env.items() if k in image_env and image_env[k] != v}
        assert not clobbered, f"{pod.name} sets {clobbered}; the image needs {image_env} (PATH: the venv)"


def test_ports_agree(smoke_pods):
    _, per_pod = smoke_pods
    exposed = {int(p) for i, a in instructions(DOCKERFILES["cpu"]) if i == "EXPOSE" for p in a.split()}
    for pod, env, (opts, _, _) in per_pod:
        declared = {p["containerPort"] for p in pod.container.get("ports", [])}
        assert declared <= exposed, f"{pod.name} declares {declared}; the image exposes {exposed}"
        given = dict(e.split("=", 1) for e in opts["--env"])
        if pod.role == "scheduler":
            assert declared == {int(given["DMLC_PS_ROOT_PORT"])}
        if pod.role == "server":  # its port and, one per lane, the ports after it
            first, lanes = int(given["GRADPRESS_SERVER_PORT"]), int(given.get("GRADPRESS_SERVER_LANES", "1"))
            assert declared == set(range(first, first + lanes))


def test_volumes_are_mounted_where_the_manifests_mount_them(smoke_pods):
    _, per_pod = smoke_pods
    for pod, env, (opts, _, _) in per_pod:
        mounted = {v.split(":")[1]: v for v in opts.get("--volume", [])}
        mounted.update({t.split(":")[0]: t for t in opts.get("--tmpfs", [])})
        for m in pod.container["volumeMounts"]:
            assert m["mountPath"] in mounted, f"{pod.name}: {m['mountPath']} is not mounted"
            if m.get("readOnly"):
                assert mounted[m["mountPath"]].endswith(":ro"), f"{pod.name}: {m['mountPath']} must be read-only"
        config = next(v.split(":")[0] for v in opts["--volume"] if v.split(":")[1] == "/etc/gradpress")
        assert os.path.basename(env["GRADPRESS_CONFIG"]) in os.listdir(config), \
            f"{pod.name}: the job file {env['GRADPRESS_CONFIG']} is not in the mounted ConfigMap"


@pytest.mark.integ  # starts processes
def test_smoke_stops_at_once_without_podman(tmp_path):
    out, took = run_without_podman([sys.executable, str(SMOKE), "--no-build"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "podman" in out.stderr and "installed" in out.stderr, out.stderr
    assert took < 20 and "[1/" not in out.stdout, "it must stop before any step"


@pytest.mark.integ  # starts processes
def test_smoke_stops_at_once_on_a_bad_base_name(tmp_path):
    out, took = run_without_podman([sys.executable, str(SMOKE), "--base", "Python:3.11 slim"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "'Python:3.11 slim' is not a valid image name" in out.stderr, out.stderr
    assert took < 20 and "[1/" not in out.stdout


@pytest.mark.parametrize("argv, message", [
    (["--base", "python:3.11-slim!"], "'python:3.11-slim!' is not a valid image name"),
    (["--tag", "gradpress//cpu"], "'gradpress//cpu' is not a valid image name"),
    ([], "neither podman nor buildah is installed"),
    (["--bogus"], "unknown argument '--bogus'"),
])
@pytest.mark.integ  # starts processes
def test_build_script_stops_at_once(tmp_path, argv, message):
    out, took = run_without_podman(["/bin/bash", str(BUILD), "--check", *argv], tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert took < 20


@pytest.mark.integ  # starts processes
def test_build_script_names_a_base_that_cannot_be_had(tmp_path):
    """A well-formed name of an image that is neither here nor pullable (needs podman)."""
    if subprocess.run(["sh", "-c", "command -v podman"], capture_output=True).returncode != 0:
        pytest.skip("podman is not installed: the base image's existence cannot be asked")
    if os.geteuid() != 0:
        pytest.skip("build.sh runs podman as root")
    out = subprocess.run(["/bin/bash", str(BUILD), "--check", "--base", "localhost:1/gradpress-no-such-base:0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    message = "base image 'localhost:1/gradpress-no-such-base:0' is not here and cannot be pulled"
    assert message in out.stderr, out.stderr
