"""sweep.py: grids with seeds, sampled spaces with pruning, stopping and resuming, two sweeps on one study,
best.yaml, the HParams tab, and bad input. Tiny data in the real formats; 2-6 trials of a few epochs."""

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import lightning as L
import optuna
import pytest
from conftest import write_mnist
from helpers import ROOT, results, run_subprocess, scalars
from optuna.trial import TrialState
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from experiments import main as sweep_main
from experiments import options
from experiments import study as studies
from experiments.space import Param, Plan, load_space, parse_grid, short_names

# 500 training images in batches of 50: 10 steps an epoch.
SMALL = ["--model", "mlp", "--data.val_size=100", "--data.batch_size=50"]
ENV = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}  # the workers import this module's Sabotage


def sweep(args: list[str], cwd, timeout: int = 300, wait: bool = True):
    """`python sweep.py ARGS` in `cwd` (a subprocess, as a user runs it)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "sweep.py"), *args], cwd=cwd, env={**os.environ, **ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=timeout)
    return SimpleNamespace(returncode=proc.returncode, stdout=out, stderr=err)


def trials_of(folder, name: str | None = None, storage: str | None = None) -> list:
    """The trials of the (only) study in `folder`/lightning_logs/sweeps/, by number."""
    if storage is None:
        (study_dir,) = (folder / "lightning_logs" / "sweeps").iterdir()
        storage, name = f"sqlite:///{study_dir / 'study.db'}", study_dir.name
    study = optuna.load_study(study_name=name, storage=studies.open_storage(storage))
    return sorted(study.get_trials(), key=lambda t: t.number)


def ran(trials) -> list:
    """The trials that hold a slot (not surplus, not interrupted)."""
    return [t for t in trials if studies.holds_slot(t)]


class Sabotage(L.Callback):
    """In the trial whose learning rate is `lr`, after `step` steps: a NaN loss, or the process killed."""

    def __init__(self, lr: float, action: str, step: int = 3):
        self.lr, self.action, self.step = lr, action, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step < self.step or trainer.optimizers[0].defaults["lr"] != self.lr:
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        with __import__("torch").no_grad():
            next(pl_module.parameters()).fill_(float("nan"))


def sabotage(lr: float, action: str) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": "test_sweep.Sabotage",
                                                 "init_args": {"lr": lr, "action": action}})


# --- what a sweep varies, and which trial runs which slot (no training) -----------------------------------

def test_space_file_ranges_and_choices(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("model.optimizer.lr: {low: 0.001, high: 0.1, log: true}\n"
                    "--trainer.max_epochs: {low: 2, high: 8, step: 2}\n"
                    "data.batch_size: [256, 512]\n"
                    "data.mean: [[0.5], [0.2]]\n")
    lr, epochs, batch, mean = load_space(path)
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 0.001, 0.1, True)
    assert (epochs.key, epochs.kind, epochs.low, epochs.step) == ("trainer.max_epochs", "int", 2, 2)
    assert batch.choices == (256, 512) and mean.choices == ("[0.5]", "[0.2]")  # Optuna's choices are scalars
    assert epochs.distribution().step == 2 and lr.distribution().log


def test_grid_values_and_short_names():
    lr, mean, opt = parse_grid(["model.optimizer.lr=0.01,1e-3 data.mean=[0.5],[0.2]", "--model.optimizer=SGD,AdamW"])
    assert lr.choices == (0.01, 0.001) and mean.choices == ("[0.5]", "[0.2]") and opt.choices == ("SGD", "AdamW")
    assert Plan((lr, mean), grid=True, seeds=2).points()[1] == {"model.optimizer.lr": 0.01, "data.mean": "[0.2]"}
    assert short_names(["model.optimizer.lr", "model.scheduler.init_args.lr", "data.batch_size"]) == {
        "model.optimizer.lr": "optimizer.lr", "model.scheduler.init_args.lr": "scheduler.lr",
        "data.batch_size": "batch_size"}


@pytest.mark.parametrize("content, phrase", [
    (None, "does not exist"),
    ("model.optimizer.lr: {low: 0.1\n", "not valid YAML (line 2"),
    ("", "is empty"),
    ("- 1\n- 2\n", "a YAML list"),
    ("model.optimizer.lr: {low: 0.1, high: 0.01}\n", "empty range (low 0.1 is not below high 0.01)"),
    ("data.batch_size: []\n", "an empty list"),
    ("model.optimizer.lr: {low: 0, high: 1, log: true}\n", "log range needs low > 0"),
    ("model.optimizer.lr: {min: 0.1, max: 1}\n", "unknown field max, min"),
    ("model.optimizer.lr: 0.1\n", "a fixed value belongs on the command line"),
    ("model optimizer: [1, 2]\n", "is not an option name"),
], ids=["missing", "malformed", "empty", "list", "empty-range", "empty-list", "log-zero", "fields", "scalar", "key"])
def test_bad_space_files_exit_2_with_one_line(content, phrase, in_tmp, capsys):
    path = in_tmp / "space.yaml"
    if content is not None:
        path.write_text(content)
    assert sweep_main.main([*SMALL, "--space", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("sweep.py: error: space file") and phrase in err, err
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.parametrize("args, phrase", [
    (["--space", "s.yaml", "--trials", "0"], "--trials 0: it must be at least 1"),
    (["--grid", "model.optimizer.lr=0.1", "--seeds", "0"], "--seeds 0"),
    (["--grid", "model.optimizer.lr="], "an empty value"),
    (["--grid", "lr"], "write KEY=VALUE1,VALUE2"),
    (["--grid", "model.optimizer.lr=0.1", "--trials", "3"], "--trials is the number of settings to sample"),
    (["--grid", "a=1", "--space", "s.yaml"], "choose one"),
])
def test_bad_sweep_options_exit_2(args, phrase, in_tmp, capsys):
    (in_tmp / "s.yaml").write_text("model.optimizer.lr: [0.1]\n")
    assert sweep_main.main([*SMALL, *args]) == 2
    err = capsys.readouterr().err
    assert phrase in err and len(err.strip().splitlines()) == 1, err


def test_storage_that_cannot_be_opened_exits_2(in_tmp, capsys):
    code = sweep_main.main([*SMALL, "--seeds", "2", "--storage", f"sqlite:///{in_tmp}/no/such/dir/study.db"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--storage sqlite:///" in err and "cannot be opened" in err and len(err.strip().splitlines()) == 1


def test_a_study_with_another_space_is_refused_and_left_as_it_was(in_tmp, capsys):
    journal = str(in_tmp / "study.journal")
    plan = Plan((Param("model.optimizer.lr", "choice", choices=(0.1, 0.2)),), grid=True)
    old = studies.create_study(studies.open_storage(journal), "lr", plan, {"seeds": [0]})
    old.enqueue_trial({"model.optimizer.lr": 0.1})
    before = (in_tmp / "study.journal").read_bytes()
    code = sweep_main.main([*SMALL, "--grid", "model.optimizer.lr=0.3", "--name", "lr", "--storage", journal])
    err = capsys.readouterr().err
    assert code == 2 and "the study lr exists with another search space" in err and "another --name" in err, err
    assert "model.optimizer.lr in {0.1, 0.2}" in err and "model.optimizer.lr in {0.3}" in err
    assert (in_tmp / "study.journal").read_bytes() == before


def test_a_second_sweep_process_on_one_sqlite_file_is_refused(tmp_path):
    spec = f"sqlite:///{tmp_path / 'study.db'}"
    held = studies.lock_sqlite(spec)
    with pytest.raises(studies.StudyError, match="another sweep.py is running the study in .*journal file"):
        studies.lock_sqlite(spec)
    held.close()
    studies.lock_sqlite(spec).close()  # free again once the first one ends


def test_claims_give_each_slot_and_setting_to_one_trial():
    """The rule that lets several processes share a study: the lower trial number wins, the other is surplus."""
    study = optuna.create_study(direction="maximize")
    for _ in range(2):  # two processes enqueued the same grid slot
        study.enqueue_trial({}, user_attrs={"setting": 0, "seed_index": 0, "seed": 0})
    first, second = study.ask(), study.ask()
    trials = study.get_trials(deepcopy=False)
    assert studies.claim(trials, first, grid=True, settings=1) is None
    assert studies.claim(trials, second, grid=True, settings=1) == "trial 0 has its slot"
    assert studies.claim(trials, study.ask(), grid=True, settings=1) == "every grid setting was taken"
    # Sampling 2 settings: new trials 3 and 4 run, 5 (asked at the same moment as 4, say) does not.
    sampled = optuna.create_study()
    a, b, c = sampled.ask(), sampled.ask(), sampled.ask()
    trials = sampled.get_trials(deepcopy=False)
    assert [studies.claim(trials, t, grid=False, settings=2) for t in (a, b)] == [None, None]
    assert studies.claim(trials, c, grid=False, settings=2) == "the study had its 2 settings"
    # An interrupted trial gives its slot back: the same slot enqueued again runs.
    first.set_user_attr("interrupted", "stopped by SIGTERM")
    study.tell(first, state=TrialState.FAIL)
    again = studies.missing_slots(study.get_trials(deepcopy=False), [{}], [0])
    assert again == []  # trial 1 (the duplicate, still running) holds it
    second.set_user_attr("surplus", "trial 0 has its slot")
    study.tell(second, state=TrialState.FAIL)
    assert studies.missing_slots(study.get_trials(deepcopy=False), [{}], [0]) == [
        ({}, {"setting": 0, "seed_index": 0, "seed": 0})]


def test_missing_slots_of_a_sampled_setting_are_its_other_seeds_once_it_completed():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    trial.suggest_float("lr", 0.01, 0.1)
    for key, value in {"setting": 0, "seed_index": 0, "seed": 7}.items():
        trial.set_user_attr(key, value)
    assert studies.missing_slots(study.get_trials(), None, [7, 8, 9]) == []  # not complete yet
    study.tell(trial, 0.9)
    lr = trial.params["lr"]
    assert studies.missing_slots(study.get_trials(), None, [7, 8, 9]) == [
        ({"lr": lr}, {"setting": 0, "seed_index": 1, "seed": 8}),
        ({"lr": lr}, {"setting": 0, "seed_index": 2, "seed": 9})]


def test_a_trial_whose_machine_died_is_run_again(tmp_path, monkeypatch):
    """On another machine (no pid to look at), Optuna's heartbeat tells: past its grace period the trial is
    failed, counts as interrupted, and its slot is enqueued again."""
    monkeypatch.setattr(studies, "HEARTBEAT_S", 1)
    monkeypatch.setattr(studies, "GRACE_S", 1)
    storage = studies.open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    plan = Plan((), grid=True)
    study = studies.create_study(storage, "s", plan, {"seeds": [0]})
    assert studies.enqueue_missing(study, plan.points(), [0]) == 1
    trial = studies.ask(study)
    trial.set_user_attr("worker", "a-machine-that-died:12345")
    storage.record_heartbeat(trial._trial_id)
    time.sleep(2.5)
    assert studies.recover(study) == []  # not a pid of this machine
    (failed,) = study.get_trials()
    assert failed.state == TrialState.FAIL and studies.interrupted(failed)
    assert studies.enqueue_missing(study, plan.points(), [0]) == 1
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]


# --- sweeps that train ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A grid of 2 learning rates x 2 seeds, 2 trials at a time."""
    cwd = tmp_path_factory.mktemp("grid")
    data = write_mnist(cwd / "data")
    proc = sweep([*SMALL, "--data.data_dir", str(data), "--trainer.max_epochs=2",
                  "--grid", "model.optimizer.lr=0.0005,0.005", "--seeds", "2", "--parallel", "2"], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = (cwd / "lightning_logs" / "sweeps").iterdir()
    return SimpleNamespace(cwd=cwd, data=data, dir=folder, stdout=proc.stdout, trials=trials_of(cwd))


def test_grid_with_seeds_runs_each_setting_and_seed_once(grid):
    assert [t.state for t in grid.trials] == [TrialState.COMPLETE] * 4
    slots = sorted((t.params["model.optimizer.lr"], t.user_attrs["seed"]) for t in grid.trials)
    assert slots == [(0.0005, 0), (0.0005, 1), (0.005, 0), (0.005, 1)]
    for t in grid.trials:  # the study, results.json and the run directory agree
        run = results(grid.dir / "trials" / f"trial_{t.number:04d}")
        assert t.value == run["val/acc_best"] and run["seed"] == t.user_attrs["seed"]
        assert run["lr"] == t.params["model.optimizer.lr"] and run["epochs"] == 2
        threads = max(1, len(os.sched_getaffinity(0)) // 2)  # 2 trials at a time share the cores
        assert t.user_attrs["command"].startswith(f"OMP_NUM_THREADS={threads} python train.py --model mlp")
        assert t.user_attrs["command"].endswith(f"--model.optimizer.lr={t.params['model.optimizer.lr']} "
                                                f"--seed_everything={t.user_attrs['seed']}")


def test_summary_table_csv_and_mean_over_seeds(grid):
    rows = list(csv.DictReader(open(grid.dir / "summary.csv")))
    assert [int(r["trial"]) for r in rows] == [0, 1, 2, 3] and "test/acc" not in rows[0]
    assert {r["state"] for r in rows} == {"complete"}
    by_lr = {}
    for r in rows:
        by_lr.setdefault(float(r["model.optimizer.lr"]), []).append(float(r["val/acc_best"]))
    best_lr = max(by_lr, key=lambda lr: sum(by_lr[lr]))
    mean = sum(by_lr[best_lr]) / 2
    std = abs(by_lr[best_lr][0] - by_lr[best_lr][1]) / 2 ** 0.5
    assert "trial  lr      seed  state     epochs  val/acc_best  fit s" in grid.stdout
    assert f"lr={best_lr:.4g}  {mean:.4f} ± {std:.4f}  (2 seeds" in grid.stdout
    chosen = [t for t in grid.trials if t.params["model.optimizer.lr"] == best_lr]
    tests = [t.user_attrs["results"]["test/acc"] for t in chosen]
    assert f"Chosen: lr={best_lr:.4g}, test/acc {sum(tests) / 2:.4f} ± " in grid.stdout
    assert "reported for the chosen setting only" in grid.stdout


def test_hparams_tab_has_every_trial_with_its_real_metrics(grid):
    for t in grid.trials:
        run_dir = grid.dir / "trials" / f"trial_{t.number:04d}"
        acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
        acc.Reload()
        content = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hp = start.session_start_info.hparams
        assert hp["lr"].number_value == pytest.approx(t.params["model.optimizer.lr"])
        assert hp["seed"].number_value == t.user_attrs["seed"] and hp["model"].string_value == "mlp"
        assert scalars(run_dir)["val/acc_best"][-1] == pytest.approx(t.value)


def test_the_same_command_again_runs_nothing(grid):
    proc = sweep([*SMALL, "--data.data_dir", str(grid.data), "--trainer.max_epochs=2",
                  "--grid", "model.optimizer.lr=0.0005,0.005", "--seeds", "2", "--parallel", "2"], grid.cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Nothing to run" in proc.stdout and len(trials_of(grid.cwd)) == 4


@pytest.mark.slow
def test_best_yaml_replays_to_the_same_val_acc_best(grid, tmp_path):
    best = grid.dir / "best.yaml"
    header = best.read_text().splitlines()[0]
    number = int(header.split("trial ")[1].split(" ")[0])
    threads = best.read_text().split("Run it again with: OMP_NUM_THREADS=")[1].split(" ")[0]
    proc = run_subprocess(["--config", str(best)], cwd=grid.cwd, env={"OMP_NUM_THREADS": threads})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (replay,) = (grid.cwd / "lightning_logs" / "mlp-mnist").iterdir()  # the default place, not the sweep's
    trial = grid.trials[number]
    assert results(replay)["val/acc_best"] == trial.value
    assert results(replay)["test/acc"] == trial.user_attrs["results"]["test/acc"]


def test_space_with_pruning(mnist_dir, tmp_path):
    space = tmp_path / "lr.yaml"
    space.write_text("model.optimizer.lr: {low: 0.000001, high: 0.05, log: true}\n")
    # The sampler is seeded by the study's name and the trial's number: these 5 trials are always the same.
    proc = sweep([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=3", "--space", str(space),
                  "--trials", "5", "--name", "prune"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = trials_of(tmp_path)
    assert len(trials) == 5 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [t.intermediate_values for t in trials]
    for t in pruned:  # stopped after an epoch where its best val/acc was below the completed trials' median
        epoch = t.user_attrs["pruned_epoch"]
        done = [u.intermediate_values[epoch] for u in trials if u.number < t.number and u.state == TrialState.COMPLETE]
        assert epoch >= 1 and len(done) >= 2 and max(t.intermediate_values.values()) < statistics.median(done)
        assert t.user_attrs["results"]["epochs"] == epoch + 1 < 3 and max(t.intermediate_values) == epoch
        assert f"trial {t.number} (lr=" in proc.stdout and f"pruned after epoch {epoch + 1}" in proc.stdout
    assert sorted(t.params["model.optimizer.lr"] for t in trials) == sorted({t.params["model.optimizer.lr"]
                                                                             for t in trials})
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert f"Chosen: lr={best.params['model.optimizer.lr']:.4g}" in proc.stdout


@pytest.mark.slow
def test_a_nan_and_a_crashed_worker_fail_their_trials_only(mnist_dir, tmp_path):
    proc = sweep([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=2", sabotage(0.002, "nan"),
                  sabotage(0.003, "kill"), "--grid", "model.optimizer.lr=0.001,0.002,0.003,0.004"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_lr = {t.params["model.optimizer.lr"]: t for t in trials_of(tmp_path)}
    assert by_lr[0.001].state == by_lr[0.004].state == TrialState.COMPLETE
    assert by_lr[0.002].state == by_lr[0.003].state == TrialState.FAIL
    assert "the training loss became NaN" in by_lr[0.002].user_attrs["error"]
    assert by_lr[0.003].user_attrs["error"] == "the worker process died (SIGKILL) while running it"
    assert "trial 1 (lr=0.002, seed 0): failed: the training loss became NaN" in proc.stdout


def test_an_invalid_trial_command_fails_at_once_with_train_py_error(mnist_dir, in_tmp, capsys):
    code = sweep_main.main([*SMALL, "--data.data_dir", str(mnist_dir), "--model.optimizer.momentum=0.9",
                            "--grid", "model.optimizer.lr=0.01,0.02"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "sweep.py: error: the trial command line is not valid for train.py: --model.optimizer.momentum" in err
    assert not (in_tmp / "lightning_logs").exists()  # no study, no folder


def test_unknown_and_invalid_space_keys_are_named(mnist_dir, monkeypatch):
    """The worker's check, in this process: train.py's parser judges each extreme of each param."""
    from experiments.worker import Worker

    monkeypatch.setattr(sys, "argv", ["train.py"])  # as in a worker: LightningCLI warns about pytest's otherwise
    base = [*SMALL, "--data.data_dir", str(mnist_dir)]
    space = (Param("model.optimizer.lr", "float", 0.001, 0.1), Param("model.optimizer.betas2", "choice", choices=(1,)))
    variants = options.check_variants(Plan(space, grid=False), base)
    reply = Worker(__import__("threading").Event()).check([argv for argv, _ in variants])
    assert reply["code"] == 2 and "--model.optimizer.betas2 is not an option here" in reply["error"]
    grid = Plan((Param("data.batch_size", "choice", choices=(64, 0)),), grid=True)
    variants = options.check_variants(grid, base)
    reply = Worker(__import__("threading").Event()).check([argv for argv, _ in variants])
    assert variants[reply["variant"]][1] == "--data.batch_size=0" and "--data.batch_size" in reply["error"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_a_stopped_sweep_resumes_without_losing_or_repeating_a_trial(how, mnist_dir, tmp_path):
    args = [*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=12",
            "--grid", "model.optimizer.lr=0.001,0.002,0.003", "--name", "stop"]
    proc = sweep(args, tmp_path, wait=False)
    second_log = tmp_path / "lightning_logs" / "sweeps" / "stop" / "logs" / "trial_0001.log"
    deadline = time.time() + 240
    while time.time() < deadline:  # until trial 1 has trained an epoch of 12 (the study exists by then)
        time.sleep(0.2)
        if second_log.exists() and trials_of(tmp_path)[1].intermediate_values:
            break
    else:
        proc.kill()
        pytest.fail("trial 1 did not start")
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err[-2000:]
        assert "stopped by SIGTERM" in err
    else:  # the coordinator and its worker, at once (the worker held still, so it cannot tidy up)
        worker = int(trials_of(tmp_path)[1].user_attrs["worker"].split(":")[1])
        os.kill(worker, signal.SIGSTOP)
        proc.kill()
        os.kill(worker, signal.SIGKILL)
        proc.communicate(timeout=60)
    before = trials_of(tmp_path)
    assert before[0].state == TrialState.COMPLETE
    assert before[1].state == (TrialState.FAIL if how == "sigterm" else TrialState.RUNNING)

    again = sweep(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    after = trials_of(tmp_path)
    assert after[0].value == before[0].value and after[0].datetime_complete == before[0].datetime_complete
    assert after[1].state == TrialState.FAIL and studies.interrupted(after[1])
    assert "interrupted" in after[1].user_attrs  # with its reason
    done = ran(after)
    assert [t.state for t in done] == [TrialState.COMPLETE] * 3
    assert sorted(t.params["model.optimizer.lr"] for t in done) == [0.001, 0.002, 0.003]
    assert "run again as trial" in again.stdout


@pytest.mark.slow
def test_two_sweeps_on_one_journal_run_exactly_the_trials_asked(mnist_dir, tmp_path):
    space = tmp_path / "lr.yaml"
    space.write_text("model.optimizer.lr: {low: 0.0001, high: 0.05, log: true}\n")
    journal = str(tmp_path / "study.journal")
    args = [*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=4", "--space", str(space),
            "--trials", "4", "--name", "shared", "--storage", journal]
    procs = [sweep(args, tmp_path, wait=False) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    trials = trials_of(tmp_path, "shared", journal)
    done = ran(trials)
    assert len(done) == 4 and all(t.state == TrialState.COMPLETE for t in done)
    assert len({t.params["model.optimizer.lr"] for t in done}) == 4
    assert all(studies.surplus(t) for t in trials if t not in done)  # any extra trial never ran
    workers = {t.user_attrs["worker"] for t in done}
    assert len(workers) == 2  # both processes ran trials
    run_dirs = sorted(p.name for p in (tmp_path / "lightning_logs" / "sweeps" / "shared" / "trials").iterdir())
    assert run_dirs == [f"trial_{t.number:04d}" for t in done]
