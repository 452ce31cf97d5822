"""TOML job files: configs/*.toml load, wrong keys, types and tables are named, the environment wins."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradpress.config import Settings

REPO = Path(__file__).resolve().parents[1]
JOB_FILES = sorted((REPO / "configs").glob("*.toml"))


def job_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_there_are_job_files():
    assert {"demo.toml", "gpu.toml"} <= {p.name for p in JOB_FILES}


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_shipped_job_files_load(path):
    s = Settings.load({}, str(path))
    assert s.num_worker >= 1 and s.num_server >= 1
    assert s.heartbeat_timeout_s > s.heartbeat_interval_s


def test_file_values_are_used(tmp_path):
    path = job_file(tmp_path, "[settings]\nnum_server = 3\npartition_bytes = 1024\nenable_async = true\n"
                              "heartbeat_timeout_s = 20\nlog_level = 'INFO'\n")
    s = Settings.load({}, path)
    assert (s.num_server, s.partition_bytes, s.enable_async, s.log_level) == (3, 1024, True, "INFO")
    assert s.heartbeat_timeout_s == 20.0 and isinstance(s.heartbeat_timeout_s, float)  # int accepted for float


def test_config_file_from_environment(tmp_path):
    path = job_file(tmp_path, "[settings]\nnum_worker = 4\n")
    assert Settings.load({"GRADPRESS_CONFIG": path}).num_worker == 4


def test_environment_overrides_file(tmp_path):
    path = job_file(tmp_path, "[settings]\nnum_worker = 4\nnum_server = 3\nenable_async = true\n")
    s = Settings.load({"DMLC_NUM_WORKER": "2", "BYTEPS_ENABLE_ASYNC": "0", "DMLC_NUM_SERVER": ""}, path)
    assert s.num_worker == 2, "DMLC_NUM_WORKER must override the file"
    assert s.enable_async is False, "BYTEPS_ENABLE_ASYNC=0 must override the file"
    assert s.num_server == 3, "an empty variable must not override the file"


def test_unknown_key_is_named(tmp_path):
    path = job_file(tmp_path, "[settings]\nnum_workers = 2\n")
    with pytest.raises(ValueError, match=r"unknown setting 'num_workers'.*num_worker"):
        Settings.load({}, path)


@pytest.mark.parametrize("uri", ["localhost:9000", "tcp://10.0.0.1", "http://scheduler"])
def test_a_scheduler_address_with_a_port_or_a_scheme_is_refused_naming_the_port_variable(uri):
    """(``localhost:9000`` waited out the connect timeout for a host of that name.)"""
    with pytest.raises(ValueError, match=r"DMLC_PS_ROOT_URI=.*an address alone .*DMLC_PS_ROOT_PORT"):
        Settings.load({"DMLC_PS_ROOT_URI": uri})
    for fine in ("scheduler.default.svc", "10.0.0.1", "::1", "fe80::1"):
        assert Settings.load({"DMLC_PS_ROOT_URI": fine}).root_uri == fine


def test_a_job_file_cannot_name_another_job_file(tmp_path):
    """(It said "unknown setting 'config_file'; accepted: config_file, ...".)"""
    path = job_file(tmp_path, "[settings]\nconfig_file = 'other.toml'\n")
    with pytest.raises(ValueError, match="config_file cannot be set in a job file; it is this file"):
        Settings.load({}, path)
    with pytest.raises(ValueError, match=r"accepted: (?!config_file)"):
        Settings.load({}, job_file(tmp_path, "[settings]\nnum_workers = 2\n"))


def test_environment_name_as_key_is_rejected(tmp_path):
    path = job_file(tmp_path, "[settings]\nDMLC_NUM_WORKER = 2\n")
    with pytest.raises(ValueError, match="unknown setting 'DMLC_NUM_WORKER'"):
        Settings.load({}, path)


@pytest.mark.parametrize("line, expected", [
    ("partition_bytes = '4MB'", "partition_bytes = '4MB': expected int"),
    ("num_worker = 2.5", "num_worker = 2.5: expected int"),
    ("num_server = true", "num_server = True: expected int"),
    ("enable_async = 1", "enable_async = 1: expected bool"),
    ("root_uri = 10", "root_uri = 10: expected str"),
    ("heartbeat_interval_s = 'fast'", "heartbeat_interval_s = 'fast': expected float"),
])
def test_wrong_type_is_named(tmp_path, line, expected):
    path = job_file(tmp_path, f"[settings]\n{line}\n")
    with pytest.raises(ValueError) as e:
        Settings.load({}, path)
    assert expected in str(e.value) and path in str(e.value), str(e.value)


@pytest.mark.parametrize("line, expected", [
    ("num_server = 0", "DMLC_NUM_SERVER=0: must be at least 1"),
    ("role = 'boss'", "DMLC_ROLE='boss'"),
    ("heartbeat_timeout_s = 0.5", "PS_HEARTBEAT_TIMEOUT=0.5 must exceed"),
    ("root_port = 70000", "DMLC_PS_ROOT_PORT=70000: not a port number"),
    ("server_id = 1", r"GRADPRESS_SERVER_ID=1: must be in \[0, DMLC_NUM_SERVER=1\) or unset"),
    # nan passes every range check by failing its comparison; inf is a deadline never met
    ("op_timeout_s = nan", "GRADPRESS_OP_TIMEOUT_S=nan: must be a finite number"),
    ("heartbeat_timeout_s = inf", "PS_HEARTBEAT_TIMEOUT=inf: must be a finite number"),
    ("peer_rate = nan", "GRADPRESS_PEER_RATE=nan: must be a finite number"),
    # a cap of 0, or below -1, would have meant the default without a word
    ("server_max_keys = 0", "GRADPRESS_SERVER_MAX_KEYS=0: a cap of at least 1"),
    ("server_max_key_bytes = -5", "GRADPRESS_SERVER_MAX_KEY_BYTES=-5: a cap of at least 1"),
    # past these, ZeroMQ's send timeout and Python's waits overflow deep in a job, naming nothing
    ("heartbeat_timeout_s = 3e6", "PS_HEARTBEAT_TIMEOUT=3000000.0: seconds, more than 0 and at most 1000000"),
    ("op_timeout_s = 1e10", "GRADPRESS_OP_TIMEOUT_S=10000000000.0: seconds, more than 0 and at most 1000000"),
    ("partition_bytes = 10000000000000000000", "BYTEPS_PARTITION_BYTES=10000000000000000000: at most 1073741824"),
])
def test_wrong_value_is_named(tmp_path, line, expected):
    path = job_file(tmp_path, f"[settings]\n{line}\n")
    with pytest.raises(ValueError, match=expected.replace(".", r"\.")):
        Settings.load({}, path)


def test_unknown_table_is_named(tmp_path):
    path = job_file(tmp_path, "[settings]\nnum_worker = 2\n\n[setting]\nnum_server = 2\n")
    with pytest.raises(ValueError, match=r"unknown table\(s\) \['setting'\]"):
        Settings.load({}, path)


def test_compression_table_is_accepted(tmp_path):
    path = job_file(tmp_path, """
[settings]
num_worker = 2

[compression.default]
compressor = "onebit"
ef = "vanilla"

[[compression.rules]]
pattern = "*.bias"
compressor = "none"
""")
    assert Settings.load({}, path).num_worker == 2


def test_settings_must_be_a_table(tmp_path):
    path = job_file(tmp_path, "settings = 3\n")
    with pytest.raises(ValueError, match=r"\[settings\] must be a table"):
        Settings.load({}, path)


def test_broken_or_missing_file_is_named(tmp_path):
    path = job_file(tmp_path, "[settings\nnum_worker = 2\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        Settings.load({}, path)
    with pytest.raises(ValueError, match="config file .*nope.toml"):
        Settings.load({}, str(tmp_path / "nope.toml"))


# ---- through gradpress-launch --config -------------------------------------

def launch(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "GRADPRESS_", "PS_"))}
    return subprocess.run([sys.executable, "-m", "gradpress.launcher", *args], env=dict(base, **env),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.integ  # starts processes
def test_launch_rejects_a_wrong_key_by_name(tmp_path):
    path = job_file(tmp_path, "[settings]\nheartbeat_interval = 1.0\n")
    out = launch(["--config", path], {"DMLC_ROLE": "scheduler"})
    assert out.returncode == 2, out.stderr
    assert "unknown setting 'heartbeat_interval'" in out.stderr


@pytest.mark.integ  # starts processes
def test_launch_reads_the_file_and_the_environment_wins(tmp_path):
    """A scheduler nobody joins gives up after GRADPRESS_CONNECT_TIMEOUT_S: from the env, not the file."""
    path = job_file(tmp_path, "[settings]\nconnect_timeout_s = 600.0\nheartbeat_interval_s = 0.2\n"
                              "heartbeat_timeout_s = 2.0\nlog_level = 'INFO'\n")
    start = time.monotonic()
    out = launch(["--config", path], {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0",
                                      "GRADPRESS_CONNECT_TIMEOUT_S": "0.5", "GRADPRESS_JOB_SECRET": "s" * 32})
    assert out.returncode == 1, out.stderr
    assert "scheduler listening on port" in out.stderr, f"log_level = 'INFO' from the file was not used:\n{out.stderr}"
    assert "GRADPRESS_CONNECT_TIMEOUT_S=0.5" in out.stderr, out.stderr
    assert time.monotonic() - start < 30, "the file's 600 s connect timeout won over the environment"


def test_io_threads_follow_the_cores_under_curve_and_the_setting_wins():
    from gradpress import host
    from gradpress.net import transport
    assert transport.io_threads(Settings(io_threads=5)) == 5
    assert transport.io_threads(Settings(security="auth")) == transport.IO_THREADS
    assert transport.io_threads(Settings()) == max(2, min(16, int(host.cores())))
    with pytest.raises(ValueError, match="GRADPRESS_IO_THREADS=0"):
        Settings(io_threads=0)


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_a_deadline_from_the_environment_must_be_finite(raw):
    with pytest.raises(ValueError, match=f"GRADPRESS_CONNECT_TIMEOUT_S={raw}: must be a finite number"):
        Settings.load({"GRADPRESS_CONNECT_TIMEOUT_S": raw})


def test_launch_refuses_a_job_size_without_local(capsys):
    """--workers/--servers size a --local job; a by-hand start used to ignore them silently."""
    from gradpress import launcher
    with pytest.raises(SystemExit) as caught:
        launcher.main(["--workers", "4", "--", sys.executable, "train.py"])
    assert caught.value.code == 2
    assert "--workers and --servers size a --local job" in capsys.readouterr().err


def test_launch_refuses_more_processes_than_a_machine_may_hold_before_starting_any(capsys, monkeypatch):
    """(``--workers 100000`` or ``BYTEPS_LOCAL_SIZE=100000`` started spawning them; only their
    registration was refused.)"""
    from gradpress import launcher
    with pytest.raises(SystemExit) as caught:
        launcher.main(["--local", "--workers", "100000", "--", sys.executable, "train.py"])
    assert caught.value.code == 2
    assert "--workers 100000 --servers 1: a --local job runs on this machine, at most 1024" in capsys.readouterr().err
    monkeypatch.setenv("BYTEPS_LOCAL_SIZE", "100000")
    assert launcher.run_workers([sys.executable, "train.py"], Settings(role="worker")) == 2
    assert "BYTEPS_LOCAL_SIZE=100000 is not in [1, 1024]" in capsys.readouterr().err


@pytest.mark.parametrize("table, expected", [
    ('[compression.default]\ncompressor = "topk"\nk = 0\n', r"\[compression\]: compression default: .*\['k'\] = 0"),
    ("compression = 5\n", "compression must be a table"),
])
def test_launch_checks_the_job_files_compression_before_anything_starts(tmp_path, monkeypatch, capsys, table,
                                                                         expected):
    """It used to be read only by the workers' optimizers, once scheduler and servers ran."""
    from gradpress import launcher
    monkeypatch.setenv("GRADPRESS_CONFIG", "")  # (main sets it; restored after the test)
    path = job_file(tmp_path, table)
    assert launcher.main(["--config", path, "--local", "--", sys.executable, "train.py"]) == 2
    err = capsys.readouterr().err
    assert f"config file {path}" in err and re.search(expected, err), err
