"""benchmarks/results.py: every benchmark prints its RESULT line and, when asked, keeps it as
a record with the machine, the commit, the date and the command."""
import datetime as dt
import json
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import results  # noqa: E402

# gpu.py is the lead's to wire; stack_sampler.py samples stacks and measures nothing
NOT_WIRED_HERE = {"gpu.py", "stack_sampler.py"}


@pytest.fixture
def no_processes(monkeypatch):
    """The commit and the GPUs without starting git or nvidia-smi."""
    monkeypatch.setattr(results, "git_state", lambda: ("0" * 40, ["gradpress/x.py"]))
    monkeypatch.setattr(results, "gpus", lambda: [])


def test_without_a_results_folder_only_the_result_line_is_printed(monkeypatch, capsys, no_processes):
    monkeypatch.delenv(results.RESULTS_DIR_ENV, raising=False)
    assert results.emit("bench", {"a_s": 1.5, "n": 3}) is None
    assert capsys.readouterr().out.splitlines()[-1] == 'RESULT {"a_s": 1.5, "n": 3}'


def test_a_record_holds_the_result_the_commit_the_command_the_settings_and_the_machine(
        tmp_path, monkeypatch, capsys, no_processes):
    monkeypatch.setenv(results.RESULTS_DIR_ENV, str(tmp_path / "out"))
    monkeypatch.setenv("GRADPRESS_SHM", "0")
    monkeypatch.setenv("GRADPRESS_JOB_SECRET", "x" * 40)
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench.py", "--quick", "--name", "a b"])
    path = results.emit("bench", {"a_s": 1.5})
    assert capsys.readouterr().out.splitlines()[-1] == 'RESULT {"a_s": 1.5}', "RESULT must stay the last line"
    assert path.parent == tmp_path / "out" and path.name.startswith("bench-")
    rec = json.loads(path.read_text())
    assert rec["result"] == {"a_s": 1.5} and rec["benchmark"] == "bench" and rec["source"] == "run"
    assert rec["commit"] == "0" * 40 and rec["changed_files"] == ["gradpress/x.py"]
    assert rec["command"] == f"{sys.executable} benchmarks/bench.py --quick --name 'a b'"
    assert rec["environment"]["GRADPRESS_SHM"] == "0"
    assert not any("SECRET" in k for k in rec["environment"]), "the job secret must never be written"
    assert rec["machine"]["cores"] == os.cpu_count() and rec["machine"]["cpu"]
    assert rec["machine"]["memory_gib"] > 0 and rec["machine"]["gpus"] == []
    age = dt.datetime.now(dt.timezone.utc) - results.when(rec)
    assert dt.timedelta(0) <= age < dt.timedelta(minutes=5)


def test_two_records_in_one_second_do_not_overwrite_each_other(tmp_path, no_processes):
    now = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.timezone.utc)
    a = results.write(results.record("b", {"x": 1}, now=now), tmp_path)
    b = results.write(results.record("b", {"x": 2}, now=now), tmp_path)
    assert a != b and results.load(a)["result"] == {"x": 1} and results.load(b)["result"] == {"x": 2}


def test_a_child_that_reports_names_the_command_and_settings_its_parent_ran_with(monkeypatch, no_processes):
    monkeypatch.setattr(sys, "argv", ["benchmarks/parent.py", "--rows", "10"])
    monkeypatch.setenv("GRADPRESS_SHM", "1")
    for k, v in results.child_env().items():   # what the parent hands its child
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["benchmarks/parent.py", "--_worker"])
    monkeypatch.setenv("GRADPRESS_SHM", "0")     # the child's own settings
    monkeypatch.setenv("DMLC_ROLE", "worker")
    rec = results.record("parent", {})
    assert rec["command"] == f"{sys.executable} benchmarks/parent.py --rows 10"
    assert rec["environment"]["GRADPRESS_SHM"] == "1" and "DMLC_ROLE" not in rec["environment"]


def test_the_latest_record_is_the_latest_date_whatever_its_precision(tmp_path):
    for name, date in (("a", "2026-11-24T00:22Z"), ("b", "2026-11-26"), ("c", "2026-11-25T23:59:59Z")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"date": date, "result": {"name": name}}))
    path, rec = results.latest(tmp_path)
    assert path.name == "b.json" and rec["result"] == {"name": "b"}
    with pytest.raises(FileNotFoundError, match="no result records"):
        results.latest(tmp_path / "empty")


def test_every_benchmark_reports_through_results_emit():
    printing = [p.name for p in sorted(BENCHMARKS.glob("*.py"))
                if 'print("RESULT' in p.read_text() and p.name not in NOT_WIRED_HERE | {"results.py"}]
    assert not printing, f"{printing} print RESULT themselves: call results.emit(name, result) instead"
