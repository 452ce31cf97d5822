"""Every command in a fenced block of README.md and docs/*.md runs in this suite, or its block
says what it needs that the suite does not have.

The convention, for the docs' writers:
- every fenced block names its language: ``sh`` for commands, ``text`` for output and trees,
  ``python``, ``toml``, ``yaml`` for code (which must parse);
- an ``sh`` block whose first line is ``# needs: root``, ``gpu``, ``kubernetes`` or
  ``network`` (several with commas, a reason in brackets after) is not run;
- every other command (``\\``-continued lines joined, comments dropped) must be a key of
  ``RUNS`` below, which names the case that runs it: as written where it is quick, on tiny
  sizes (fewer steps, a scratch copy of the files it writes) where it is not.

docs/history/ is a record of past runs and is not checked.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NEEDS = {"root", "gpu", "kubernetes", "network"}
FENCE = re.compile(r"^```(\S*)\s*$")
BIN = Path(sys.executable).parent

# every documented command -> the case below that runs it
RUNS = {
    "make demo": "demo",
    "make test": "suite",
    "gradpress-launch --local --workers 2 --servers 1 -- python examples/train_digits.py --epochs 1": "launch",
    "GRADPRESS_TRACE=/tmp/gp/trace.json gradpress-launch --local --workers 2 --servers 1 -- "
    "python examples/train_digits.py": "trace",
    "GRADPRESS_RESULTS_DIR=benchmarks/results/server_round python benchmarks/server_round.py "
    "--rounds 4 --trials 1": "results",
    "python benchmarks/perf_tables.py --check": "results",
    "python benchmarks/perf_tables.py": "results",
    "gradpress-plan docs/planner_profile_tfm.json": "plan",
    "gradpress-plan docs/planner_profile_tfm.json --workers 64 --servers 64 --bandwidth 10gbit": "plan",
    "gradpress-plan docs/planner_profile_tfm.json --sweep-workers 8,128,1024 "
    "--sweep-bandwidth 1gbit,100gbit --json": "plan",
    "python benchmarks/convergence.py": "convergence",
    "python benchmarks/convergence.py --quick": "convergence",
    "python benchmarks/convergence.py --tasks digits --settings adam,onebit_adam": "convergence",
    "python benchmarks/convergence.py --define 'mine={\"params\": {\"compressor\": \"topk\", \"k\": 0.05, "
    "\"ef\": \"vanilla\"}}' --settings adam,mine": "convergence",
    "python3 -c 'import secrets; print(secrets.token_hex(32))' > deploy/k8s/base/job-secret": "k8s",
    "kubectl kustomize deploy/k8s/overlays/cpu-demo": "k8s",
    "kubectl kustomize deploy/k8s/overlays/cpu-demo | kubernetes-validate --strict -k 1.32.0 -": "k8s",
}


def blocks():
    """(page, first line number, language, lines) of every fenced block."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                yield page, i + 1, m[1], lines[i + 1:end]
                i = end
            i += 1


def commands(body: list[str]) -> list[str]:
    """The block's commands, continued lines joined and comments dropped, each as shlex
    writes it (so spacing and quoting do not matter)."""
    out, pending = [], ""
    for line in body:
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        words = shlex.split(pending, comments=True)
        if words:
            out.append(shlex.join(words))
        pending = ""
    return out


def needs(body: list[str]) -> set[str] | None:
    m = re.fullmatch(r"# needs: ([a-z, ]+?)(?: \(.*\))?", body[0].strip()) if body else None
    return {w.strip() for w in m[1].split(",")} if m else None


BLOCKS = list(blocks())
DOCUMENTED = {c for _, _, lang, body in BLOCKS if lang == "sh" and needs(body) is None for c in commands(body)}
RUN_KEYS = {shlex.join(shlex.split(k)): case for k, case in RUNS.items()}


def of(case: str) -> list[str]:
    """The commands ``case`` runs, as the docs write them (pipes and redirections work)."""
    return [command for command, c in RUNS.items() if c == case]


def where(page: Path, line: int) -> str:
    return f"{page.relative_to(REPO)}:{line}"


def test_every_fenced_block_names_its_language_and_its_code_parses():
    for page, line, lang, body in BLOCKS:
        text = "\n".join(body)
        assert lang in ("sh", "text", "python", "toml", "yaml"), \
            f"{where(page, line)}: a fenced block names its language (sh, text, python, toml, yaml), not {lang!r}"
        if lang == "python":
            ast.parse(text)
        elif lang == "toml":
            tomllib.loads(text)
        elif lang == "yaml":
            yaml = pytest.importorskip("yaml")
            yaml.safe_load(text)


def test_a_block_marked_as_needing_something_names_what():
    for page, line, lang, body in BLOCKS:
        if lang == "sh" and body and body[0].lstrip().startswith("# needs"):
            assert needs(body) and needs(body) <= NEEDS, \
                f"{where(page, line)}: '{body[0].strip()}': needs one or more of {sorted(NEEDS)}"


def test_every_documented_command_runs_in_the_suite_or_its_block_says_what_it_needs():
    for page, line, lang, body in BLOCKS:
        if lang != "sh" or needs(body) is not None:
            continue
        for command in commands(body):
            assert command in RUN_KEYS, (
                f"{where(page, line)}: `{command}` is neither run by the suite nor marked: add it to RUNS in "
                f"{Path(__file__).relative_to(REPO)} with a case that runs it, or start its block with "
                f"'# needs: root' (or gpu, kubernetes, network)")
    gone = set(RUN_KEYS) - DOCUMENTED
    assert not gone, f"RUNS lists commands no page shows any more: {sorted(gone)}"


# -- the cases ------------------------------------------------------------------------------------

def run(command: str, cwd: Path, timeout: int, **env: str) -> subprocess.CompletedProcess:
    """``command`` through bash, with this venv's python, gradpress-launch and the rest first on PATH."""
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1", **env}
    full.pop("GRADPRESS_RESULTS_DIR", None)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


def ok(r: subprocess.CompletedProcess, what: str) -> str:
    assert r.returncode == 0, f"{what} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def recipe(target: str) -> list[str]:
    """A Makefile target's commands, $(BIN) and $(PY) made this venv's."""
    text = (REPO / "Makefile").read_text()
    body = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)[1]
    return [line.strip().replace("$(BIN)", str(BIN)).replace("$(PY)", sys.executable)
            for line in body.splitlines()]


def case_demo(tmp_path):
    """`make demo` is `setup` (the venv this suite runs in) and then the demo job, run here
    for 3 steps."""
    [job] = recipe("demo")
    out = ok(run(job, REPO, 120, GRADPRESS_DEMO_MAX_STEPS="3"), "the demo")
    assert re.search(r"^\[worker 0\] final test accuracy: 0\.\d{4}$", out, re.M), out[-500:]


def case_suite(tmp_path):
    """`make test` is this suite: its recipe runs ruff, compiles the kernels every node loads
    (run here: on this warm tree it loads them), then pytest on 2 processes."""
    lint, kernels, suite = recipe("test")
    assert (lint, suite) == (f"{BIN}/python -m ruff check .", f"{BIN}/python -m pytest -q -n 2")
    assert "warm_up('server')" in kernels and "warm_up('worker')" in kernels, kernels
    ok(run(kernels, REPO, 120), "the kernels' compile step")


def case_launch(tmp_path):
    command = of("launch")[0]
    out = ok(run(command, REPO, 120, GRADPRESS_DEMO_MAX_STEPS="3"), command)
    assert "[worker 0] final test accuracy: 0." in out


def case_trace(tmp_path):
    command = of("trace")[0].replace("/tmp/gp/", f"{tmp_path}/")
    ok(run(command, REPO, 120, GRADPRESS_DEMO_MAX_STEPS="2"), command)
    written = sorted(p.name for p in tmp_path.glob("trace-*.json"))
    assert {"trace-worker0.json", "trace-worker1.json", "trace-server0.json"} <= set(written), written


def case_results(tmp_path):
    """performance.md's three commands, in order, in a scratch copy of the pages and the
    benchmarks (the record and the rewritten tables land there)."""
    for part in ("benchmarks", "docs"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "README.md", tmp_path)
    measure, check, rewrite = of("results")
    assert "randomk_server_round_values_ms" in ok(run(measure, tmp_path, 120), measure)
    assert len(list((tmp_path / "benchmarks/results/server_round").glob("server_round-*.json"))) >= 1
    stale = run(check, tmp_path, 60)
    assert stale.returncode == 1 and "benchmarks/results/server_round is stale" in stale.stdout, stale.stdout
    assert "rewrote docs/performance.md" in ok(run(rewrite, tmp_path, 60), rewrite)
    ok(run(check, tmp_path, 60), "the check after the rewrite")


def case_plan(tmp_path):
    for command in of("plan"):
        assert ok(run(command, REPO, 60), command).strip(), command


def case_convergence(tmp_path):
    """The study's four commands differ in tasks, settings, seeds and steps, which the script
    reads alike: one job on digits, 2 steps, of the --define'd setting covers them."""
    command = ("python benchmarks/convergence.py --tasks digits --seeds 0 --steps 2 --charts '' --settings mine "
               "--define 'mine={\"params\": {\"compressor\": \"topk\", \"k\": 0.05, \"ef\": \"vanilla\"}}'")
    out = ok(run(command, REPO, 240), command)
    result = out.strip().splitlines()[-1]
    assert result.startswith("RESULT ") and "digits_mine_acc" in result, result


def case_k8s(tmp_path):
    """deploy.md's secret, then its render and validation, in a scratch copy of deploy/ and configs/."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    for part in ("deploy", "configs"):
        shutil.copytree(REPO / part, tmp_path / part)
    (tmp_path / "deploy/k8s/base/job-secret").unlink(missing_ok=True)
    secret, render, validate = of("k8s")
    ok(run(secret, tmp_path, 30), secret)
    assert re.fullmatch(r"[0-9a-f]{64}\n", (tmp_path / "deploy/k8s/base/job-secret").read_text())
    assert "kind: Job" in ok(run(render, tmp_path, 60), render)
    ok(run(validate, tmp_path, 120), validate)


CASES = {"demo": case_demo, "suite": case_suite, "launch": case_launch, "trace": case_trace,
         "results": case_results, "plan": case_plan, "convergence": case_convergence, "k8s": case_k8s}


def test_every_case_named_in_runs_exists():
    assert set(RUNS.values()) == set(CASES), set(RUNS.values()) ^ set(CASES)


@pytest.mark.integ
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_documented_commands_run(case, tmp_path):
    CASES[case](tmp_path)
