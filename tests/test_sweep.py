"""sweep.py: an Optuna study of train.py runs, read back with Optuna's own API."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT, SWEEP, run_process, run_sweep, run_train, runs, sweep_here

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2"]

pytestmark = pytest.mark.slow  # processes and signals: seconds each


def sweep(args, cwd, data, **kwargs):
    proc = run_process([*args, *BASE, "--data.data_dir", str(data)], cwd=cwd, script=SWEEP,
                       quiet=False, **kwargs)
    return proc


def study(cwd) -> optuna.Study:
    (db,) = (cwd / "lightning_logs" / "sweeps").glob("*/study.db")
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    return optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A grid of two settings, two seeds each, in two processes."""
    from conftest import write_mnist

    cwd = tmp_path_factory.mktemp("grid")
    data = write_mnist(cwd / "data")
    proc = sweep(["--grid", "model.lr=0.005,0.02", "--seeds", "2", "--parallel", "2",
                  "--name", "g"], cwd, data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, data, proc


def test_a_grid_runs_each_setting_once_with_each_seed(grid):
    cwd, _, proc = grid
    trials = study(cwd).get_trials()
    assert sorted(t.params["model.lr"] for t in trials) == [0.005, 0.02]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    for t in trials:  # the value is the mean over the seeds' val/acc_best
        runs_ = [cwd / "lightning_logs" / "sweeps" / "g" / f"trial_{t.number:04d}" / f"seed_{s}"
                 for s in (0, 1)]
        bests = [yaml.safe_load((r / "lightning_logs" / "version_0"
                                 / "results.json").read_text())["val/acc_best"] for r in runs_]
        assert t.value == pytest.approx(sum(bests) / 2)
        command = t.user_attrs["command_seed_1"]
        assert command.endswith(f"--model.lr={t.params['model.lr']} --seed_everything=1")
    assert "Best: trial" in proc.stdout


def test_summary_csv_is_optunas_dataframe_and_best_yaml_replays(grid, tmp_path, monkeypatch):
    cwd, data, _ = grid
    folder = cwd / "lightning_logs" / "sweeps" / "g"
    summary = (folder / "summary.csv").read_text().splitlines()
    assert (summary[0].startswith("number,value,") and "params_model.lr" in summary[0]
            and len(summary) == 3)
    best = study(cwd).best_trial
    monkeypatch.chdir(tmp_path)
    assert run_train(["--config", str(folder / "best.yaml")]) == 0
    (replayed,) = runs(tmp_path)
    first_seed = yaml.safe_load((folder / f"trial_{best.number:04d}" / "seed_0" / "lightning_logs"
                                 / "version_0" / "results.json").read_text())
    assert (yaml.safe_load((replayed / "results.json").read_text())["val/acc_best"]
            == first_seed["val/acc_best"])


def test_the_same_command_again_runs_nothing_and_optuna_reads_the_study(grid):
    cwd, data, _ = grid
    proc = sweep(["--grid", "model.lr=0.005,0.02", "--seeds", "2", "--parallel", "2",
                  "--name", "g"], cwd, data)
    assert proc.returncode == 0 and len(study(cwd).get_trials()) == 2
    assert "Sweep g: nothing left to run; study in sqlite:///" in proc.stdout  # no worker started
    (db,) = (cwd / "lightning_logs" / "sweeps").glob("*/study.db")
    listed = subprocess.run([str(Path(sys.executable).parent / "optuna"), "trials",
                             "--study-name", "g", "--storage", f"sqlite:///{db}", "-f", "json"],
                            capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.count('"number"') == 2


def test_a_space_samples_prunes_and_keeps_count(mnist_dir, tmp_path, capfd):
    # 1e-3 and 1e-1: numbers, as train.py reads YAML (PyYAML's safe_load reads strings)
    (tmp_path / "space.yaml").write_text("model.lr: {low: 1e-3, high: 1e-1, log: true}\n"
                                         "data.batch_size: [32, 64]\n")
    args = ["--space", "space.yaml", "--trials", "6", "--trainer.max_epochs", "4"]
    code, err = sweep_here([*args, *BASE, "--data.data_dir", str(mnist_dir)], tmp_path, capfd)
    assert code == 0, err[-3000:]
    trials = study(tmp_path).get_trials()
    assert len(trials) == 6 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert all(0.001 <= t.params["model.lr"] <= 0.1 and t.params["data.batch_size"] in (32, 64)
               for t in trials)
    assert all(len(t.intermediate_values) >= 1 for t in trials)  # each epoch's val/acc reported


def test_runs_without_a_validation_split_are_compared_by_test_acc_and_say_so(mnist_dir,
                                                                              tmp_path):
    # As `--model whitened` trains: every training image, none held out. A process: its workers'
    # trial lines reach its stdout (a forkserver started by an earlier test keeps that test's).
    proc = sweep(["--grid", "model.lr=0.005,0.02", "--data.val_size", "0"], tmp_path, mnist_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = study(tmp_path).get_trials()
    for t in trials:
        record = yaml.safe_load(Path(t.user_attrs["log_dir_seed_0"], "results.json").read_text())
        assert record["val/acc_best"] is None and t.value == record["test/acc"]
        assert t.user_attrs["objective"] == "test/acc"
        assert f"seed 0): test/acc {t.value:.4f} in " in proc.stdout
    assert "val/acc" not in proc.stdout
    assert f"Best: trial {study(tmp_path).best_trial.number}, test/acc " in proc.stdout


def test_a_failing_trial_fails_alone(mnist_dir, tmp_path, capfd):
    args = ["--grid", "model.lr=1e12,0.01", "--name", "nan"]
    code, err = sweep_here([*args, *BASE, "--data.data_dir", str(mnist_dir)], tmp_path, capfd)
    assert code == 0, err[-3000:]
    states = {t.params["model.lr"]: t.state.name for t in study(tmp_path).get_trials()}
    assert states == {1e12: "FAIL", 0.01: "COMPLETE"}
    # its error noted in the study (its line is the next test's: a worker of this process writes
    # to the stderr of the test that started the forkserver)
    (failed,) = [t for t in study(tmp_path).get_trials() if t.state.name == "FAIL"]
    assert failed.user_attrs["error"].startswith("the weights became NaN or infinite in epoch 0")


def test_a_sweep_whose_every_trial_fails_the_same_way_stops_after_three_and_exits_1(mnist_dir,
                                                                                    tmp_path):
    """Each trial diverges: the sweep made failed trials for ever, each with its traceback."""
    (tmp_path / "space.yaml").write_text("model.lr: {low: 1e11, high: 1e12, log: true}\n")
    proc = sweep(["--space", "space.yaml", "--trials", "20"], tmp_path, mnist_dir, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("sweep.py: error: the trials keep failing the same way, so the "
                                "sweep stopped: the weights became NaN or infinite in epoch 0")
    assert sum(": failed: the weights became NaN" in line for line in lines) == 3
    assert "Traceback" not in proc.stderr and states(tmp_path) == ["FAIL"] * 3


@pytest.mark.parametrize("args, phrase, code", [
    (["--space", "nothing.yaml"], "--space nothing.yaml: cannot read it", 2),
    (["--grid", "model.lr"], "--grid model.lr: write KEY=V1,V2", 2),
    (["--grid", "model.nothing=1,2"], "nothing", 2),
    (["--seeds", "0"], "must be at least 1", 2),
    # not the first value: none runs either
    (["--grid", "data.batch_size=64,abc"], "batch_size", 2),
    (["--grid", "model.lr=0.01", "--grid", "model.label_smoothing=0,2"],
     "label_smoothing 2.0 must be in [0, 1]", 1),
])
def test_bad_sweeps_stop_before_any_trial(args, phrase, code, mnist_dir, tmp_path, monkeypatch,
                                         capsys):
    """In this process: no worker starts (a process's own one-line error is test_postgres's)."""
    monkeypatch.chdir(tmp_path)
    returned = run_sweep([*args, *BASE, "--data.data_dir", str(mnist_dir)])
    err = capsys.readouterr().err
    assert returned == code and phrase in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.glob("lightning_logs/sweeps/*/trial_*"))


# --- stopped and killed sweeps: real signals to real processes, then the same command again -------

def command(args: list[str], data: Path) -> list[str]:
    return [sys.executable, SWEEP, *BASE, *args, "--data.data_dir", str(data)]


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    """A sweep as a shell starts it: a process group of its own (a terminal's Ctrl-C goes to the
    group), its output in out.txt and err.txt."""
    with open(cwd / "out.txt", "w") as out, open(cwd / "err.txt", "w") as err:
        return subprocess.Popen(argv, cwd=cwd,
                                env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
                                stdout=out, stderr=err, start_new_session=True)


def wait_for(cwd: Path, pattern: str, count: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while len(list(cwd.glob(f"lightning_logs/sweeps/*/{pattern}"))) < count:
        assert (proc.poll() is None
                and time.time() < deadline), (cwd / "err.txt").read_text()[-3000:]
        time.sleep(0.1)


def workers(proc: subprocess.Popen) -> list:
    """A sweep's worker processes: the children of its forkserver (sweep_workers.run_workers)."""
    import psutil

    (server,) = [p for p in psutil.Process(proc.pid).children()
                 if "forkserver" in " ".join(p.cmdline())]
    return server.children()


def again(argv: list[str], cwd: Path, capfd) -> None:
    """The same command, to its end: in this process, its workers processes as ever (what is
    tested is the study it leaves)."""
    code, err = sweep_here(argv[2:], cwd, capfd)
    assert code == 0 and "Traceback" not in err, err[-3000:]


def states(cwd: Path) -> list[str]:
    return sorted(t.state.name for t in study(cwd).get_trials())


def each_setting_complete_once(cwd: Path, lrs: list[float]) -> list[optuna.trial.FrozenTrial]:
    """The trials, after every setting of the grid completed once, none left running or waiting, and
    each retry the same setting as the trial it runs again."""
    trials = study(cwd).get_trials()
    assert (sorted(t.params["model.lr"] for t in trials if t.state.name == "COMPLETE")
            == sorted(lrs))
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL"}
    for t in trials:
        if "failed_trial" in t.system_attrs:
            assert t.params == trials[t.system_attrs["failed_trial"]].params
    return trials


def last_line(cwd: Path) -> str:
    err = (cwd / "err.txt").read_text()
    assert "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def test_ctrl_c_stops_a_sweep_in_one_line_and_it_goes_on_without_losing_or_repeating_a_trial(
        mnist_dir, tmp_path, capfd):
    argv = command(["--grid", "model.lr=0.005,0.02", "--name", "s", "--trainer.max_epochs", "10"],
                   mnist_dir)
    proc = start(argv, tmp_path)
    # the second trial has trained an epoch
    wait_for(tmp_path, "trial_0001/**/checkpoints/last.ckpt", 1, proc)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: its process group
    assert proc.wait(timeout=120) == 130
    assert last_line(tmp_path) == ("sweep.py: stopped by Ctrl-C with 1 trials complete or pruned; "
                                   "the same command goes on with the study")
    # the interrupted trial, and its retry
    assert states(tmp_path) == ["COMPLETE", "FAIL", "WAITING"]
    # another command on the study: refused before any worker starts (in this process)
    other, err = sweep_here([*argv[2:], "--trainer.max_epochs", "2"], tmp_path, capfd)
    assert other == 2 and "was made by another command" in err
    again(argv, tmp_path, capfd)
    each_setting_complete_once(tmp_path, [0.005, 0.02])


def test_sigterm_while_a_trial_tests_stops_every_worker_and_each_setting_runs_again(mnist_dir,
                                                                                    tmp_path,
                                                                                    capfd):
    # a trial's test has begun, and waits 3 s; the other worker's trial trains or tests
    flag = tmp_path / "testing"
    argv = command(["--grid", "model.lr=0.005,0.02", "--parallel", "2",
                    "--trainer.callbacks+=probes.SlowTest", f"--trainer.callbacks.flag={flag}",
                    "--trainer.callbacks.seconds=3"], mnist_dir)
    proc = start(argv, tmp_path)
    while not flag.exists():
        assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    assert last_line(tmp_path).startswith(
        "sweep.py: stopped by SIGTERM with 0 trials complete or pruned; the same")
    # each trial begun (the second worker may still have been starting), and its retry
    stopped = states(tmp_path)
    assert set(stopped) == {"FAIL", "WAITING"} and stopped.count("FAIL") == stopped.count("WAITING")
    again(argv, tmp_path, capfd)
    each_setting_complete_once(tmp_path, [0.005, 0.02])


def test_a_sweep_killed_by_sigkill_takes_its_workers_with_it_and_goes_on(mnist_dir, tmp_path,
                                                                          capfd):
    import psutil

    argv = command(["--grid", "model.lr=0.005,0.02", "--parallel", "2",
                    "--trainer.max_epochs", "10"], mnist_dir)
    proc = start(argv, tmp_path)
    wait_for(tmp_path, "trial_*/**/checkpoints/last.ckpt", 1, proc)
    # the workers, and multiprocessing's tracker
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2
    proc.kill()  # the sweep alone
    proc.wait(timeout=60)
    assert not psutil.wait_procs(children, timeout=60)[1], "a worker outlived its sweep"
    # each stopped after its step, its trial waiting to run again
    assert "RUNNING" not in states(tmp_path)
    again(argv, tmp_path, capfd)
    each_setting_complete_once(tmp_path, [0.005, 0.02])


def test_the_forkserver_preloads_modules_of_the_environment_not_of_this_checkout():
    """Python 3.11's forkserver imports its preload on its own path: a module of this checkout is
    skipped in silence, and every worker imports torch again."""
    import importlib.util

    import sweep_workers

    for name in sweep_workers.PRELOAD:
        origin = Path(importlib.util.find_spec(name).origin)
        assert "site-packages" in origin.parts, name  # (a virtual environment may be in ROOT)


def test_a_sigterm_while_a_worker_writes_to_the_study_is_taken_after_the_write(mnist_dir,
                                                                                tmp_path,
                                                                                monkeypatch):
    """In this process, a worker's objective: a SIGTERM that lands in a write of the trial's results
    lets the write finish. Raised there, it left an SQLite statement holding its lock, and the
    other worker of a sweep killed by SIGKILL waited a minute for it."""
    import sweep as sweep_py
    import sweep_workers

    store = sweep_py.storage(f"sqlite:///{tmp_path / 'study.db'}")
    study = sweep_workers.open_study("s", store, {}, False, 0)
    args = [*BASE, "--trainer.max_epochs", "1", "--data.data_dir", str(mnist_dir)]
    turn = sweep_workers.FileTurn(tmp_path / ".turn.lock")
    objective = sweep_workers.Objective(args, {}, False, [0], tmp_path, "", turn)
    set_user_attr = optuna.Trial.set_user_attr

    def signalled(trial, key, value):
        if key.startswith("test_acc"):
            signal.raise_signal(signal.SIGTERM)  # its handler runs here, before the write
        set_user_attr(trial, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", signalled)
    previous = signal.signal(signal.SIGTERM, objective.on_sigterm)
    try:
        study.optimize(objective, n_trials=1)
    except KeyboardInterrupt:  # (not to end pytest)
        pytest.fail("the SIGTERM was raised inside the write")
    finally:
        signal.signal(signal.SIGTERM, previous)
    (trial,) = study.get_trials()
    assert trial.state.name == "COMPLETE" and objective.stop_asked
    assert {"test_acc_seed_0", "log_dir_seed_0", "config"} <= set(trial.user_attrs)


@pytest.mark.parametrize("how", ["--grid", "--space"])
def test_a_sweep_whose_every_process_is_killed_goes_on_once_their_heartbeats_stop(how, mnist_dir,
                                                                                  tmp_path, capfd):
    import psutil

    (tmp_path / "space.yaml").write_text("model.lr: {low: 0.001, high: 0.1, log: true}\n")
    sweep_args = (["--grid", "model.lr=0.005,0.02"] if how == "--grid"
                  else ["--space", "space.yaml", "--trials", "3"])
    argv = command([*sweep_args, "--parallel", "2", "--heartbeat", "1",
                    "--trainer.max_epochs", "10"], mnist_dir)
    proc = start(argv, tmp_path)
    wait_for(tmp_path, "trial_*/**/checkpoints/last.ckpt", 2, proc)  # both workers mid-trial
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        p.kill()  # as a lost machine, or kill -9 of them all
    proc.wait(timeout=60)
    # until another process sees that their heartbeats stopped
    killed = states(tmp_path).count("RUNNING")
    assert killed >= 1
    again(argv, tmp_path, capfd)
    if how == "--grid":
        each_setting_complete_once(tmp_path, [0.005, 0.02])
    else:
        trials = study(tmp_path).get_trials()
        assert [t.state.name for t in trials].count("FAIL") == killed
        done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        # no setting sampled twice
        assert len(done) == 3 and len({t.params["model.lr"] for t in done}) == 3
        assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED", "FAIL"}
        for t in trials:
            if "failed_trial" in t.system_attrs:
                assert t.params == trials[t.system_attrs["failed_trial"]].params


def test_a_worker_killed_mid_trial_has_its_trial_run_again_by_the_other(mnist_dir, tmp_path):

    argv = command(["--grid", "model.lr=0.005,0.02", "--parallel", "2", "--heartbeat", "1",
                    "--trainer.max_epochs", "20"], mnist_dir)
    proc = start(argv, tmp_path)
    wait_for(tmp_path, "trial_*/**/checkpoints/last.ckpt", 2, proc)  # both workers mid-trial
    workers(proc)[0].kill()
    assert proc.wait(timeout=180) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    trials = each_setting_complete_once(tmp_path, [0.005, 0.02])
    assert [t.state.name for t in trials].count("FAIL") == 1


def test_a_sweep_whose_only_worker_is_killed_says_so_in_one_line(mnist_dir, tmp_path):

    proc = start(command(["--trainer.max_epochs", "20"], mnist_dir), tmp_path)
    wait_for(tmp_path, "trial_*/**/checkpoints/last.ckpt", 1, proc)
    workers(proc)[0].kill()
    assert proc.wait(timeout=120) == 1
    assert last_line(tmp_path) == ("sweep.py: stopped with 0 trials complete or pruned; "
                                   "the same command goes on with the study")
    assert states(tmp_path) == ["RUNNING"]  # until its heartbeat is three intervals old


def test_lightning_calls_the_sigterm_handler_it_finds(tmp_path):
    """The contract that a worker's SIGTERM handler leans on (docs/design.md): a Trainer's run calls
    it too."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Term(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    heard = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        trainer = L.Trainer(max_steps=10, callbacks=[Term()], default_root_dir=tmp_path,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        with pytest.raises(SystemExit):  # Lightning's SIGTERMException, after the step
            trainer.fit(BoringModel())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert heard == [signal.SIGTERM] and trainer.global_step == 2

