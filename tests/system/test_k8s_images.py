"""deploy/docker: the image files agree with the Makefile and the manifests that run them.

No Docker engine runs in CI, so the Dockerfiles are checked by reading: the torch pin,
the entry point, the working directory, user and ports the manifests rely on, what is
copied and what the ignore file lets through. deploy/docker/smoke.py builds and runs the
CPU image for real (docs/deploy.md); tests/system/test_docker_smoke.py checks that it runs the
manifests' pods unchanged.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cpu": REPO / "deploy/docker/Dockerfile.cpu", "cuda": REPO / "deploy/docker/Dockerfile.cuda"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", text, re.M)]


def args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in instructions(path) if i == "ARG" and "=" in a)


def base_pod_specs() -> list[dict]:
    docs = [d for f in sorted((REPO / "deploy/k8s/base").glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_torch_is_pinned_as_in_the_makefile(flavour):
    pin = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert pin, "the Makefile no longer pins torch as TORCH ?= torch==X"
    assert args(DOCKERFILES[flavour]).get("TORCH_VERSION") == pin.group(1), \
        f"Dockerfile.{flavour}: TORCH_VERSION must be the Makefile's {pin.group(1)}"
    runs = " ".join(a for i, a in instructions(DOCKERFILES[flavour]) if i == "RUN")
    assert '"torch==$TORCH_VERSION"' in runs and '--index-url "$TORCH_INDEX"' in runs


def test_build_script_looks_for_the_pinned_torch_wheel():
    """build.sh mounts a local wheel directory only if it holds the pinned CPU build; it reads
    the version from the Dockerfile, so the pin lives in one place per file."""
    build = (REPO / "deploy/docker/build.sh").read_text()
    assert "sed -n 's/^ARG TORCH_VERSION=//p' \"$here/Dockerfile.cpu\"" in build
    assert '"$wheels/torch-$torch_version+cpu-*.whl"' in build
    assert "ARG TORCH_VERSION=" in (REPO / "deploy/docker/Dockerfile.cpu").read_text()


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_entry_point_and_what_the_manifests_rely_on(flavour):
    steps = instructions(DOCKERFILES[flavour])
    assert [a for i, a in steps if i == "ENTRYPOINT"][-1] == '["gradpress-launch"]'
    workdir = [a for i, a in steps if i == "WORKDIR"][-1]
    user = [a for i, a in steps if i == "USER"][-1]
    for spec in base_pod_specs():
        c = spec["containers"][0]
        assert c["workingDir"] == workdir, f"manifests run in {c['workingDir']}, Dockerfile.{flavour} in {workdir}"
        assert c["command"] == ["gradpress-launch"]
        assert user == f"{spec['securityContext']['runAsUser']}:{spec['securityContext']['runAsGroup']}", \
            f"Dockerfile.{flavour} USER {user} is not the manifests' runAsUser:runAsGroup"
    env = " ".join(a for i, a in steps if i == "ENV")
    assert "NUMBA_CACHE_DIR=/tmp/" in env, "the unprivileged user cannot write Numba's cache next to the package"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_exposed_ports_are_the_manifests_ports(flavour):
    exposed = {int(p.split("/")[0]) for i, a in instructions(DOCKERFILES[flavour]) if i == "EXPOSE" for p in a.split()}
    declared = {p["containerPort"] for spec in base_pod_specs() for p in spec["containers"][0].get("ports", [])}
    assert declared and exposed == declared, \
        f"Dockerfile.{flavour} exposes {sorted(exposed)}, the pods declare {sorted(declared)}"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_ignore_file_lets_through_what_is_copied(flavour):
    """The build context is the repository root; each Dockerfile's own ignore file (Docker
    reads ``<Dockerfile>.dockerignore``) excludes everything else."""
    path = DOCKERFILES[flavour]
    ignore = path.with_name(path.name + ".dockerignore")
    assert ignore.is_file(), f"no {ignore.name}: Docker would send the whole repository (.venv, .git) to the builder"
    rules = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "the ignore file should exclude everything first (the venv, .git)"
    let_through = {r[1:] for r in rules if r.startswith("!")}
    for i, a in instructions(path):
        if i == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert any(fnmatch.fnmatch(entry, src) for entry in let_through), \
                    f"Dockerfile.{flavour} copies {src}, which {ignore.name} excludes"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_copies_what_the_job_runs(flavour):
    copied = {src for i, a in instructions(DOCKERFILES[flavour]) if i == "COPY" for src in a.split()[:-1]}
    for needed in ("pyproject.toml", "gradpress", "examples", "configs"):
        assert needed in copied, f"Dockerfile.{flavour} does not copy {needed}"
        assert (REPO / needed).exists()
    runs = " ".join(a for i, a in instructions(DOCKERFILES[flavour]) if i == "RUN")
    assert "pip install . scikit-learn" in runs, "gradpress itself and the demo's data set must be installed"
    worker_args = [s["containers"][0].get("args", []) for s in base_pod_specs() if s.get("restartPolicy") == "Never"]
    script = next(a for a in worker_args[0] if a.endswith(".py"))
    assert (REPO / script).is_file(), f"the workers run {script}, which is not in the repository"


def test_cuda_image_and_torch_build_agree():
    a = args(DOCKERFILES["cuda"])
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-devel-", a["CUDA_IMAGE"])
    assert cuda, f"CUDA_IMAGE={a['CUDA_IMAGE']}: numba.cuda needs a -devel image (NVVM, libdevice)"
    assert a["TORCH_INDEX"].endswith(f"/cu{cuda.group(1)}{cuda.group(2)}"), \
        f"TORCH_INDEX={a['TORCH_INDEX']} does not match CUDA {cuda.group(1)}.{cuda.group(2)}"
