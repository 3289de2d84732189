"""Using a trained model: test, validate, predict and export from a checkpoint, from the command
line."""

import contextlib
import csv
import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_train, runs
from PIL import Image

from lit_models import ImageClassifier


@pytest.fixture
def in_run(trained, monkeypatch):
    monkeypatch.chdir(trained.cwd)
    return trained


@pytest.mark.parametrize("spec", ["best", "RUN", "FILE"])
def test_test_from_a_checkpoint_gives_the_training_runs_test_accuracy(spec, in_run, capsys):
    first = json.loads((in_run.run / "results.json").read_text())
    path = {"best": "best", "RUN": str(in_run.run), "FILE": first["checkpoint"]}[spec]
    assert run_train(["test", "--ckpt_path", path]) == 0
    assert f"test/acc {first['test/acc']:.4f}" in capsys.readouterr().out
    tests = (in_run.run / "test").glob("version_*")  # inside the run it tested, not a new run
    record = json.loads((max(tests, key=lambda r: r.stat().st_mtime) / "results.json").read_text())
    assert (record["stage"] == "test" and record["test/acc"] == first["test/acc"]
            and runs(in_run.cwd) == [in_run.run])
    assert record["checkpoint"] == first["checkpoint"]


def test_use_commands_take_overrides_and_need_nothing_repeated(in_run, capsys):
    assert run_train(["validate", "--ckpt_path", "best", "--data.eval_batch_size", "7"]) == 0
    best = json.loads((in_run.run / "results.json").read_text())["val/acc_best"]
    assert f"val/acc {best:.4f}" in capsys.readouterr().out
    assert run_train(["test", "--ckpt_path", "last", "--trainer.logger", "false"]) == 0
    assert "no logger" in capsys.readouterr().out


def test_predict_the_test_split_with_true_labels_never_overwriting(in_run, capsys):
    assert run_train(["predict", "--ckpt_path", "best"]) == 0
    assert run_train(["predict", "--ckpt_path", "best"]) == 0
    out = capsys.readouterr().out
    assert "GroundTruth:" in out and "Predicted:" in out
    accuracy = json.loads((in_run.run / "results.json").read_text())["test/acc"]
    assert f"accuracy {accuracy:.4f}" in out
    files = sorted(in_run.run.glob("predictions-*.csv"))
    assert len(files) == 2
    rows = list(csv.DictReader(files[0].open()))
    assert len(rows) == 200 and rows[0]["path"] == "mnist:test:0" and rows[0]["true_label"]
    assert sum(r["label"] == r["true_label"] for r in rows) == round(accuracy * 200)


def write_digits(folder, data) -> list[int]:
    """The MNIST test images of the run as PNG files, 8- and 16-bit, and an RGBA one; their
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


@pytest.mark.slow
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
    model = ImageClassifier.load_from_checkpoint(
        json.loads((in_run.run / "results.json").read_text())["checkpoint"])
    from datamodules import MNISTDataModule

    images = MNISTDataModule(str(in_run.data)).read("test")[0][:30]
    expected = model.classify(images).argmax(1).tolist()
    predicted = [model.class_names.index(rows[str(p)]["label"])
                 for p in sorted((tmp_path / "digits").glob("*.png")) if p.name != "broken.png"]
    assert predicted == expected  # 16-bit and transparent files read as the 8-bit originals


def test_predict_globs_and_files_and_what_matches_nothing(in_run, tmp_path, capsys):
    write_digits(tmp_path / "digits", in_run.data)
    assert run_train(["predict", "--ckpt_path", "best",
                      "--inputs", str(tmp_path / "digits" / "0*.png"),
                      str(tmp_path / "digits" / "10-16bit.png"),
                      "--output", str(tmp_path / "o.csv")]) == 0
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 1 + 10 + 1
    assert run_train(["predict", "--ckpt_path", "best",
                      "--inputs", str(tmp_path / "nothing")]) == 1
    assert "--inputs" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"x")
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", str(tmp_path / "bad"),
                      "--output", str(tmp_path / "bad.csv")]) == 1
    assert ("none of the 1 images could be read" in capsys.readouterr().err
            and not (tmp_path / "bad.csv").exists())


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "pt2"])
def test_export_round_trips_without_the_project(fmt, in_run, tmp_path, capsys):
    target = tmp_path / f"model.{fmt}"
    assert run_train(["export", "--ckpt_path", "best", "--format", fmt,
                      "--output", str(target)]) == 0
    # the tiny test split's every image
    assert "200 of 200 top classes the same" in capsys.readouterr().out
    from datamodules import MNISTDataModule

    images = MNISTDataModule(str(in_run.data)).read("test")[0][:40].numpy()
    np.save(tmp_path / "x.npy", images)
    load = {"onnx": "import onnxruntime as o; s = o.InferenceSession(p); "
                    "y = s.run(None, {'images': x})[0]",
            "torchscript": "import torch; "
                           "y = torch.jit.load(p)(torch.from_numpy(x)).detach().numpy()",
            "pt2": "import torch; "
                   "y = torch.export.load(p).module()(torch.from_numpy(x)).detach().numpy()"}[fmt]
    code = (f"import numpy as np; x = np.load('{tmp_path}/x.npy'); p = '{target}'; {load}; "
            f"print(y.argmax(1).tolist())")
    # no project
    served = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True)
    assert served.returncode == 0, served.stderr[-1000:]
    model = ImageClassifier.load_from_checkpoint(
        json.loads((in_run.run / "results.json").read_text())["checkpoint"])
    assert served.stdout.strip() == str(model.classify(torch.from_numpy(images)).argmax(1).tolist())


@pytest.mark.parametrize("problem, code, message", [
    ("missing", 2, "no such checkpoint file"),
    ("truncated", 1, "cannot be read; it may be truncated"),
    ("not a checkpoint", 1, "is not a Lightning checkpoint (it has no state_dict)"),
    ("a key deleted", 1,
     "weights do not fit this model (mlp for 10 classes of (1, 28, 28) images): net.fc2.bias"),
    ("network changed", 1, "missing, unexpected or of another shape"),
])
@pytest.mark.parametrize("command", ["test", "predict", "export"])
def test_bad_checkpoints_fail_in_one_line(problem, code, message, command, in_run, tmp_path,
                                          capsys):
    path = tmp_path / "bad.ckpt"
    original = json.loads((in_run.run / "results.json").read_text())["checkpoint"]
    if problem == "truncated":
        path.write_bytes(open(original, "rb").read()[:3000])
    elif problem == "not a checkpoint":
        torch.save({"something": torch.zeros(3)}, path)
    elif problem in ("a key deleted", "network changed"):
        checkpoint = torch.load(original, weights_only=True)
        if problem == "a key deleted":
            del checkpoint["state_dict"]["net.fc2.bias"]
        else:
            checkpoint["hyper_parameters"]["net"] = {"class_path": "lit_models.TutorialCNN",
                                                     "init_args": {}}
            checkpoint["hyper_parameters"]["image_shape"] = [1, 32, 32]
        torch.save(checkpoint, path)
    assert run_train([command, "--ckpt_path", str(path)]) == code
    err = capsys.readouterr().err
    # Lightning's own INFO lines before
    assert "Traceback" not in err and message in err.strip().splitlines()[-1]


def test_use_commands_need_a_checkpoint_and_know_their_options(in_run, capsys):
    assert run_train(["predict"]) == 2
    assert "predict needs --ckpt_path" in capsys.readouterr().err
    assert run_train(["export", "--ckpt_path", "best", "--format", "tflite"]) == 2
    assert "--format tflite: choose one of onnx, torchscript, pt2" in capsys.readouterr().err
    assert run_train(["predict", "--help"], quiet=False) == 0
    assert "--inputs" in capsys.readouterr().out


@pytest.mark.slow
def test_a_moved_checkpoint_still_tests_from_what_it_carries(in_run, tmp_path, monkeypatch,
                                                            capsys):
    moved = tmp_path / "moved.ckpt"
    shutil.copy(json.loads((in_run.run / "results.json").read_text())["checkpoint"], moved)
    monkeypatch.chdir(tmp_path)  # away from its run
    code = run_train(["test", "--ckpt_path", str(moved), "--data.data_dir", str(in_run.data)])
    out, err = capsys.readouterr()
    assert code == 0, err[-1000:]
    assert "ImageClassifier(mlp) on mnist: test/acc" in out


def test_an_explicit_output_is_replaced_only_by_a_whole_file(in_run, tmp_path, capsys):
    mine = tmp_path / "mine.csv"
    mine.write_text("kept\n")
    (tmp_path / "notes.png").write_text("not an image")
    assert run_train(["predict", "--ckpt_path", "best", "--inputs", str(tmp_path / "notes.png"),
                      "--output", str(mine)]) == 1
    assert "nothing written" in capsys.readouterr().err and mine.read_text() == "kept\n"
    # asked for: replaced
    assert run_train(["predict", "--ckpt_path", "best", "--output", str(mine)]) == 0
    assert len(mine.read_text().splitlines()) == 201 and not list(tmp_path.glob("*.tmp*"))


def test_a_model_option_given_to_a_use_command_is_what_runs(in_run):
    """LightningCLI 2.6 puts a checkpoint's hyperparameters over the options given to it (its
    _parse_ckpt_path, Lightning-AI/pytorch-lightning#21455): here the options given win, and the
    records say so."""
    import yaml

    assert run_train(["test", "--ckpt_path", "best", "--model.flip_test", "true"]) == 0
    test_run = max((in_run.run / "test").glob("version_*"), key=lambda r: r.stat().st_mtime)
    assert yaml.safe_load(
        (test_run / "config.yaml").read_text())["model"]["init_args"]["flip_test"] is True
    assert yaml.safe_load((test_run / "hparams.yaml").read_text())["flip_test"] is True
    trained = yaml.safe_load(
        (in_run.run / "config.yaml").read_text())["model"]["init_args"]["flip_test"]
    assert trained is False  # the run itself tested without flips


def own_run(in_run, tmp_path) -> Path:
    """The run's best checkpoint copied into a run folder of this test's: the predictions beside
    it are this test's alone."""
    best = Path(json.loads((in_run.run / "results.json").read_text())["checkpoint"])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    return Path(shutil.copy(best, tmp_path / "run" / "checkpoints" / best.name))


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
            return cls(2026, 12, 5, 9, 30, 0)

    monkeypatch.setattr(lit_models.predict, "datetime", OneSecond)
    real, started = lit_models.predict.written_whole, []

    @contextlib.contextmanager
    def second_starts_meanwhile(path, *args):
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
    assert "nothing written" in capsys.readouterr().err
    assert not list((tmp_path / "run").glob("predictions*"))  # the name it took is free again
    kept = checkpoint.read_bytes()
    write_digits(tmp_path / "digits", in_run.data)
    image = sorted((tmp_path / "digits").glob("*.png"))[0]
    photo = image.read_bytes()
    for output in (checkpoint, image):
        assert run_train(["predict", "--ckpt_path", str(checkpoint), "--inputs", str(image),
                          "--output", str(output)]) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == (f"train.py: error: --output {output}: {output} is "
                       f"{checkpoint if output == checkpoint else image}, which this command "
                       f"reads; name another file")
    assert checkpoint.read_bytes() == kept and image.read_bytes() == photo
    assert run_train(["export", "--ckpt_path", str(checkpoint), "--format", "torchscript",
                      "--output", str(checkpoint)]) == 1
    assert "which this command reads" in capsys.readouterr().err
    assert checkpoint.read_bytes() == kept


def test_exports_without_an_output_take_a_name_each(tmp_path):
    from lit_models.export import export_target

    checkpoint = tmp_path / "run" / "checkpoints" / "best.ckpt"
    with export_target("onnx", None, checkpoint) as first:
        with export_target("onnx", None, checkpoint) as second:
            assert (first.name, second.name) == ("best.onnx", "best-1.onnx")
            assert first.exists() and second.exists()  # taken, for the next to see
        second.write_bytes(b"an export")
    with pytest.raises(RuntimeError):
        with export_target("onnx", None, checkpoint) as third:
            raise RuntimeError("the check failed")
    assert third.name == "best-2.onnx" and not third.exists()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["best-1.onnx", "best.onnx"]
