"""`--data image_folder`: folders of PNG and JPEG files written here, read through the real module and CLI."""

import os
import re

import numpy as np
import pytest
import torch
import yaml
from conftest import class_images
from helpers import results, run_dirs, run_inprocess
from PIL import Image
from torchvision.datasets import ImageFolder

from datamodules import DataSetupError, ImageFolderDataModule, image_folder

# Written in this order; the module must number them as ImageFolder does, sorted.
CLASSES = ["zebra", "ant", "moth", "cat"]


def write_folder(root, splits=None, channels=3, size=16, ext="png", seed=0):
    """root/<split>/<class>/NNNN.<ext>: the learnable images of conftest, class k in CLASSES[k]."""
    for i, (split, n) in enumerate((splits or {"train": 160, "test": 40}).items()):
        images, labels = class_images(n, channels, size, num_classes=len(CLASSES), seed=seed + i)
        for j, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0] if channels == 1 else image).save(folder / f"{j:04d}.{ext}")
    return root


def module(root, tmp_path, **kwargs) -> ImageFolderDataModule:
    return ImageFolderDataModule(root=str(root), data_dir=str(tmp_path / "data"), **kwargs)


def ready(root, tmp_path, **kwargs) -> ImageFolderDataModule:
    dm = module(root, tmp_path, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def as_read_by_pil(dataset: ImageFolder, mode: str) -> torch.Tensor:
    arrays = [np.asarray(Image.open(path).convert(mode)).reshape(16, 16, -1) for path, _ in dataset.samples]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def snapshot(root) -> dict:
    """Every path under root with its bytes (or link target): to show that nothing was changed or deleted."""
    def content(p):
        return os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None

    return {str(p.relative_to(root)): content(p) for p in sorted(root.rglob("*"))}


@pytest.fixture
def png_dir(tmp_path):
    return write_folder(tmp_path / "images")


def test_reads_a_png_folder_as_torchvision_imagefolder_does(png_dir, tmp_path):
    dm = ready(png_dir, tmp_path)
    reference = ImageFolder(str(png_dir / "test"))
    assert dm.classes == reference.classes == sorted(CLASSES) and dm.num_classes == 4
    assert dm.image_shape == (3, 16, 16)
    test_images, test_labels = dm.splits["test"]
    assert test_images.dtype == torch.uint8
    assert torch.equal(test_labels, torch.tensor(reference.targets))
    assert torch.equal(test_images, as_read_by_pil(reference, "RGB"))
    # no val/ folder: a seeded tenth of train validates
    assert not dm.has_validation_split
    assert len(dm.splits["val"][0]) == 16 and len(dm.splits["train"][0]) == 144
    assert len(dm.mean) == 3 and 0.2 < sum(dm.mean) / 3 < 0.5  # from the pixels: noise 0..89, squares 230


def test_grey_jpegs_are_detected_as_one_channel(tmp_path):
    root = write_folder(tmp_path / "grey", channels=1, ext="jpg")
    dm = ready(root, tmp_path)
    assert dm.image_shape == (1, 16, 16)
    reference = ImageFolder(str(root / "test"))
    assert torch.equal(dm.splits["test"][0], as_read_by_pil(reference, "L"))
    # told otherwise: three (equal) channels
    rgb = ready(root, tmp_path, channels=3)
    assert rgb.image_shape == (3, 16, 16)
    assert torch.equal(rgb.splits["test"][0], dm.splits["test"][0].expand(-1, 3, -1, -1))


def test_colour_jpegs_stay_rgb_unless_told(tmp_path):
    root = write_folder(tmp_path / "colour", ext="jpeg")
    root_image = next((root / "train" / "ant").iterdir())
    Image.open(root_image).convert("RGB").save(root_image, quality=95)  # one more re-encoded JPEG
    assert ready(root, tmp_path).image_shape == (3, 16, 16)
    grey = ready(root, tmp_path, channels=1)
    assert grey.image_shape == (1, 16, 16)
    assert torch.equal(grey.splits["test"][0], as_read_by_pil(ImageFolder(str(root / "test")), "L"))


def test_images_of_other_sizes_need_image_size(png_dir, tmp_path):
    big = png_dir / "train" / "cat" / "big.png"
    Image.fromarray(np.full((40, 24, 3), 200, dtype=np.uint8)).save(big)  # 24 wide, 40 high
    with pytest.raises(DataSetupError, match=re.escape(f"{big} is 24x40 pixels") + ".*--data.image_size"):
        _ = module(png_dir, tmp_path).image_shape
    dm = ready(png_dir, tmp_path, image_size=12)
    assert dm.image_shape == (3, 12, 12)
    assert dm.splits["test"][0].shape == (40, 3, 12, 12)
    # the shorter side scaled to 12, then the middle 12x12: a uniform image stays uniform
    assert (dm.load_split("train")["images"] == 200).all((1, 2, 3)).sum() == 1


def test_a_val_folder_is_the_validation_set(tmp_path):
    root = write_folder(tmp_path / "images", {"train": 120, "val": 30, "test": 20})
    dm = ready(root, tmp_path)
    assert dm.has_validation_split
    assert len(dm.splits["train"][0]) == 120 and len(dm.splits["val"][0]) == 30  # all of train trains
    assert torch.equal(dm.splits["val"][0], as_read_by_pil(ImageFolder(str(root / "val")), "RGB"))


def test_second_setup_reads_the_cache_outside_the_folder(png_dir, tmp_path, monkeypatch):
    before = snapshot(png_dir)
    first = ready(png_dir, tmp_path)
    assert snapshot(png_dir) == before  # nothing written into the user's folder
    cache = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "data" / "cache").iterdir())
    assert cache == ["test.pt", "train.pt"]
    monkeypatch.setattr(ImageFolderDataModule, "decode", lambda self, split: pytest.fail("decoded again"))
    second = ready(png_dir, tmp_path)
    assert second.image_shape == (3, 16, 16)
    assert torch.equal(second.splits["test"][0], first.splits["test"][0])


def test_cache_is_rebuilt_when_a_file_changes_or_appears(png_dir, tmp_path):
    first = ready(png_dir, tmp_path)
    changed = ImageFolder(str(png_dir / "test")).samples[0][0]
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(changed)
    second = ready(png_dir, tmp_path)
    assert second.splits["test"][0][0].sum() == 0 and first.splits["test"][0][0].sum() > 0
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(png_dir / "test" / "ant" / "new.png")
    assert len(ready(png_dir, tmp_path).splits["test"][0]) == 41


def test_folders_with_the_same_name_get_their_own_caches(tmp_path):
    a = write_folder(tmp_path / "a" / "images", seed=0)
    b = write_folder(tmp_path / "b" / "images", seed=5)
    assert not torch.equal(ready(a, tmp_path).splits["test"][0], ready(b, tmp_path).splits["test"][0])
    assert len(list((tmp_path / "data" / "cache").iterdir())) == 4


def test_worker_processes_decode_the_same_pixels(png_dir, tmp_path, monkeypatch):
    serial = ready(png_dir, tmp_path)
    monkeypatch.setattr(image_folder, "CHUNK", 7)  # several chunks: a pool of processes decodes them
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    spawned = []
    real_pool = image_folder.ProcessPoolExecutor
    monkeypatch.setattr(image_folder, "ProcessPoolExecutor", lambda n: spawned.append(n) or real_pool(n))
    pooled = ready(png_dir, tmp_path / "other")
    assert spawned == [2, 2]
    for split in ("train", "val", "test"):
        assert torch.equal(pooled.splits[split][0], serial.splits[split][0])
    # a broken file found by a worker is still named
    broken = max((png_dir / "test" / "moth").iterdir())
    broken.write_bytes(broken.read_bytes()[:60])
    with pytest.raises(DataSetupError, match=re.escape(f"cannot read the image {broken}")):
        ready(png_dir, tmp_path / "other")


def test_non_image_files_are_ignored_with_a_count(png_dir, tmp_path):
    (png_dir / "train" / "ant" / "notes.txt").write_text("hello")
    (png_dir / "train" / "cat" / ".DS_Store").write_bytes(b"\0")
    (png_dir / "train" / "README").write_text("my images")
    (png_dir / "train" / ".ipynb_checkpoints").mkdir()  # a hidden folder is not a class
    with pytest.warns(UserWarning, match=r"ignored 3 files in .*train that are not images"):
        dm = ready(png_dir, tmp_path)
    assert dm.classes == sorted(CLASSES) and len(dm.splits["train"][0]) + len(dm.splits["val"][0]) == 160


# --- the command line ----------------------------------------------------------------------------

def test_cli_fits_and_tests_on_an_image_folder(png_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data", "image_folder", "--data.root", str(png_dir),
                          "--trainer.max_epochs=3", "--data.batch_size=16"])
    assert code == 0
    res = results(run_dirs(in_tmp)[0])
    assert (res["model"], res["data"], res["test_samples"]) == ("mlp", "image_folder", 40)
    assert res["test/acc"] > 0.6  # learnable data: chance is 0.25
    assert list(res["test/acc_per_class"]) == sorted(CLASSES)
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert state["net.fc1.weight"].shape[1] == 3 * 16 * 16  # the input shape follows the data
    assert any(p.name.startswith("image_folder-images-") for p in (in_tmp / "data" / "cache").iterdir())


def test_cnn_recipe_brings_its_batch_size_but_not_cifar10s_augmentation(png_dir, in_tmp, capsys):
    # `--data image_folder` after `--model cnn` keeps the recipe's batch size; flips are the data set's choice.
    assert run_inprocess(["--model", "cnn", "--data", "image_folder", "--data.root", str(png_dir),
                          "--print_config"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data["class_path"] == "datamodules.ImageFolderDataModule"
    assert {k: data["init_args"][k] for k in ("batch_size", "crop_padding", "flip")} == \
        {"batch_size": 128, "crop_padding": 0, "flip": False}


def break_missing_train(root):
    (root / "train").rename(root / "training")
    return "there is no folder .*/train"


def break_empty_class(root):
    for f in (root / "test" / "moth").iterdir():
        f.rename(root / f"moth-{f.name}")
    return "class folder .*test/moth has no images"


def break_test_classes(root):
    (root / "test" / "cat").rename(root / "test" / "dog")
    return "test must have the same class folders as .*train; missing: cat; not in train: dog"


def break_an_image(root):
    (root / "train" / "ant" / "broken.png").write_bytes(b"not a png at all")
    return "cannot read the image .*train/ant/broken.png"


def truncate_a_jpeg(root):
    path = next((root / "test" / "zebra").iterdir())
    Image.open(path).convert("RGB").save(root / "test" / "zebra" / "cut.jpg")
    data = (root / "test" / "zebra" / "cut.jpg").read_bytes()
    (root / "test" / "zebra" / "cut.jpg").write_bytes(data[: len(data) // 2])
    return r"cannot read the image .*test/zebra/cut.jpg \(OSError: "


def dangle_a_link(root):
    (root / "train" / "cat" / "gone.png").symlink_to(root / "nowhere.png")
    return "cannot read the image .*train/cat/gone.png: it is not a file"


@pytest.mark.parametrize("damage", [break_missing_train, break_empty_class, break_test_classes,
                                    break_an_image, truncate_a_jpeg, dangle_a_link])
def test_bad_folders_fail_with_a_clear_message_and_delete_nothing(damage, png_dir, in_tmp, capsys):
    message = damage(png_dir)
    before = snapshot(png_dir)
    code = run_inprocess(["--model", "mlp", "--data", "image_folder", "--data.root", str(png_dir),
                          "--trainer.max_epochs=1", "--data.batch_size=16"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("train.py: error: ") and "Traceback" not in err
    assert re.search(message, err), err
    assert snapshot(png_dir) == before
