"""Using a trained model: test/validate a checkpoint, predict image files or a test split, export to ONNX,
TorchScript and pt2; and each kind of bad input. Models are trained once per module on data in the real formats
(MNIST's IDX files; a folder of PNG and JPEG files of mixed sizes and modes)."""

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import class_images
from helpers import QUIET, ROOT, finished_mnist_run, results, run_dirs, run_inprocess
from PIL import Image

from datamodules import ImageFolderDataModule
from lit_models import ImageClassifier

MLP = ["--model", "mlp", "--data.val_size=100", "--data.batch_size=50", "--trainer.max_epochs=2"]
CLASSES = ["zebra", "ant", "moth", "cat"]  # written in this order; ImageFolder sorts them


def tree(path) -> dict:
    """Every file under path with its bytes, to show that nothing changed."""
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A finished MLP run on MNIST IDX files: lightning_logs/mlp-mnist/version_0 with its best checkpoint tested."""
    done = finished_mnist_run(tmp_path_factory.mktemp("mlp"), MLP)
    done.results = results(done.run)
    done.best = next(p for p in (done.run / "checkpoints").glob("epoch*.ckpt"))
    return done


def write_mixed_folder(root):
    """root/train/<class>/ of 16x16 RGB PNGs; root/test/<class>/ of the same kind of images saved four ways:
    RGB PNG 32x32, grey JPEG 24x20, RGBA PNG 16x16, palette PNG 40x32 (so resized and centre-cropped)."""
    images, labels = class_images(160, 3, 16, num_classes=len(CLASSES), seed=0)
    for j, (image, label) in enumerate(zip(images, labels)):
        folder = root / "train" / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{j:04d}.png")
    images, labels = class_images(40, 3, 32, num_classes=len(CLASSES), seed=1)
    for j, (image, label) in enumerate(zip(images, labels)):
        folder = root / "test" / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(image)
        if j % 4 == 0:
            picture.save(folder / f"{j:04d}.png")
        elif j % 4 == 1:
            picture.convert("L").resize((24, 20)).save(folder / f"{j:04d}.jpg", quality=90)
        elif j % 4 == 2:
            picture.resize((16, 16)).convert("RGBA").save(folder / f"{j:04d}.png")
        else:
            picture.resize((40, 32)).convert("P").save(folder / f"{j:04d}.png")
    return root


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    """A CNN trained on an image folder (--data.image_size 16): its run, the folder and the data directory."""
    cwd = tmp_path_factory.mktemp("cnn")
    root = write_mixed_folder(cwd / "images")
    args = ["--model", "cnn", "--data", "image_folder", "--data.root", str(root), "--data.image_size=16",
            "--data.data_dir", str(cwd / "data"), "--data.val_size=40", "--data.batch_size=20",
            "--trainer.max_epochs=15"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert run_inprocess(args) == 0
    run = cwd / "lightning_logs" / "cnn-image_folder" / "version_0"
    return SimpleNamespace(cwd=cwd, root=root, data=cwd / "data", run=run, results=results(run),
                           best=next(p for p in (run / "checkpoints").glob("epoch*.ckpt")))


@pytest.fixture
def in_mlp(mlp_run, monkeypatch):
    monkeypatch.chdir(mlp_run.cwd)
    return mlp_run


@pytest.fixture
def in_cnn(cnn_run, monkeypatch):
    monkeypatch.chdir(cnn_run.cwd)
    return cnn_run


def fails(args, capsys, code, *phrases) -> str:
    """Run train.py in this process: it must exit with `code`, say each phrase on stderr, and print no traceback."""
    assert run_inprocess(args) == code
    err = capsys.readouterr().err
    for phrase in phrases:
        assert phrase in err, (phrase, err[-2000:])
    assert "Traceback" not in err
    return err


# --- test and validate a checkpoint -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["file", "run_dir", "best"])
def test_test_from_a_checkpoint_equals_the_training_runs_test_acc(spec, in_mlp, capsys):
    before = tree(in_mlp.run)
    ckpt = {"file": str(in_mlp.best), "run_dir": str(in_mlp.run), "best": "best"}[spec]
    assert run_inprocess(["test", "--ckpt_path", ckpt]) == 0
    out = capsys.readouterr().out
    new = run_dirs(in_mlp.cwd)[-1]
    record = results(new)
    assert new.parent == in_mlp.run.parent and new != in_mlp.run  # the same series, a directory of its own
    assert record["stage"] == "test" and record["checkpoint"] == str(in_mlp.best)
    assert abs(record["test/acc"] - in_mlp.results["test/acc"]) <= 1e-6
    assert record["test_samples"] == 200
    assert "Accuracy for class: 0 - zero" in out and f"test/acc {record['test/acc']:.4f} on 200 images" in out
    assert tree(in_mlp.run) == before  # the training run's files untouched


def test_test_applies_overrides_and_needs_nothing_repeated(in_mlp, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(in_mlp.data / "MNIST", moved / "MNIST")
    args = ["test", "--ckpt_path", str(in_mlp.best), "--data.data_dir", str(moved), "--data.eval_batch_size=7"]
    assert run_inprocess(args) == 0
    new = run_dirs(in_mlp.cwd)[-1]
    config = (new / "config.yaml").read_text()
    assert f"data_dir: {moved}" in config and "eval_batch_size: 7" in config and "arch: mlp" in config
    assert (moved / "cache").is_dir()  # it read the moved copy
    assert abs(results(new)["test/acc"] - in_mlp.results["test/acc"]) <= 1e-6


def test_validate_reproduces_the_best_epochs_val_acc(in_mlp, capsys):
    best_score = torch.load(in_mlp.run / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]
    best_score = next(v["best_model_score"] for k, v in best_score.items() if k.startswith("ModelCheckpoint"))
    assert run_inprocess(["validate", "--ckpt_path", str(in_mlp.run)]) == 0
    record = results(run_dirs(in_mlp.cwd)[-1])
    assert record["stage"] == "validate"
    assert abs(record["val/acc"] - float(best_score)) <= 1e-6


# --- predict -------------------------------------------------------------------------------------------------


def test_predict_a_folder_of_mixed_images_gives_the_labels_of_the_data_module(in_cnn, tmp_path, capsys):
    out = tmp_path / "p.csv"
    # Batches of 16: three, decoded by worker processes.
    assert run_inprocess(["predict", "--ckpt_path", str(in_cnn.run), "--inputs", str(in_cnn.root / "test"),
                          "--output", str(out), "--top_k", "2", "--data.eval_batch_size=16"]) == 0
    rows = read_csv(out)
    assert list(rows[0]) == ["path", "label", "probability", "top2", "top2_probability"]
    # The same files through the data module the model was trained with, classified by the model itself.
    data = ImageFolderDataModule(root=str(in_cnn.root), image_size=16, data_dir=str(in_cnn.data))
    data.prepare_data()
    data.setup("test")
    images, _ = data.splits["test"]
    model = ImageClassifier.load_from_checkpoint(in_cnn.best)
    probabilities = model.classify(images)
    files = [str(f) for f in data.source_files("test")]
    assert sorted(row["path"] for row in rows) == sorted(files) and len(files) == 40
    by_path = {row["path"]: row for row in rows}
    labels = [by_path[f]["label"] for f in files]
    assert labels == [model.class_names[i] for i in probabilities.argmax(1)]
    assert len(set(labels)) == len(CLASSES)  # a model that tells the classes apart, so the comparison means something
    for f, p in zip(files, probabilities):
        assert abs(float(by_path[f]["probability"]) - p.max().item()) <= 1e-5
        assert float(by_path[f]["top2_probability"]) <= float(by_path[f]["probability"])
    printed = capsys.readouterr().out
    assert "Predicted 40 images in" in printed and f"wrote {out}" in printed


def test_predict_needs_only_the_checkpoint_and_takes_files_and_globs(in_cnn, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "moved"
    shutil.copytree(in_cnn.root / "test", elsewhere)
    (elsewhere / "cat" / "notes.txt").write_text("not an image")
    ckpt = tmp_path / "model.ckpt"
    shutil.copy(in_cnn.best, ckpt)
    monkeypatch.chdir(tmp_path)
    inputs = [str(elsewhere / "cat" / "*"), str(next(p for p in elsewhere.rglob("*.jpg") if p.parent.name != "cat"))]
    # The training folder and the data cache gone: what the model needs to know about its inputs is in the checkpoint.
    hidden = [(path, path.with_name(path.name + "-hidden")) for path in (in_cnn.root, in_cnn.data)]
    for path, away in hidden:
        path.rename(away)
    try:
        assert run_inprocess(["predict", "--ckpt_path", str(ckpt), "--inputs", *inputs, "--top_k", "9"]) == 0
    finally:
        for path, away in hidden:
            away.rename(path)
    (out,) = tmp_path.glob("predictions-*.csv")  # beside a checkpoint that is in no run directory
    rows = read_csv(out)
    expected = sorted(str(p) for p in (elsewhere / "cat").iterdir() if p.suffix != ".txt") + [inputs[1]]
    assert [row["path"] for row in rows] == expected
    assert list(rows[0])[-2:] == ["top4", "top4_probability"]  # --top_k 9 of 4 classes lists 4
    assert all(abs(sum(float(row[k]) for k in row if "probability" in k) - 1) < 1e-4 for row in rows)
    model = ImageClassifier.load_from_checkpoint(ckpt)  # the README's two lines give the same answer
    for row in rows:
        assert model.class_names[model.classify(Image.open(row["path"])).argmax()] == row["label"]


def test_predict_without_inputs_predicts_the_test_split_with_true_labels(in_mlp, capsys):
    assert run_inprocess(["predict", "--ckpt_path", "best"]) == 0
    out = capsys.readouterr().out
    csv_files = sorted(in_mlp.run.glob("predictions-*.csv"))
    rows = read_csv(csv_files[-1])
    assert len(rows) == 200 and rows[0]["path"] == "mnist:test:0" and "true_label" in rows[0]
    accuracy = sum(row["label"] == row["true_label"] for row in rows) / len(rows)
    assert abs(accuracy - in_mlp.results["test/acc"]) <= 1e-6  # the tutorial's "accuracy of the loaded model"
    ground_truth = [line for line in out.splitlines() if line.startswith("GroundTruth:")]
    assert ground_truth and rows[0]["true_label"] in ground_truth[0]
    assert f"accuracy {accuracy:.4f}" in out and f"wrote {csv_files[-1]}" in out


def test_predict_never_overwrites_its_default_output(in_mlp, capsys):
    before = set(in_mlp.run.glob("predictions-*.csv"))
    for _ in range(2):
        assert run_inprocess(["predict", "--ckpt_path", str(in_mlp.run), "--data.eval_batch_size=64"]) == 0
    assert len(set(in_mlp.run.glob("predictions-*.csv")) - before) == 2


def test_an_unreadable_image_is_named_skipped_and_counted(in_cnn, tmp_path, capsys):
    folder = tmp_path / "mixed"
    shutil.copytree(in_cnn.root / "test" / "cat", folder)
    good = len(list(folder.iterdir()))
    (folder / "truncated.png").write_bytes(next(folder.glob("*.png")).read_bytes()[:60])
    (folder / "text.jpg").write_text("not a JPEG")
    out = tmp_path / "p.csv"
    assert run_inprocess(["predict", "--ckpt_path", str(in_cnn.best), "--inputs", str(folder), "--output",
                          str(out), "--data.eval_batch_size=4"]) == 0  # the errors come from worker processes
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "truncated.png" in captured.err and "text.jpg" in captured.err
    assert "2 unreadable files skipped" in captured.out
    assert len(read_csv(out)) == good and not any("text.jpg" in r["path"] for r in read_csv(out))


def test_every_image_unreadable_fails_and_writes_nothing(in_cnn, tmp_path, capsys):
    (tmp_path / "a.png").write_bytes(b"\x89PNG broken")
    (tmp_path / "b.jpg").write_bytes(b"")
    fails(["predict", "--ckpt_path", str(in_cnn.best), "--inputs", str(tmp_path), "--output",
           str(tmp_path / "p.csv")], capsys, 1, "none of the 2 images could be read")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.jpg"]


@pytest.mark.parametrize("problem", ["missing-file", "empty-folder", "glob"])
def test_inputs_that_match_no_image(problem, in_cnn, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no images here")
    spec = {"missing-file": str(tmp_path / "nope.png"), "empty-folder": str(tmp_path / "empty"),
            "glob": str(tmp_path / "*.jpg")}[problem]
    before = tree(in_cnn.run)
    fails(["predict", "--ckpt_path", str(in_cnn.best), "--inputs", spec], capsys, 1, f"--inputs {spec}")
    assert tree(in_cnn.run) == before


@pytest.mark.parametrize("where", ["no-folder", "a-folder"])
def test_predict_output_that_cannot_be_written(where, in_cnn, tmp_path, capsys):
    target = tmp_path / "missing" / "p.csv" if where == "no-folder" else tmp_path
    fails(["predict", "--ckpt_path", str(in_cnn.best), "--inputs", str(in_cnn.root / "test"), "--output",
           str(target)], capsys, 2, f"--output {target}")
    assert list(tmp_path.iterdir()) == []


# --- bad checkpoints, for every command that uses one --------------------------------------------------------


def bad_checkpoint(problem, run, tmp_path):
    if problem == "missing":
        return str(tmp_path / "nope.ckpt"), "does not exist"
    if problem == "truncated":
        (tmp_path / "t.ckpt").write_bytes(run.best.read_bytes()[:3000])
        return str(tmp_path / "t.ckpt"), "may be truncated"
    if problem == "not-a-checkpoint":
        (tmp_path / "notes.ckpt").write_text("hello")
        return str(tmp_path / "notes.ckpt"), "cannot be read"
    if problem == "other-project":
        torch.save({"state_dict": {"layer.weight": torch.zeros(2)}, "hyper_parameters": {"lr": 0.1}},
                   tmp_path / "other.ckpt")
        return str(tmp_path / "other.ckpt"), "of another project"
    (tmp_path / "version_9" / "checkpoints").mkdir(parents=True)
    return str(tmp_path / "version_9"), "has no checkpoints"


@pytest.mark.parametrize("problem", ["missing", "truncated", "not-a-checkpoint", "other-project", "empty-run"])
@pytest.mark.parametrize("command", ["test", "predict", "export"])
def test_bad_checkpoints_fail_in_one_line_and_write_nothing(command, problem, in_mlp, tmp_path, capsys):
    ckpt, phrase = bad_checkpoint(problem, in_mlp, tmp_path)
    before, before_tmp = tree(in_mlp.cwd), tree(tmp_path)
    extra = {"predict": ["--inputs", str(in_mlp.cwd)], "export": ["--format", "pt2"]}.get(command, [])
    fails([command, "--ckpt_path", ckpt, *extra], capsys, 1, phrase)
    assert tree(in_mlp.cwd) == before and tree(tmp_path) == before_tmp


# --- export --------------------------------------------------------------------------------------------------

LOAD_WITHOUT_THE_PROJECT = textwrap.dedent("""
    import json, sys
    for name in ("lit_models", "datamodules", "cli", "train"):
        sys.modules[name] = None  # any import of this project fails
    import numpy as np
    fmt, path, images = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
    if fmt == "onnx":
        import onnx, onnxruntime
        meta = {p.key: p.value for p in onnx.load(path).metadata_props}
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        out = session.run(None, {"images": images})[0]
        classes = json.loads(meta["classes"])
    else:
        import torch
        model = torch.jit.load(path) if fmt == "torchscript" else torch.export.load(path).module()
        out = model(torch.from_numpy(images)).detach().numpy()
        classes = json.load(open(path + ".classes.json"))
    np.save(sys.argv[4], out)
    print(json.dumps(classes))
""")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "pt2"])
def test_export_round_trips_without_the_project(fmt, in_cnn, tmp_path, capsys):
    pytest.importorskip("onnxruntime") if fmt == "onnx" else None
    out = tmp_path / f"model.{fmt}"
    assert run_inprocess(["export", "--ckpt_path", "best", "--format", fmt, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"to {out}" in printed and "40 of 40 top classes the same" in printed  # checked on the test split
    # Loaded in a fresh interpreter that cannot import this project, on images in any batch size.
    data = ImageFolderDataModule(root=str(in_cnn.root), image_size=16, data_dir=str(in_cnn.data))
    images = data.load_split("test")["images"][:13]
    import numpy as np

    np.save(tmp_path / "images.npy", images.numpy())
    done = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_THE_PROJECT, fmt, str(out), str(tmp_path / "images.npy"),
                           str(tmp_path / "out.npy")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-2000:]
    model = ImageClassifier.load_from_checkpoint(in_cnn.best)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == model.class_names
    expected = model.classify(images)
    got = torch.from_numpy(np.load(tmp_path / "out.npy"))
    assert (got - expected).abs().max() <= 1e-4
    assert torch.equal(got.argmax(1), expected.argmax(1))


def test_export_without_onnxruntime_says_what_to_install(in_cnn, tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else
                        find_spec(name, *a))
    fails(["export", "--ckpt_path", "best", "--format", "onnx", "--output", str(tmp_path / "m.onnx")], capsys, 2,
          "onnxruntime", 'pip install -e ".[export]"')
    assert list(tmp_path.iterdir()) == []


def test_an_export_that_disagrees_with_the_checkpoint_is_not_written(in_cnn, tmp_path, monkeypatch, capsys):
    from cli import export

    monkeypatch.setattr(export, "TOLERANCE", -1.0)  # no file can pass: as if the exporter had changed the numbers
    fails(["export", "--ckpt_path", "best", "--format", "torchscript", "--output", str(tmp_path / "m.pt")], capsys, 1,
          "the torchscript export disagrees with the checkpoint", "not written")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, phrase", [
    (["--format", "tflite"], "--format tflite: choose one of onnx, torchscript, pt2"),
    (["--format", "pt2", "--output", "/nonexistent/m.pt2"], "--output /nonexistent/m.pt2 cannot be written"),
], ids=["unknown-format", "unwritable-output"])
def test_export_bad_arguments_exit_2(args, phrase, in_cnn, capsys):
    before = tree(in_cnn.run)
    fails(["export", "--ckpt_path", "best", *args], capsys, 2, phrase)
    assert tree(in_cnn.run) == before


@pytest.mark.slow
def test_predict_in_a_fresh_process_as_a_user_types_it(cnn_run, tmp_path):
    """Real processes: the entry point, worker processes decoding the files, exit codes and what is printed."""
    def train_py(*args):
        return subprocess.run([sys.executable, str(ROOT / "train.py"), *args, *QUIET], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=240)

    out = tmp_path / "p.csv"
    done = train_py("predict", "--ckpt_path", str(cnn_run.run), "--inputs", str(cnn_run.root / "test"), "--output",
                    str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Predicted 40 images in" in done.stdout and len(read_csv(out)) == 40
    missing = tmp_path / "nothing"
    done = train_py("predict", "--ckpt_path", str(cnn_run.run), "--inputs", str(missing))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"train.py: error: --inputs {missing}: no such file or folder"
