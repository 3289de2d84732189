"""Using a trained model: test, validate, predict and export from a checkpoint, from the command
line; and `--ckpt_path best|last|RUN`, which names one file of one run, never another run's."""

import contextlib
import csv
import datetime
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import results, run_train, runs
from PIL import Image

from datamodules.files import output_file
from lit_models import ImageClassifier

SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "64"]


@pytest.fixture
def in_run(trained, monkeypatch):
    """The module's finished run (conftest's `trained`), with its folder as the working one."""
    monkeypatch.chdir(trained.cwd)
    return trained


def last_line(capsys) -> str:
    """The last line the command wrote to stderr (Lightning's INFO lines come before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    return err.strip().splitlines()[-1]


def best_of(run: Path) -> Path:
    """The run's best checkpoint, as its record names it."""
    return Path(results(run)["best_model_path"])


def newest(folder: Path) -> Path:
    """The newest run folder (version_*) below `folder`."""
    return max(folder.glob("**/version_*"), key=lambda r: r.stat().st_mtime)


@pytest.mark.parametrize("spec", ["best", "RUN"])
def test_test_from_a_checkpoint_gives_the_training_runs_test_accuracy(spec, in_run, capsys):
    """`best` and the run's folder name the run's best checkpoint (a file: the other tests)."""
    fit = results(in_run.run)
    path = {"best": "best", "RUN": str(in_run.run)}[spec]
    assert run_train(["test", "--ckpt_path", path]) == 0
    accuracy = fit["metrics"]["test/acc"]
    assert f"test/acc {accuracy:.4f} of {fit['best_model_path']}" in capsys.readouterr().out
    # Logged inside the run it tested (RUN/test/...), not in a new run at the top level.
    record = results(newest(in_run.run / "test" / "lightning_logs"))
    assert record["stage"] == "test" and record["tested"] == fit["best_model_path"]
    assert record["metrics"]["test/loss"] == pytest.approx(fit["metrics"]["test/loss"])
    assert runs(in_run.cwd) == [in_run.run]


def test_validate_logs_inside_the_run_and_takes_the_options_given(in_run, capsys):
    assert run_train(["validate", "--ckpt_path", "best", "--data.eval_batch_size", "7"]) == 0
    best = results(in_run.run)["metrics"]["val/acc_best"]
    assert f"val/acc {best:.4f}" in capsys.readouterr().out
    validation = newest(in_run.run / "validate" / "lightning_logs")
    config = yaml.safe_load((validation / "config.yaml").read_text())
    assert config["data"]["init_args"]["eval_batch_size"] == 7
    assert results(validation)["stage"] == "validate" and runs(in_run.cwd) == [in_run.run]
    # Without a logger: Lightning's table, and no folder anywhere.
    before = sorted(in_run.cwd.glob("**/version_*"))
    assert run_train(["test", "--ckpt_path", "last", "--trainer.logger", "false"]) == 0
    assert "test/acc" in capsys.readouterr().out
    assert sorted(in_run.cwd.glob("**/version_*")) == before


def own_run(in_run, tmp_path) -> Path:
    """The run's best checkpoint copied into a run folder of this test's: the predictions beside
    it are this test's alone."""
    best = best_of(in_run.run)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    return Path(shutil.copy(best, tmp_path / "run" / "checkpoints" / best.name))


def test_predict_the_test_split_with_true_labels_never_overwriting(in_run, tmp_path, capsys):
    checkpoint = own_run(in_run, tmp_path)
    assert run_train(["predict", "--ckpt_path", str(checkpoint)]) == 0
    assert run_train(["predict", "--ckpt_path", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "GroundTruth:" in out and "Predicted:" in out
    accuracy = results(in_run.run)["metrics"]["test/acc"]
    assert f"accuracy {accuracy:.4f}" in out
    files = sorted((tmp_path / "run").glob("predictions-*.csv"))
    assert len(files) == 2
    rows = list(csv.DictReader(files[0].open()))
    assert len(rows) == 200 and rows[0]["path"] == "mnist:test:0" and rows[0]["true_label"]
    assert sum(r["label"] == r["true_label"] for r in rows) == round(accuracy * 200)


def write_digits(folder, data) -> list[int]:
    """The MNIST test images of the run as PNG files, 8- and 16-bit, and an LA one; their
    labels."""
    from datamodules import MNISTDataModule

    images, labels = MNISTDataModule(str(data)).read("test")
    folder.mkdir()
    for i, (image, label) in enumerate(zip(images[:30, 0].numpy(), labels[:30])):
        if i % 3 == 0:
            Image.fromarray(image).save(folder / f"{i:02d}-8bit.png")
        elif i % 3 == 1:
            Image.fromarray(image.astype(np.uint16) * 257).save(folder / f"{i:02d}-16bit.png")
        else:  # ink as opacity over transparent black: over white, 255 - v
            Image.fromarray(np.stack([np.zeros_like(image), 255 - image], -1),
                            "LA").save(folder / f"{i:02d}-la.png")
    return labels[:30].tolist()


def test_predict_files_reads_them_as_training_does(in_run, tmp_path, capsys):
    write_digits(tmp_path / "digits", in_run.data)
    (tmp_path / "digits" / "broken.png").write_bytes(b"not a png")
    out_file = tmp_path / "out.csv"
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", str(tmp_path / "digits"),
                      "--output", str(out_file)]) == 0
    out, err = capsys.readouterr()
    assert "broken.png: cannot read it" in err and "1 unreadable skipped" in out
    rows = {r["path"]: r for r in csv.DictReader(out_file.open())}
    assert len(rows) == 30
    model = ImageClassifier.load_from_checkpoint(best_of(in_run.run))
    from datamodules import MNISTDataModule

    images = MNISTDataModule(str(in_run.data)).read("test")[0][:30]
    expected = model.classify(images).argmax(1).tolist()
    predicted = [model.class_names.index(rows[str(p)]["label"])
                 for p in sorted((tmp_path / "digits").glob("*.png")) if p.name != "broken.png"]
    assert predicted == expected  # 16-bit and transparent files read as the 8-bit originals


def test_predict_globs_and_files_and_what_matches_nothing(in_run, tmp_path, capsys):
    write_digits(tmp_path / "digits", in_run.data)
    inputs = [str(tmp_path / "digits" / "0*.png"), str(tmp_path / "digits" / "10-16bit.png")]
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", json.dumps(inputs),
                      "--output", str(tmp_path / "o.csv")]) == 0
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 1 + 10 + 1
    assert run_train(["predict", "--ckpt_path", "best",
                      "--inputs", str(tmp_path / "nothing")]) == 1
    assert last_line(capsys).startswith(f"train.py: error: --inputs {tmp_path / 'nothing'}: ")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"x")
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", str(tmp_path / "bad"),
                      "--output", str(tmp_path / "bad.csv")]) == 1
    assert "none of the 1 images could be read" in last_line(capsys)
    assert not (tmp_path / "bad.csv").exists()


def served(fmt: str, path: Path, images: torch.Tensor) -> np.ndarray:
    """The probabilities that the file `path` of format `fmt`, loaded as a server loads it (by
    onnxruntime, by torch alone), gives for uint8 `images`."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        return session.run(None, {"images": images.numpy()})[0]
    if fmt == "torchscript":
        return torch.jit.load(path)(images).detach().numpy()
    return torch.export.load(path).module()(images).detach().numpy()


def test_exports_round_trip(in_run, tmp_path, capsys):
    """Each format, written by export and checked there on every test image, loads as a server
    loads it, classifies as the checkpoint does, and carries the class names."""
    import onnx

    from datamodules import MNISTDataModule

    model = ImageClassifier.load_from_checkpoint(best_of(in_run.run))
    images = MNISTDataModule(str(in_run.data)).read("test")[0][:40]
    expected = model.classify(images).numpy()
    for fmt in ("onnx", "torchscript", "pt2"):
        target = tmp_path / f"model.{fmt}"
        assert run_train(["export", "--ckpt_path", "best", "--format", fmt,
                          "--output", str(target)]) == 0
        assert "200 of 200 top classes the same" in capsys.readouterr().out
        probabilities = served(fmt, target, images)
        assert np.abs(probabilities - expected).max() < 1e-4
        if fmt == "onnx":
            meta = {p.key: p.value for p in onnx.load(target).metadata_props}
            classes = json.loads(meta["classes"])
        else:  # beside the file too, where any server can read them
            classes = json.loads((tmp_path / f"model.{fmt}.classes.json").read_text())
        assert classes == model.class_names


def damage(problem: str, original: Path, path: Path) -> None:
    """A bad checkpoint at `path`, made from the good one at `original`."""
    if problem == "truncated":
        path.write_bytes(original.read_bytes()[:3000])
    elif problem == "not a checkpoint":
        torch.save({"something": torch.zeros(3)}, path)
    elif problem != "missing":
        checkpoint = torch.load(original, weights_only=True)
        weights = checkpoint["state_dict"]
        if problem == "NaN weights":
            weights["net.fc1.weight"] = torch.full_like(weights["net.fc1.weight"], torch.nan)
        elif problem == "a key deleted":
            del weights["net.fc2.bias"]
        else:  # another network's shapes: the CNN's hyperparameters over the MLP's weights
            checkpoint["hyper_parameters"]["net"] = {"class_path": "lit_models.TutorialCNN",
                                                     "init_args": {}}
        torch.save(checkpoint, path)


PROBLEMS = {
    "missing": (2, "--ckpt_path {path}: no such checkpoint file"),
    "truncated": (1, "checkpoint {path} cannot be read (BadZipFile): it is truncated"),
    "not a checkpoint": (1, "checkpoint {path} cannot be read (no Lightning version)"),
    "NaN weights": (1, "the checkpoint holds NaN or infinite weights (net.fc1.weight)"),
    "another network's shapes": (1, "the checkpoint's weights do not fit this model (cnn for 10 "
                                    "classes of (1, 28, 28) images): net."),
    "a key deleted": (1, "net.fc2.bias"),
}


# Each problem for test; predict and export for those they meet on a path of their own (predict
# loads the weights as test does).
BAD = [(problem, "test") for problem in PROBLEMS]
BAD += [(problem, command) for problem in ("missing", "truncated", "not a checkpoint")
        for command in ("predict", "export")]
BAD += [("NaN weights", "export"), ("another network's shapes", "export")]


@pytest.mark.parametrize("problem, command", BAD)
def test_bad_checkpoints_fail_in_one_line(problem, command, in_run, tmp_path, capsys, request):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    path = tmp_path / "run" / "checkpoints" / "bad.ckpt"
    damage(problem, best_of(in_run.run), path)
    code, message = PROBLEMS[problem]
    quick = ["--format", "torchscript"] if command == "export" else []  # ONNX's takes seconds
    assert run_train([command, "--ckpt_path", str(path), *quick]) == code
    said = last_line(capsys)
    assert said.startswith("train.py: error: ") and message.format(path=path) in said
    # No predictions, no export: nothing written beside the run's folders.
    assert not list((tmp_path / "run").glob("*.*")) and runs(in_run.cwd) == [in_run.run]


def test_use_commands_need_a_checkpoint_and_know_their_options(in_run, capsys):
    for command in ("test", "validate", "predict", "export"):
        assert run_train([command]) == 2
        assert last_line(capsys) == (f"train.py: error: {command} needs --ckpt_path: a "
                                     f"checkpoint file, a run folder, or best/last")
    assert run_train(["export", "--ckpt_path", "best", "--format", "tflite"]) == 2
    said = last_line(capsys)
    assert "format" in said and "tflite" in said and "'onnx', 'torchscript', 'pt2'" in said
    assert run_train(["predict", "--help"], quiet=False) == 0
    assert "--inputs" in capsys.readouterr().out


def test_a_moved_checkpoint_still_tests_from_what_it_carries(in_run, tmp_path, monkeypatch,
                                                            capsys):
    """Out of its run, and without a data option: the model and data (its absolute data_dir)
    are the checkpoint's hyperparameters; its test logs here, not in a folder above it."""
    moved = Path(shutil.copy(best_of(in_run.run), tmp_path / "moved.ckpt"))
    monkeypatch.chdir(tmp_path)
    assert run_train(["test", "--ckpt_path", str(moved)]) == 0
    assert "ImageClassifier(mlp) on mnist: test/acc" in capsys.readouterr().out
    (run,) = runs(tmp_path)
    assert results(run)["tested"] == str(moved) and not (tmp_path.parent / "test").exists()


def test_a_weights_only_checkpoint_is_used_not_fitted_on(in_run, tmp_path, monkeypatch, capsys):
    checkpoint = torch.load(in_run.run / "checkpoints" / "last.ckpt", weights_only=True)
    for key in ("optimizer_states", "lr_schedulers", "loops"):
        del checkpoint[key]
    torch.save(checkpoint, tmp_path / "weights.ckpt")
    monkeypatch.chdir(tmp_path)
    assert run_train(["--ckpt_path", "weights.ckpt"]) == 2
    assert last_line(capsys).endswith("test, predict or export it, or start a new run")
    assert run_train(["test", "--ckpt_path", "weights.ckpt"]) == 0
    (run,) = runs(tmp_path)
    assert results(run)["metrics"]["test/acc"] > 0.5


def test_an_explicit_output_is_replaced_only_by_a_whole_file(in_run, tmp_path, capsys):
    mine = tmp_path / "mine.csv"
    mine.write_text("kept\n")
    (tmp_path / "notes.png").write_text("not an image")
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", str(tmp_path / "notes.png"),
                      "--output", str(mine)]) == 1
    assert last_line(capsys).endswith("nothing written") and mine.read_text() == "kept\n"
    # asked for: replaced
    assert run_train(["predict", "--ckpt_path", "best", "--output", str(mine)]) == 0
    assert len(mine.read_text().splitlines()) == 201 and not list(tmp_path.glob("*.tmp*"))


def test_a_model_option_given_to_a_use_command_is_what_runs(in_run, capsys):
    """LightningCLI 2.6 puts a checkpoint's hyperparameters over the options given to it (its
    _parse_ckpt_path, Lightning-AI/pytorch-lightning#21455): here the options given win, and the
    records say so. Fails if Lightning's behaviour comes back (train.py's override removed)."""
    assert run_train(["test", "--ckpt_path", "best", "--model.flip_test", "true"]) == 0
    test_run = newest(in_run.run / "test" / "lightning_logs")
    config = yaml.safe_load((test_run / "config.yaml").read_text())
    assert config["model"]["init_args"]["flip_test"] is True
    assert yaml.safe_load((test_run / "hparams.yaml").read_text())["flip_test"] is True
    # The rest is the checkpoint's, not the class's defaults: the recipe's label smoothing.
    assert config["model"]["init_args"]["label_smoothing"] == 0.1
    trained = yaml.safe_load((in_run.run / "config.yaml").read_text())["model"]["init_args"]
    assert trained["flip_test"] is False  # the run itself tested without flips


def test_two_predicts_started_in_one_second_write_a_file_each(in_run, tmp_path, monkeypatch):
    """The second command starts while the first is predicting, at the same second: it chose the
    name the first had chosen, and the first then replaced its file."""
    import lit_models.predict

    checkpoint = own_run(in_run, tmp_path)
    write_digits(tmp_path / "digits", in_run.data)
    first, second = sorted((tmp_path / "digits").glob("*.png"))[:2]

    class OneSecond(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            """One moment, whenever asked."""
            return cls(2026, 12, 5, 9, 30, 0)

    monkeypatch.setattr(lit_models.predict, "datetime", OneSecond)
    real, started = lit_models.predict.written_whole, []

    @contextlib.contextmanager
    def second_starts_meanwhile(path, *args):
        """The first predict's writing, with the second command run as it begins."""
        if not started:  # the first has its name; it writes the file when it has predicted
            started.append("second")
            started.append(run_train(["predict", "--ckpt_path", str(checkpoint),
                                      "--inputs", str(second)]))
        with real(path, *args) as tmp:
            yield tmp

    monkeypatch.setattr(lit_models.predict, "written_whole", second_starts_meanwhile)
    assert run_train(["predict", "--ckpt_path", str(checkpoint), "--inputs", str(first)]) == 0
    assert started == ["second", 0]
    written = sorted((tmp_path / "run").glob("predictions-*.csv"))
    assert [p.name for p in written] == ["predictions-20261205-093000-1.csv",
                                         "predictions-20261205-093000.csv"]
    predicted = [[row["path"] for row in csv.DictReader(p.open())] for p in written]
    assert predicted == [[str(second)], [str(first)]]


def test_a_failed_predict_leaves_no_file_and_an_output_it_reads_is_refused(in_run, tmp_path,
                                                                          capsys):
    checkpoint = own_run(in_run, tmp_path)
    (tmp_path / "notes.png").write_text("not an image")
    assert run_train(["predict", "--ckpt_path", str(checkpoint),
                      "--inputs", str(tmp_path / "notes.png")]) == 1
    assert last_line(capsys).endswith("nothing written")
    assert not list((tmp_path / "run").glob("predictions*"))  # the name it took is free again
    kept = checkpoint.read_bytes()
    write_digits(tmp_path / "digits", in_run.data)
    image = sorted((tmp_path / "digits").glob("*.png"))[0]
    photo = image.read_bytes()
    for output in (checkpoint, image):
        assert run_train(["predict", "--ckpt_path", str(checkpoint), "--inputs", str(image),
                          "--output", str(output)]) == 1
        assert last_line(capsys) == (f"train.py: error: --output {output} is {output}, "
                                     f"which this command reads; name another file")
    assert checkpoint.read_bytes() == kept and image.read_bytes() == photo
    assert run_train(["export", "--ckpt_path", str(checkpoint), "--format", "torchscript",
                      "--output", str(checkpoint)]) == 1
    assert last_line(capsys).endswith("which this command reads; name another file")
    assert checkpoint.read_bytes() == kept


def test_exports_without_an_output_take_a_name_each(tmp_path):
    from lit_models.export import FORMATS

    checkpoint = tmp_path / "run" / "checkpoints" / "best.ckpt"
    at = (None, [checkpoint], checkpoint.parent.parent, checkpoint.stem, FORMATS["onnx"])
    with output_file(*at) as first:
        with output_file(*at) as second:
            assert (first.name, second.name) == ("best.onnx", "best-1.onnx")
            assert first.exists() and second.exists()  # taken, for the next to see
        second.write_bytes(b"an export")
    with pytest.raises(RuntimeError):
        with output_file(*at) as third:
            raise RuntimeError("the check failed")
    assert third.name == "best-2.onnx" and not third.exists()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["best-1.onnx", "best.onnx"]


# --- `--ckpt_path best|last|RUN`: one file of one run (issue 56, defect 1) ----------------------

FAILS_AT_ONCE = '''
from lit_models import ImageClassifier


class FailsAtOnce(ImageClassifier):
    def training_step(self, batch, batch_idx):
        raise ValueError("broken in its first step")
'''


@pytest.fixture
def older_run(trained, tmp_path, monkeypatch) -> Path:
    """The module's finished run (an MLP on MNIST), copied into this test's working folder as
    lightning_logs/version_0: an older run of another network and data set."""
    # Its checkpoints and record; not what the module's other tests added (tests, predictions).
    shutil.copytree(trained.run, tmp_path / "lightning_logs" / "version_0",
                    ignore=shutil.ignore_patterns("test", "validate", "predictions-*"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "lightning_logs" / "version_0"


def refused(args: list[str], run: str, which: str, capsys) -> None:
    """`args` ends in exit 2 and one line naming `run`, which has no `which` checkpoint."""
    assert run_train(args) == 2
    assert last_line(capsys) == (
        f"train.py: error: --ckpt_path {which}: the run lightning_logs/{run} has no {which} "
        f"checkpoint (a fit without validation or checkpoints keeps none); give a checkpoint file")


def test_a_fit_without_checkpoints_has_no_best_and_never_another_runs(older_run, cifar10_dir,
                                                                      capsys):
    """Defect 1: after a fit with `--trainer.enable_checkpointing false`, `test --ckpt_path best`
    tested an older run's checkpoint, of another network on other data, and exited 0."""
    assert run_train(["--model", "mlp", "--model.net", "TutorialCNN", "--data",
                      "CIFAR10DataModule", "--data.data_dir", str(cifar10_dir),
                      "--trainer.enable_checkpointing", "false", *SHORT]) == 0
    assert not (older_run.parent / "version_1" / "checkpoints").exists()
    for command in ("test", "validate", "predict", "export"):
        refused([command, "--ckpt_path", "best"], "version_1", "best", capsys)
    refused(["test", "--ckpt_path", "last"], "version_1", "last", capsys)
    refused(["--ckpt_path", "last"], "version_1", "last", capsys)
    assert not (older_run / "test").exists() and len(runs(older_run.parent.parent)) == 2


def test_last_after_a_fit_without_a_last_checkpoint_is_an_error(older_run, cifar10_dir, capsys):
    """The run's callbacks replaced by one ModelCheckpoint: it has a best checkpoint and no
    last.ckpt."""
    best = ["--trainer.callbacks=ModelCheckpoint", "--trainer.callbacks.monitor=val/acc",
            "--trainer.callbacks.mode=max"]
    assert run_train(["--model", "mlp", "--data", "CIFAR10DataModule", "--data.data_dir",
                      str(cifar10_dir), *best, *SHORT]) == 0
    refused(["test", "--ckpt_path", "last"], "version_1", "last", capsys)
    refused(["--ckpt_path", "last", "--trainer.max_epochs", "2"], "version_1", "last", capsys)
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    assert "ImageClassifier(mlp) on cifar10" in capsys.readouterr().out


def test_best_and_last_after_a_fit_that_failed_at_once_name_that_run(older_run, own_modules,
                                                                     mnist_dir, capsys):
    """The newest run failed in its first step: its folder is kept (config, events, a record
    saying why), with no checkpoint; best and last are of it, never of the run before."""
    (own_modules / "fails.py").write_text(textwrap.dedent(FAILS_AT_ONCE))
    assert run_train(["--model", "mlp", "--model", "fails.FailsAtOnce", "--data.data_dir",
                      str(mnist_dir), *SHORT]) == 1
    capsys.readouterr()
    failed = older_run.parent / "version_1"
    assert results(failed)["status"] == "failed: ValueError: broken in its first step"
    for which in ("best", "last"):
        refused(["test", "--ckpt_path", which], "version_1", which, capsys)


def test_a_run_folder_without_a_best_checkpoint_tests_its_last(mnist_dir, in_tmp, capsys):
    """No validation split: no best checkpoint. `test --ckpt_path RUN` takes its last.ckpt;
    `best` is an error."""
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir),
                      "--data.val_size", "0", *SHORT]) == 0
    (run,) = runs(in_tmp)
    assert results(run)["best_model_path"] is None
    assert run_train(["test", "--ckpt_path", str(run)]) == 0
    assert results(newest(run / "test"))["tested"] == str(run / "checkpoints" / "last.ckpt")
    refused(["test", "--ckpt_path", "best"], "version_0", "best", capsys)


def test_validate_without_a_validation_split_is_refused(mnist_dir, in_tmp, capsys):
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir),
                      "--data.val_size", "0", *SHORT]) == 0
    capsys.readouterr()
    assert run_train(["validate", "--ckpt_path", "last"]) in (1, 2)
    said = last_line(capsys)
    assert said.startswith("train.py: error: ") and "validation" in said
