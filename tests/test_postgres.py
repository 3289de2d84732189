"""Sweeps shared by machines: sweep.py processes on one study in a real PostgreSQL server (Debian's
binaries), each in its own folder as on its own machine; one of them killed with SIGKILL
mid-trial."""

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
import sqlalchemy
import yaml
from conftest import QUIET, ROOT, SWEEP, write_mnist

import sweep_workers

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
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    return out


def waiting_for_the_turn(connection) -> int:
    """How many other connections to the server have asked for a turn (ServerTurn)."""
    query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid() AND query LIKE 'SELECT pg_try_advisory_lock%'")
    return connection.execute(sqlalchemy.text(query)).scalar()


def test_the_turn_to_choose_a_trial_is_the_whole_studys_on_every_machine(postgres):
    """Each ServerTurn is a connection of its own, as each machine's process has: while one holds
    the study's turn no other gets it, another study's turn is free, and giving it back hands
    it on."""
    url = postgres("turns")
    first, second, another = (sweep_workers.ServerTurn(url, name) for name in ("s", "s", "t"))
    assert first.try_take() and not second.try_take() and another.try_take()
    first.give_back()
    assert second.try_take() and not first.try_take()
    assert sweep_workers.study_turn(url, Path("f"), "s").key == first.key
    for turn in (first, second, another):
        turn.connection.close()


def ran_on(trial: optuna.trial.FrozenTrial, machines: list[Path]) -> list[Path]:
    return [m for m in machines if trial.user_attrs["log_dir_seed_0"].startswith(str(m))]


def test_two_machines_share_one_study_and_run_each_setting_once(postgres, tmp_path):
    url, lrs = postgres("shared"), [1e-05, 3e-05, 0.0001, 0.0003]  # four different accuracies
    data = write_mnist(tmp_path / "data")
    args = ["--grid", f"model.lr={','.join(map(str, lrs))}", "--name", "shared", "--storage", url,
            "--heartbeat", "1", *BASE, "--trainer.max_epochs", "6", "--data.data_dir", str(data)]
    machines = [tmp_path / "a", tmp_path / "b"]
    held = sweep_workers.ServerTurn(url, "shared")  # a third machine's turn, for a while
    assert held.try_take()
    procs = [start(args, m) for m in machines]
    deadline = time.time() + 90
    while waiting_for_the_turn(held.connection) < 2:  # both machines' workers
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.1)
    assert optuna.load_study(study_name="shared", storage=url).get_trials() == []
    held.give_back()
    outs = [finish(p) for p in procs]
    trials = optuna.load_study(study_name="shared", storage=url).get_trials()
    assert sorted(t.params["model.lr"] for t in trials) == lrs
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)  # none left running
    for t in trials:  # on one machine, printed by it alone
        (machine,) = ran_on(t, machines)
        assert [f"trial {t.number} (" in out for out in outs] == [m == machine for m in machines]
    assert all(any(ran_on(t, machines) == [m] for t in trials)
               for m in machines), "a machine ran no trial"
    best = max(trials, key=lambda t: t.value)
    # each machine's summary: the whole study, the same best
    for machine, out in zip(machines, outs):
        folder = machine / "lightning_logs" / "sweeps" / "shared"
        rows = (folder / "summary.csv").read_text().splitlines()
        assert len(rows) == 5 and all(",COMPLETE," in row for row in rows[1:])
        config = yaml.safe_load((folder / "best.yaml").read_text())
        assert config["model"]["init_args"]["lr"] == best.params["model.lr"]
        assert f"Best: trial {best.number}, val/acc_best {best.value:.4f}" in out


def test_a_machine_killed_mid_trial_has_its_trial_run_again_by_the_other(postgres, tmp_path):
    url, lrs = postgres("killed"), [1e-05, 0.0003]
    data = write_mnist(tmp_path / "data")
    args = ["--grid", f"model.lr={','.join(map(str, lrs))}", "--name", "k", "--storage", url,
            "--heartbeat", "1", *BASE, "--trainer.max_epochs", "20", "--data.data_dir", str(data)]
    machines = [tmp_path / "a", tmp_path / "b"]
    doomed, survivor = (start(args, m) for m in machines)
    deadline = time.time() + 90
    while not list(machines[0].glob("lightning_logs/sweeps/k/trial_*/**/checkpoints/last.ckpt")):
        assert time.time() < deadline and doomed.poll() is None, "machine a trained no epoch"
        time.sleep(0.1)
    doomed.send_signal(signal.SIGKILL)  # mid-trial: an epoch trained, nineteen to go
    assert doomed.wait() == -signal.SIGKILL
    out = finish(survivor)
    trials = optuna.load_study(study_name="k", storage=url).get_trials()
    (killed,) = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    folders = [m / "lightning_logs" / "sweeps" / "k" / f"trial_{killed.number:04d}"
               for m in machines]
    assert [f.is_dir() for f in folders] == [True, False]  # machine a's, and it never finished
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert retry.state == optuna.trial.TrialState.COMPLETE and retry.params == killed.params
    assert ran_on(retry, machines) == [machines[1]] and f"trial {retry.number} (" in out
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.params["model.lr"] for t in complete) == lrs  # each setting counted once
    assert len(trials) == len(lrs) + 1  # and nothing left running or waiting
    rows = (machines[1] / "lightning_logs" / "sweeps" / "k"
            / "summary.csv").read_text().splitlines()
    assert len(rows) == len(trials) + 1 and sum(",FAIL," in row for row in rows) == 1
    best = max(complete, key=lambda t: t.value)
    assert f"Best: trial {best.number}, val/acc_best {best.value:.4f}" in out


def test_the_summary_of_a_study_whose_only_trial_runs_or_died(postgres, tmp_path):
    """No trial has a duration yet: the table says so (the summary after a kill -9 of a one-setting
    sweep)."""
    import sweep

    url = postgres("running")
    study = optuna.create_study(study_name="r", storage=url)
    study.ask({"model.lr": optuna.distributions.FloatDistribution(0.001, 0.1)})
    table = sweep.summary(optuna.load_study(study_name="r", storage=url), tmp_path)
    assert "RUNNING" in table and "Best" not in table and not (tmp_path / "best.yaml").exists()
    assert (tmp_path / "summary.csv").read_text().count("RUNNING") == 1


def test_a_storage_that_cannot_be_opened_is_one_line(postgres, tmp_path):
    url = postgres("exists").rsplit("/", 1)[0] + "/nothing"
    proc = subprocess.run([sys.executable, SWEEP, "--storage", url, *BASE,
                           "--data.data_dir", str(tmp_path)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"sweep.py: error: --storage {url}: cannot open it (" in proc.stderr
    assert 'database "nothing" does not exist' in proc.stderr
