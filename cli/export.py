"""`python train.py export --ckpt_path CKPT --format onnx|torchscript|pt2 [--output FILE]`: a trained model as one
file that a serving stack loads without this project: uint8 images (N, C, H, W) in, any N, class probabilities
(N, classes) out, the training set's normalisation inside.

    python train.py export --ckpt_path best --format onnx --output model.onnx   # pip install -e ".[export]"
    python train.py export --ckpt_path best --format pt2                        # torch.export.load(f).module()
    python train.py export --ckpt_path best --format torchscript                # torch.jit.load(f)

The class names travel in the file: ONNX metadata_props (`classes`, a JSON list, with `image_shape`, `mean`, `std`),
the archive's extra file `classes.json` for TorchScript and pt2, and for those two also beside it in
`FILE.classes.json`, which needs no torch API to read. Before it reports success the command loads the written file
the way a server would (onnxruntime for ONNX) and checks it against the checkpoint on real test images.
"""

import copy
import importlib.util
import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cli import app, runs
from cli.args import UsageError, option_value
from cli.predict import free_path, one_device
from lit_models import ImageClassifier

FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "pt2": ".pt2"}
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")  # torch's exporter needs the first two, the check the third
CHECK_IMAGES = 256
TOLERANCE = 1e-4  # on probabilities; float32 kernels of two runtimes agree to ~1e-7


class Servable(nn.Module):
    """The model as a server runs it: uint8 images (N, C, H, W) -> normalised -> network -> softmax."""

    def __init__(self, model: ImageClassifier):
        super().__init__()
        self.normalize = copy.deepcopy(model.normalize)
        # The standard layout: channels_last pays off in training kernels, and exporters handle NCHW best.
        self.net = copy.deepcopy(model.net).to(memory_format=torch.contiguous_format).float().eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(images)).softmax(1)


def run(checkpoint: runs.Checkpoint, argv: list[str]) -> dict:
    """`export`: write `checkpoint` as --format to --output, check the file against the checkpoint, and report."""
    fmt = option_value(argv, "--format") or "onnx"
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    if fmt == "onnx":
        require_onnx()
    model, data, _, run_ = app.build("export", one_device(argv), checkpoint=checkpoint)
    runs.check_compatible(checkpoint, model, data.name)
    model.load_state_dict(checkpoint.contents["state_dict"])
    model.cpu().eval()
    given = run_.config["output"]
    # Without --output: in the checkpoint's run directory (or beside the checkpoint), named after the checkpoint.
    output = Path(given).expanduser() if given else \
        free_path((checkpoint.run_dir or checkpoint.path.parent) / (checkpoint.path.stem + FORMATS[fmt]))
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder; name a file")
    images = test_images(data)
    metadata = file_metadata(model, checkpoint)
    check = write_checked(fmt, model, images, output, metadata)
    shape = ", ".join(map(str, model.hparams.image_shape))
    print(f"Exported {checkpoint.path.name} as {fmt} to {output} ({output.stat().st_size / 1024:.0f} KiB): "
          f"uint8 images (N, {shape}) -> probabilities of {len(model.class_names)} classes; class names "
          + ("in its metadata_props" if fmt == "onnx" else
             f"in its classes.json and beside it in {check['classes_file']}"))
    print(f"Checked with {check['runtime']} on {check['images']} test images of {data.name} (batches of "
          f"{' and '.join(map(str, check['batch_sizes']))}): probabilities within {check['max_difference']:.1e} of the "
          f"checkpoint's, {check['agree']} of {check['images']} top classes the same")
    return {"stage": "export", "format": fmt, "output": str(output), **check}


def write_checked(fmt: str, model: ImageClassifier, images: torch.Tensor, output: Path, metadata: dict) -> dict:
    """Export to a hidden file beside `output`, check it, then rename it into place: nothing half-written or
    unchecked is ever left at `output`. The temporary name keeps the format's extension (torch.export.load
    insists on .pt2)."""
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp{FORMATS[fmt]}")
    try:
        try:
            tmp.touch()
        except OSError as e:
            raise UsageError(f"--output {output} cannot be written ({e.strerror})") from None
        EXPORTERS[fmt](Servable(model).eval(), images[:2], tmp, metadata)
        check = check_file(fmt, tmp, images, model.classify(images).numpy())
        check["classes_file"] = None
        if fmt != "onnx":  # also beside the file, where any server can read it
            beside = output.with_name(output.name + ".classes.json")
            beside.write_text(metadata["classes"] + "\n")
            check["classes_file"] = str(beside)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return check


def require_onnx() -> None:
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"--format onnx needs {', '.join(missing)}, not installed here: pip install -e \".[export]\" "
                         f"(or pip install {' '.join(ONNX_PACKAGES)})")


def test_images(data) -> torch.Tensor:
    """The first CHECK_IMAGES uint8 images of the data set's test split, to check the exported file on."""
    return data.load_split("test")["images"][:CHECK_IMAGES].clone()


def file_metadata(model: ImageClassifier, checkpoint: runs.Checkpoint) -> dict[str, str]:
    """What a server needs to know beside the graph, as strings (ONNX metadata_props take only those)."""
    hp = model.hparams
    return {"classes": json.dumps(list(model.class_names)), "image_shape": json.dumps(list(hp.image_shape)),
            "mean": json.dumps(list(hp.mean or [])), "std": json.dumps(list(hp.std or [])),
            "input": "uint8 images (N, C, H, W), 0..255", "output": "class probabilities (N, classes)",
            "arch": hp.arch, "checkpoint": checkpoint.path.name}


def batch_dim():
    return torch.export.Dim("batch")


def export_onnx(servable: nn.Module, example: torch.Tensor, path: Path, metadata: dict) -> None:
    import onnx

    # torch's own (dynamo) exporter; one file, weights inside (external data is for models over 2 GB).
    torch.onnx.export(servable, (example,), str(path), input_names=["images"], output_names=["probabilities"],
                      dynamic_shapes=({0: batch_dim()},), dynamo=True, external_data=False, verbose=False)
    graph = onnx.load(str(path))
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def export_torchscript(servable: nn.Module, example: torch.Tensor, path: Path, metadata: dict) -> None:
    with jit_deprecation_quiet():
        torch.jit.save(torch.jit.script(servable), str(path), _extra_files={"classes.json": metadata["classes"]})


@contextmanager
def jit_deprecation_quiet():
    """TorchScript is deprecated in favour of torch.export (pt2), and torch says so on every call; it is what many
    serving stacks still load, so --format torchscript is asked for knowingly."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", FutureWarning)
        yield


def export_pt2(servable: nn.Module, example: torch.Tensor, path: Path, metadata: dict) -> None:
    program = torch.export.export(servable, (example,), dynamic_shapes=({0: batch_dim()},))
    torch.export.save(program, str(path), extra_files={"classes.json": metadata["classes"]})


EXPORTERS = {"onnx": export_onnx, "torchscript": export_torchscript, "pt2": export_pt2}


def load_file(fmt: str, path: Path):
    """The exported file loaded as a server would, as a function of a uint8 numpy batch; and the runtime's name."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return (lambda x: session.run(None, {"images": x})[0]), f"onnxruntime {onnxruntime.__version__}"
    with jit_deprecation_quiet():
        loaded = torch.jit.load(str(path)) if fmt == "torchscript" else torch.export.load(str(path)).module()
    runtime = "torch.jit.load" if fmt == "torchscript" else "torch.export.load"

    def predict(x):
        with torch.no_grad():
            return loaded(torch.from_numpy(x)).numpy()

    return predict, f"{runtime} (torch {torch.__version__})"


def check_file(fmt: str, path: Path, images: torch.Tensor, expected: np.ndarray) -> dict:
    """Run the exported file on `images` in two batch sizes (any N must work) and compare it with the checkpoint's
    probabilities; a runs.CheckpointError if it disagrees (nothing is then written)."""
    predict, runtime = load_file(fmt, path)
    x = images.numpy()
    got = np.concatenate([predict(x[:1]), predict(x[1:])]) if len(x) > 1 else predict(x)
    difference = float(np.abs(got - expected).max())
    agree = int((got.argmax(1) == expected.argmax(1)).sum())
    if difference > TOLERANCE or agree != len(x):
        raise runs.CheckpointError(f"the {fmt} export disagrees with the checkpoint on its test images (probabilities "
                                   f"up to {difference:.1e} apart, {len(x) - agree} top classes differ); not written")
    return {"runtime": runtime, "images": len(x), "batch_sizes": [1, len(x) - 1] if len(x) > 1 else [1],
            "max_difference": difference, "agree": agree}
