"""Exporting a trained model (`train.py export`, `export(model, data, ...)` from Python): a file a
serving stack loads without this project, checked against the model on real test images."""

import copy
import json
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import nn

from datamodules.files import output_file, written_whole
from lit_models import test_time
from lit_models.classifier import ImageClassifier, ModelError

FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "pt2": ".pt2"}
BATCH = torch.export.Dim("batch")  # any number of images


class Servable(nn.Module):
    """The model as a server runs it: uint8 images (N, C, H, W) in, class probabilities out."""

    def __init__(self, model: ImageClassifier):
        super().__init__()
        self.register_buffer("mean", model.mean.float().clone())
        self.register_buffer("std", model.std.float().clone())
        # NCHW and float32: channels_last pays off in training kernels, exporters handle the
        # standard layout best.
        net = copy.deepcopy(model.net).to(memory_format=torch.contiguous_format)
        self.net = net.float().eval()
        self.flip, self.shift = bool(model.hparams.flip_test), int(model.hparams.translate_test)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() / 255 - self.mean) / self.std
        logits = [self.net(view) for view in test_time.views(x, self.flip, self.shift)]
        return test_time.averaged(logits, self.flip).softmax(1)


def export(model: ImageClassifier, data, fmt: str = "onnx", output: str | None = None,
           checkpoint: Path | None = None) -> dict:
    """`train.py export`: write the model as `fmt` (onnx, torchscript, pt2) to `output` (default:
    beside the checkpoint's run), load the file as a server would, and check it against the model
    on up to 256 test images of `data` (in batches of 1 and of the rest: any N must work) before it
    takes its name."""
    if output is None and checkpoint is None:
        raise ModelError("export needs an output file or the checkpoint to name it after")
    folder, stem = (checkpoint.parent.parent, checkpoint.stem) if checkpoint else (None, None)
    # A refused output, before any work.
    claim = output_file(output, [checkpoint], folder, stem, FORMATS[fmt])
    if not isinstance(model, ImageClassifier):
        return export_own(model, fmt, claim)
    images = checking_images(data)
    model = model.cpu().eval()
    expected = model.classify(images).numpy()
    servable = Servable(model).eval()
    meta = metadata(model)
    # torch.export.load insists on the .pt2 extension.
    with claim as target, written_whole(target, FORMATS[fmt]) as tmp:
        run, runtime = WRITERS[fmt](servable, images, str(tmp), meta)
        difference, agree = check(run, images.numpy(), expected, fmt)
    if fmt != "onnx":
        # The class names beside the file too, where any server can read them.
        with written_whole(target.with_name(target.name + ".classes.json")) as tmp:
            tmp.write_text(meta["classes"] + "\n", encoding="utf-8")
    hp, n = model.hparams, len(images)
    print(f"Exported {getattr(checkpoint, 'name', 'the model')} as {fmt} to {target} "
          f"({target.stat().st_size / 1024:.0f} KiB): uint8 images (N, "
          f"{', '.join(map(str, hp.image_shape))}) -> probabilities of {hp.num_classes} classes")
    print(f"Checked with {runtime} on {n} test images (batches of 1 and {n - 1}): probabilities "
          f"within {difference:.1e} of the checkpoint's, {agree} of {n} top classes the same")
    return {"stage": "export", "format": fmt, "output": str(target),
            "max_difference": difference, "agree": agree}


def export_own(model: L.LightningModule, fmt: str, claim) -> dict:
    """A LightningModule of the user's, as it is, traced on its `example_input_array` by
    Lightning's and torch's exporters (an ImageClassifier's export is also checked on test
    images)."""
    example = model.example_input_array
    if not isinstance(example, torch.Tensor):
        raise ModelError(f"{type(model).__name__} has no example_input_array (a tensor): export "
                         f"traces the model on it; set it in the model's __init__")
    model = model.cpu().eval()
    with claim as target, written_whole(target, FORMATS[fmt]) as tmp:
        if fmt == "onnx":
            model.to_onnx(str(tmp), example, external_data=False)
        elif fmt == "torchscript":
            # torch's trace check fails on modules it renames between two traces (lazy layers)
            model.to_torchscript(str(tmp), "trace", example_inputs=example, check_trace=False)
        else:
            torch.export.save(torch.export.export(model, (example,)), tmp)
    kib = target.stat().st_size / 1024
    print(f"Exported {type(model).__name__} as {fmt} to {target} ({kib:.0f} KiB), traced on its "
          f"example_input_array {tuple(example.shape)}")
    return {"stage": "export", "format": fmt, "output": str(target)}


def checking_images(data) -> torch.Tensor:
    """Up to 256 test images of `data` as a CPU tensor (index_select reads DiskImages too)."""
    data.setup("test")
    test = data.test_dataloader()
    return test.images.index_select(0, test.indices[:256]).cpu()


def metadata(model: ImageClassifier) -> dict[str, str]:
    """What an ONNX file carries as metadata; the class names go into every format."""
    return {"classes": json.dumps(model.class_names, ensure_ascii=False),  # as given: no \u
            "image_shape": json.dumps(list(model.hparams.image_shape)),
            "input": "uint8 images (N, C, H, W), 0..255", "output": "class probabilities (N, C)"}


def write_onnx(servable: Servable, images: torch.Tensor, path: str, meta: dict):
    """Write and load an ONNX file; return how to run it and what runs it."""
    import onnx
    import onnxruntime

    torch.onnx.export(servable, (images[:2],), path, input_names=["images"],
                      output_names=["probabilities"], dynamic_shapes=({0: BATCH},), dynamo=True,
                      external_data=False, verbose=False)
    graph = onnx.load(path)
    for key, value in meta.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> np.ndarray:
        return session.run(None, {"images": x})[0]

    return run, f"onnxruntime {onnxruntime.__version__}"


def write_torchscript(servable: Servable, images: torch.Tensor, path: str, meta: dict):
    """Write and load a TorchScript file; return how to run it and what runs it."""
    extra_files = {"classes.json": meta["classes"]}
    torch.jit.save(torch.jit.script(servable), path, _extra_files=extra_files)
    return torch_runner(torch.jit.load(path))


def write_pt2(servable: Servable, images: torch.Tensor, path: str, meta: dict):
    """Write and load a torch.export program; return how to run it and what runs it."""
    program = torch.export.export(servable, (images[:2],), dynamic_shapes=({0: BATCH},))
    torch.export.save(program, path, extra_files={"classes.json": meta["classes"]})
    return torch_runner(torch.export.load(path).module())


def torch_runner(loaded):
    """How to run a loaded TorchScript or torch.export module on numpy images, and what runs it."""
    def run(x: np.ndarray) -> np.ndarray:
        return loaded(torch.from_numpy(x)).detach().numpy()

    return run, f"torch {torch.__version__}"


WRITERS = {"onnx": write_onnx, "torchscript": write_torchscript, "pt2": write_pt2}


def check(run, x: np.ndarray, expected: np.ndarray, fmt: str) -> tuple[float, int]:
    """The written file, run in batches of 1 and of the rest (any N must work), against the
    model's `expected` probabilities: the largest difference and how many top classes agree."""
    got = np.concatenate([run(x[:1]), run(x[1:])])
    difference = float(np.abs(got - expected).max())
    agree = int((got.argmax(1) == expected.argmax(1)).sum())
    if not difference <= 1e-4 or agree != len(x):  # NaN too
        raise ModelError(f"the {fmt} export disagrees with the checkpoint on {len(x)} test images "
                         f"(probabilities up to {difference:.1e} apart, "
                         f"{len(x) - agree} top classes differ); nothing written")
    return difference, agree
