"""Class names and run names kept whole: as given in results.json, config.yaml, the predictions
CSV, the exported file's class names and the console; TensorBoard's tags made of safe characters,
with a text that names each tag's class."""

import csv
import html
import json
import re

import yaml
from conftest import class_images, results, run_train, runs, scalars
from PIL import Image
from torchvision.datasets import FashionMNIST

# What a folder name may hold: spaces, dots, a leading dash, letters beyond ASCII, '#', '%', ':'.
NAMES = ["a b", "x.y", "-lead", "ünï", "c#1", "50%", "k:v"]
RUN, VERSION = "my run #1: 50% ünï", "-v.2 b"
# The characters of a TensorBoard tag (tf.summary's rule); '/' separates its parts.
TAG = re.compile(r"[-\w.]+")


def write_named_folder(root):
    """root/<split>/<name>/NNNN.png: 16 small images of each class of NAMES, 4 of them to test."""
    for i, (split, n) in enumerate({"train": 112, "test": 28}.items()):
        images, labels = class_images(n, 3, 8, num_classes=len(NAMES), seed=i)
        for j, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / NAMES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{j:04d}.png")
    return root


def per_class_tags(run) -> list[str]:
    """The run's per-class accuracy tags, each asserted to be of safe characters."""
    tags = [tag for tag in scalars(run) if tag.startswith("test/acc_class/")]
    assert all(TAG.fullmatch(tag.split("/", 2)[2]) for tag in tags), tags
    return tags


def tag_text(run) -> str:
    """`test/acc_class`'s text as TensorBoard's Text tab renders it, as plain text."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugin_util import markdown_to_safe_html

    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    (event,) = events.Tensors("test/acc_class/text_summary")
    source = event.tensor_proto.string_val[0].decode()
    return html.unescape(re.sub("<[^>]+>", "", markdown_to_safe_html(source)))


def test_class_and_run_names_are_whole_in_every_record(tmp_path, monkeypatch, capsys):
    root = write_named_folder(tmp_path / "images")
    monkeypatch.chdir(tmp_path)
    logger = ["--trainer.logger", "TensorBoardLogger", "--trainer.logger.init_args.save_dir",
              "logs", "--trainer.logger.init_args.name", RUN,
              "--trainer.logger.init_args.version", VERSION]
    data = ["--data", "ImageFolderDataModule", "--data.root", str(root), "--data.batch_size",
            "16"]
    assert run_train(["--model", "mlp", *data, "--trainer.max_epochs", "1", *logger]) == 0
    run = tmp_path / "logs" / RUN / VERSION
    assert f"logs in logs/{RUN}/{VERSION}" in capsys.readouterr().out

    text = (run / "results.json").read_text(encoding="utf-8")
    assert all(f'"{name}": ' in text for name in NAMES) and RUN in text  # not \u escapes
    assert set(results(run)["test/acc_per_class"]) == set(NAMES)
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert config["trainer"]["logger"]["init_args"]["name"] == RUN
    assert config["trainer"]["logger"]["init_args"]["version"] == VERSION

    tags = per_class_tags(run)
    assert len(tags) == len(NAMES)
    said = tag_text(run)
    assert all(f"{tag}: {name}" in said.splitlines() for tag, name in zip(tags, sorted(NAMES)))

    assert run_train(["predict", "--ckpt_path", str(run), "--output", "p.csv"]) == 0
    console = capsys.readouterr().out.split("GroundTruth:", 1)[1]
    assert all(name in console for name in NAMES)  # the split's rows, a few of each class
    with open("p.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert {row["true_label"] for row in rows} == set(NAMES)
    assert {row["label"] for row in rows} <= set(NAMES)

    # The class names an exported file carries (ONNX's metadata holds the same text).
    assert run_train(["export", "--ckpt_path", str(run), "--format", "torchscript", "--output",
                      "m.pt"]) == 0
    classes = (tmp_path / "m.pt.classes.json").read_text(encoding="utf-8")
    assert json.loads(classes) == sorted(NAMES) and "ünï" in classes


def test_a_class_name_with_a_slash_is_one_class_not_a_tag_path(fashion_mnist_dir, in_tmp):
    args = ["--model", "mlp", "--data", "FashionMNISTDataModule", "--data.data_dir",
            str(fashion_mnist_dir), "--trainer.max_epochs", "1", "--data.batch_size", "64"]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    assert set(results(run)["test/acc_per_class"]) == set(FashionMNIST.classes)  # T-shirt/top
    assert len(per_class_tags(run)) == len(FashionMNIST.classes)
    assert "test/acc_class/T-shirt_top: T-shirt/top" in tag_text(run).splitlines()


def test_class_names_that_share_a_tag_get_one_each():
    """'a b' and 'a_b' are both 'a_b' made safe: each takes its class's number."""
    from lit_models.tags import class_metrics

    assert class_metrics(["a b", "a_b", "T-shirt/top", "ünï"], "test") == {
        "test/acc_class/a_b_0": "a b", "test/acc_class/a_b_1": "a_b",
        "test/acc_class/T-shirt_top": "T-shirt/top", "test/acc_class/ünï": "ünï"}
