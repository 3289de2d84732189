"""The strong-baseline recipe's parts (`--model whitened`), each on its own: the network, the
patch whitening, test-time shifts, reflected crops; and the recipe through train.py."""

import functools

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import PROBES, results, run_process, run_train, runs

from datamodules import CIFAR10DataModule
from datamodules.augment import random_crop
from lit_models import (
    ImageClassifier,
    ModelError,
    PatchWhitening,
    WhitenedNet,
    test_time,
    whitening,
)
from lit_models.export import Servable

SMALL = ["--model.net.widths", "[16, 32]", "--data.batch_size", "100"]


def test_the_network_takes_any_image_size_its_groups_fit_and_freezes_its_stem():
    net = WhitenedNet((3, 32, 32), 10)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert [name for name, p in net.named_parameters() if not p.requires_grad] == [
        "whiten.weight", *(f"group{g}.norm{n}.weight" for g in (1, 2, 3) for n in (1, 2))]
    # before PatchWhitening: each value of a 2x2 patch and its negation
    patch = torch.arange(12.0).view(1, 3, 2, 2)
    assert net.whiten(patch).flatten().tolist() == [*range(12), *(-v for v in range(12))]
    assert WhitenedNet((1, 28, 28), 3, widths=[8, 8, 8])(torch.zeros(2, 1, 28, 28)).shape == (2, 3)
    with pytest.raises(ValueError, match="groups need larger images"):
        WhitenedNet((3, 8, 8), 10, widths=[8, 8, 8, 8])
    with pytest.raises(ValueError, match="positive widths"):
        WhitenedNet((3, 32, 32), 10, widths=[])


def fit_whitened(data, net=functools.partial(WhitenedNet, widths=[8]), eps=1e-6):
    """A model fitted for one epoch, whitened from every training image."""
    model = ImageClassifier(net, optimizer=functools.partial(torch.optim.AdamW, lr=0.1))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[PatchWhitening(images=10_000, eps=eps)])
    trainer.fit(model, datamodule=data)
    return model


def test_patch_whitening_decorrelates_the_patches_the_layer_sees(cifar10_dir):
    data = CIFAR10DataModule(str(cifar10_dir), batch_size=100, val_size=0, crop_padding=0,
                             flip=False)
    model = fit_whitened(data)
    stem = model.net.whiten
    assert not stem.weight.requires_grad
    # the first half of the stem's channels: the patches' principal components, of unit variance
    covariance = output_covariance(model, data, stem.weight[:12])
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=2e-3)
    assert torch.equal(stem.weight[12:], -stem.weight[:12])


def output_covariance(model, data, weight):
    """The covariance of a convolution's outputs over every training image, normalised as the
    model does."""
    images = data.splits["train"][0].float() / 255
    with torch.no_grad():
        out = F.conv2d((images - model.mean) / model.std, weight)
    return torch.cov(out.transpose(0, 1).reshape(len(weight), -1).double())


def test_patch_whitening_whitens_another_networks_first_convolution(cifar10_dir):
    data = CIFAR10DataModule(str(cifar10_dir), batch_size=100, val_size=0, crop_padding=0,
                             flip=False)
    model = fit_whitened(data, net="cnn")  # conv1: 6 of the 75 values of a 5x5 patch
    assert not model.net.conv1.weight.requires_grad
    covariance = output_covariance(model, data, model.net.conv1.weight[:3])
    assert torch.allclose(covariance, torch.eye(3, dtype=torch.float64), atol=2e-3)


def test_patch_whitening_names_a_layer_it_cannot_whiten():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 1), torch.nn.Linear(2, 2))
    with pytest.raises(ModelError, match="0 .4 channels, groups 1. must be .* at most twice"):
        PatchWhitening().find(net)  # 2 directions in patches of one value
    with pytest.raises(ModelError, match="1 is not a convolution of the model .*: 0."):
        PatchWhitening("1").find(net)


@pytest.mark.slow
def test_a_resumed_fit_keeps_the_checkpoints_whitening_and_ends_as_an_unbroken_one(
        cifar10_dir, tmp_path, monkeypatch):
    args = ["--model", "whitened", "--data.data_dir", str(cifar10_dir), *SMALL,
            "--trainer.max_epochs", "1", "--trainer.limit_test_batches", "1"]  # 5 steps
    stop = ["--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=3"]
    for folder in ("straight", "stopped"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "straight")
    assert run_train(args) == 0
    monkeypatch.chdir(tmp_path / "stopped")
    assert run_train(args + stop) == 143

    def computed_again(*args):
        """whitening.patch_moments, which the resumed fit must not call."""
        raise AssertionError("the whitening was computed again")

    monkeypatch.setattr(whitening, "patch_moments", computed_again)
    assert run_train([*args, "--ckpt_path", "last"]) == 0
    straight, resumed = (torch.load(runs(tmp_path / folder)[0] / "checkpoints" / "last.ckpt",
                                    weights_only=True)["state_dict"]
                         for folder in ("straight", "stopped"))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_test_time_shifts_are_reflected_views_at_half_the_weight():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    plain, flipped, up_left, down_right, *mirrored = test_time.views(x, True, 1)
    assert torch.equal(flipped, x.flip(3)) and len(mirrored) == 2
    assert up_left[0, 0, 0].tolist() == [5, 4, 5, 6] and up_left[0, 0, 1].tolist() == [1, 0, 1, 2]
    assert down_right[0, 0, 2:].tolist() == [[13, 14, 15, 14], [9, 10, 11, 10]]
    assert torch.equal(mirrored[0], up_left.flip(3))
    logits = [torch.full((1, 2), v) for v in (1.0, 3.0, 10.0, 10.0, 10.0, 10.0)]
    assert test_time.averaged(logits, True).tolist() == [[6.0, 6.0]]  # (2 + 10) / 2
    assert test_time.averaged(logits[:2], True).tolist() == [[2.0, 2.0]]  # flips alone, as ever
    assert len(test_time.views(x, False, 2)) == 3


def test_translate_test_is_used_in_evaluation_only_and_refuses_negative_shifts():
    model = ImageClassifier(WhitenedNet, image_shape=(3, 32, 32), num_classes=10, mean=[0.5] * 3,
                            std=[0.25] * 3, translate_test=2)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    model.eval()
    x = (images.float() / 255 - 0.5) / 0.25
    with torch.no_grad():
        expected = test_time.averaged([model.net(v) for v in test_time.views(x, False, 2)], False)
        assert torch.allclose(model(images), expected, atol=1e-5)
        assert not torch.allclose(model(images), model.net(x), atol=1e-3)
        model.train()
        assert torch.allclose(model(images), model.net(x), atol=1e-5)
    with pytest.raises(ModelError, match="translate_test -1"):
        ImageClassifier(translate_test=-1)


def test_an_exported_model_shifts_and_flips_as_the_model_does():
    model = ImageClassifier(WhitenedNet, image_shape=(3, 32, 32), num_classes=10, mean=[0.5] * 3,
                            std=[0.25] * 3, translate_test=1, flip_test=True).eval()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    servable = Servable(model).eval()
    scripted = torch.jit.script(servable)
    with torch.no_grad():
        assert torch.allclose(servable(images), model.classify(images), atol=1e-6)
        assert torch.allclose(scripted(images), model.classify(images), atol=1e-6)


def test_reflected_crops_shift_the_image_with_mirrored_borders():
    images = torch.arange(64, dtype=torch.uint8).view(1, 1, 8, 8).expand(300, 1, 8, 8).contiguous()
    cropped = random_crop(images, 2, torch.Generator().manual_seed(0), reflect=True)
    padded = F.pad(images[:1].float(), (2, 2, 2, 2), mode="reflect")[0].to(torch.uint8)
    crops = {(dy, dx): padded[:, dy:dy + 8, dx:dx + 8] for dy in range(5) for dx in range(5)}
    found = {next(k for k, crop in crops.items() if torch.equal(image, crop)) for image in cropped}
    assert found == set(crops)  # every offset, and nothing else


@pytest.mark.slow
def test_the_recipe_in_two_epochs_learns_and_its_checkpoint_tests_and_exports(
        cifar10_dir, in_tmp, capsys, recwarn):
    # The short variant of the long CPU run (docs/benchmarks.md): the recipe, 2 epochs of 10
    # steps, widths [16, 32, 32] for [64, 256, 256], on conftest's tiny CIFAR-10. Its classes are
    # a square's position, which a network that max-pools over the whole image tells apart only
    # by the borders' effects (measured 0.45): the floor says it learns, three times chance.
    args = ["--model", "whitened", "--data.data_dir", str(cifar10_dir), "--data.batch_size",
            "50", "--trainer.max_epochs", "2", "--model.net.widths", "[16, 32, 32]"]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    record = results(run)
    assert record["metrics"]["test/acc"] >= 0.3 and record["global_step"] == 20
    # No validation split was asked for: Lightning's "make sure this was your intention" is noise.
    assert [str(w.message) for w in recwarn if "across ranks is zero" in str(w.message)] == []
    capsys.readouterr()
    assert run_train(["test", "--ckpt_path", "last"]) == 0  # no validation: no best
    assert f"test/acc {record['metrics']['test/acc']:.4f}" in capsys.readouterr().out
    # TorchScript: the whitened network's export, checked as every format is (ONNX's own export
    # is test_use's, at a few seconds a run).
    assert run_train(["export", "--ckpt_path", "last", "--format", "torchscript", "--output",
                      "m.pt"]) == 0
    assert "200 of 200 top classes the same" in capsys.readouterr().out


@pytest.mark.slow
def test_two_process_ddp_whitens_every_replica_alike(cifar10_dir, tmp_path):
    """The first process's patch whitening, broadcast (lit_models/whitening.py): each replica
    whitens, and so trains, alike."""
    done = run_process(["--model", "whitened", "--data.data_dir", str(cifar10_dir), *SMALL,
                        "--data.batch_size", "50", "--trainer.max_epochs", "1",
                        "--trainer.accelerator", "cpu", "--trainer.devices", "2",
                        "--trainer.strategy", "ddp", "--trainer.callbacks+=probes.SaveWeights"],
                       cwd=tmp_path, env=PROBES)
    assert done.returncode == 0, done.stderr[-3000:]
    zero, one = (torch.load(tmp_path / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1))
    # The norms' running statistics are each process's own, of its own batches, as in any DDP
    # run without --trainer.sync_batchnorm; checkpoints keep the first process's.
    assert all(torch.equal(zero[k], one[k]) for k in zero if ".running_" not in k)
    initial = WhitenedNet((3, 32, 32), 10, widths=[16, 32]).whiten.weight
    assert not torch.equal(zero["net.whiten.weight"], initial)
    assert results(runs(tmp_path)[0])["global_step"] == 5  # 250 images a process, 50 a batch
