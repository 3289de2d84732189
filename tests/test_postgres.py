"""Sweeps shared by machines: sweep.py processes on one study in a real PostgreSQL server (Debian's
binaries), each in its own folder as on its own machine; one of them killed with SIGKILL
mid-trial."""

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import PROBES, QUIET, SWEEP, run_sweep, write_mnist

PG_BIN = Path("/usr/lib/postgresql/15/bin")
BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2", *QUIET]

pytestmark = pytest.mark.slow  # a server and sweep processes: seconds each


def as_server_user() -> list[str]:
    """PostgreSQL refuses to run as root: under root, the commands run as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own on a free localhost port, for this module; a function that
    makes a database in it and returns its SQLAlchemy URL."""
    if not (PG_BIN / "initdb").is_file():
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN}/initdb: Debian's postgresql-15)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as the postgres user")
    # not tmp_path: the server's user must reach it
    folder = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = [*as_server_user(), str(PG_BIN / "initdb"), "-D", str(folder / "data"), "-U", "sweep",
           "--auth=trust", "--no-sync", "-E", "UTF8"]
    subprocess.run(run, check=True, capture_output=True)
    server = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*as_server_user(), str(PG_BIN / "pg_ctl"), "-D", str(folder / "data"),
                    "-l", str(folder / "server.log"), "-o", server, "-w", "start"],
                   check=True, capture_output=True)

    def database(name: str) -> str:
        subprocess.run([*as_server_user(), str(PG_BIN / "createdb"), "-h", "127.0.0.1",
                        "-p", str(port), "-U", "sweep", name], check=True, capture_output=True)
        return f"postgresql+psycopg://sweep@127.0.0.1:{port}/{name}"

    try:
        yield database
    finally:
        subprocess.run([*as_server_user(), str(PG_BIN / "pg_ctl"), "-D", str(folder / "data"),
                        "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def start(args: list[str], machine: Path) -> subprocess.Popen:
    machine.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, SWEEP, *args], cwd=machine,
                            env={**os.environ, **PROBES},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pattern: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 120
    while not glob.glob(pattern, recursive=True):
        if proc.poll() is not None:
            pytest.fail(f"{what}: {proc.communicate()[1][-3000:]}")
        assert time.time() < deadline, what
        time.sleep(0.05)


def test_two_machines_share_one_study_and_a_killed_ones_trial_runs_again_once(postgres,
                                                                             tmp_path,
                                                                             monkeypatch,
                                                                             capfd):
    """Machine a prepares the study (its grid enqueued once) and is killed (SIGKILL) in its first
    trial (test_sweep.Hold keeps it there); machine b (this process) runs the other settings, and
    its next sweep, once a's heartbeat is stale, runs a's trial again. Each setting completes
    once, each trial on one machine."""
    url, lrs = postgres("shared"), [1e-05, 0.0001, 0.001]  # three different accuracies
    data = write_mnist(tmp_path / "data")
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--grid", f"model.optimizer.lr={','.join(map(str, lrs))}", "--name", "shared",
            "--storage", url, "--heartbeat", "1", *BASE, "--data.data_dir", str(data),
            "--trainer.callbacks+=test_sweep.Hold", f"--trainer.callbacks.flag={tmp_path / 'f'}",
            f"--trainer.callbacks.until={tmp_path / 'never'}"]
    first = start(args, a)
    wait_for(str(tmp_path / "f"), first, "machine a trained no step")
    first.kill()  # mid-trial
    assert first.wait() == -signal.SIGKILL
    killed_at = time.time()
    b.mkdir()
    monkeypatch.chdir(b)
    assert run_sweep(args) == 0
    assert "Best: trial" in capfd.readouterr().out  # (a's trial running, or run again if stale)
    time.sleep(max(0.0, killed_at + 3.5 - time.time()))  # three heartbeats: a's trial is stale
    assert run_sweep(args) == 0
    again = capfd.readouterr().out
    trials = optuna.load_study(study_name="shared", storage=url).get_trials()
    (held,) = (a / "lightning_logs" / "sweeps" / "shared").glob("trial_*")
    killed = trials[int(held.name.removeprefix("trial_"))]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.params["model.optimizer.lr"] for t in complete) == lrs  # each once
    assert len(trials) == len(lrs) + 1 and trials[killed.number].state.name == "FAIL"
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.state.name == "COMPLETE" and retry.params == killed.params
    for t in trials:  # each on one machine: b, but for the killed one
        folders = [m / "lightning_logs" / "sweeps" / "shared" / f"trial_{t.number:04d}"
                   for m in (a, b)]
        assert [f.is_dir() for f in folders] == [t.number == killed.number,
                                                t.number != killed.number]
    best = max(complete, key=lambda t: t.value)
    rows = (b / "lightning_logs" / "sweeps" / "shared" / "summary.csv").read_text().splitlines()
    assert len(rows) == len(trials) + 1 and sum(",FAIL," in row for row in rows) == 1
    config = yaml.safe_load((b / "lightning_logs" / "sweeps" / "shared" / "best.yaml").read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == best.params[
        "model.optimizer.lr"]
    assert f"Best: trial {best.number}, val/acc_best {best.value:.4f}" in again


def test_the_summary_of_a_study_whose_only_trial_runs_or_died(postgres, tmp_path, capfd):
    """No trial has a value yet: the table says so (the summary after a kill -9 of a one-setting
    sweep), and the sweep that a killed worker ended exits 1, in one line."""
    from argparse import Namespace

    from lit_sweep import study as studies

    url = postgres("running")
    study = optuna.create_study(study_name="r", storage=url)
    study.ask({"model.lr": optuna.distributions.FloatDistribution(0.001, 0.1)})
    opts = Namespace(name="r", folder=tmp_path, objective="val/acc_best")
    assert studies.finish(optuna.load_study(study_name="r", storage=url), opts, [-9]) == 1
    out, err = capfd.readouterr()
    assert "RUNNING" in out and "Best" not in out and not (tmp_path / "best.yaml").exists()
    assert err == ("sweep.py: stopped with 0 trials complete or pruned; the same command goes on "
                   "with the study\n")
    assert (tmp_path / "summary.csv").read_text().count("RUNNING") == 1


def test_a_storage_that_cannot_be_opened_is_one_line(postgres, tmp_path, monkeypatch, capsys):
    url = postgres("exists").rsplit("/", 1)[0] + "/nothing"
    monkeypatch.chdir(tmp_path)
    assert run_sweep(["--storage", url, *BASE, "--data.data_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"sweep.py: error: --storage {url}: cannot open it (" in err
    assert 'database "nothing" does not exist' in err
