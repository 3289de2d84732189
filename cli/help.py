"""`python train.py --help`: the options a user changes, with the values the recipe gives them, first.

LightningCLI's own help lists ~600 lines of Trainer options and none of the model's or data's without
`--model.help CLASS`. This prints the model's and data module's own arguments (with the values this command
line would run with: the recipe's, or the overrides'), the Trainer arguments that are used most, and how to
get the rest (`--help all`: LightningCLI's full help).
"""

import inspect
import textwrap

import docstring_parser
from jsonargparse import Namespace

from cli import app
from cli.args import USAGE

# Filled in from the data by the CLI, and shown as such rather than as options.
LINKED = {"model": {"image_shape", "num_classes", "class_names", "mean", "std", "accumulate_grad_batches"},
          "data": {"seed", "accumulate_grad_batches"}}
TRAINER = ("max_epochs", "max_steps", "accelerator", "devices", "strategy", "num_nodes", "precision",
           "accumulate_grad_batches", "limit_train_batches", "log_every_n_steps", "enable_progress_bar",
           "fast_dev_run")
SUBCOMMANDS = """\
Subcommands (the first argument; none means fit):
  fit        train, then test the best checkpoint (the default)
  test       evaluate a checkpoint on the test split:  train.py test --ckpt_path best|last|RUN_DIR|FILE
  validate   evaluate a checkpoint on the validation split
  predict    classify image files or the test split:   train.py predict --ckpt_path best --inputs DIR
  export     write an ONNX, TorchScript or pt2 model:   train.py export --ckpt_path best --format onnx"""


def load_class(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)


def parameter_docs(cls) -> dict[str, str]:
    """The Args section of a class's docstrings, its bases' included, by argument name."""
    docs = {}
    for klass in reversed(cls.__mro__):
        for param in docstring_parser.parse(klass.__doc__ or "").params:
            docs[param.arg_name] = " ".join((param.description or "").split())
    return docs


def shown(value) -> str:
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict) and "class_path" in value:
        return value["class_path"].rsplit(".", 1)[-1]
    return "null" if value is None else str(value).replace("'", "")


def group_lines(group: str, config: Namespace, width: int = 34) -> list[str]:
    """One line per argument of the model or data class: option, value, what it does."""
    class_path = config[group]["class_path"]
    cls = load_class(class_path)
    docs, init_args = parameter_docs(cls), config[group]["init_args"]
    names = list(inspect.signature(cls.__init__).parameters)[1:]
    given = list(vars(init_args))
    names += [n for n in given if n not in names]  # the arguments a subclass passes on to its base
    lines = []
    for name in names:
        if name in LINKED[group] or name in ("self", "kwargs") or name not in given:
            continue
        value = init_args[name]
        option = f"  --{group}.{name} {shown(value)}"
        text = f"{option:{width}s} {docs.get(name, '')}".rstrip()
        lines += textwrap.wrap(text, 118, subsequent_indent=" " * (width + 1)) or [text]
        if isinstance(value, Namespace) and "init_args" in value:  # a callable's own arguments: the optimizer's
            for arg, arg_value in vars(value["init_args"]).items():
                if arg_value is not None and arg not in ("maximize", "differentiable", "foreach", "capturable"):
                    lines.append(f"    --{group}.{name}.{arg} {shown(arg_value)}")
    lines.append("  (set by the CLI: " + ("image_shape, num_classes, class_names, mean, std from the data module; "
                                          "accumulate_grad_batches from --trainer.accumulate_grad_batches)"
                                          if group == "model" else "seed from --seed_everything; "
                                          "accumulate_grad_batches from --trainer.accumulate_grad_batches)"))
    return lines


def print_help(stage: str, argv: list[str]) -> None:
    """The short help of `python train.py [STAGE] ARGS --help`, with ARGS' recipe and overrides applied."""
    _, config = app.parse(stage, argv)
    model, data = config["model"]["class_path"], config["data"]["class_path"]
    print(f"usage: {USAGE}\n")
    print("Train, test and use the PyTorch tutorials' image classifiers with Lightning. Every option is a")
    print("LightningCLI argument; the values below are what this command line would run with.\n")
    print(f"Model ({model}; --model cnn|mlp picks a recipe, configs/NAME.yaml; --model.help NAME):")
    print("\n".join(group_lines("model", config)) + "\n")
    print(f"Data ({data}; --data cifar10|mnist|fashion_mnist|image_folder; --data.help NAME):")
    print("\n".join(group_lines("data", config)) + "\n")
    print("Trainer (most used; every argument of lightning.pytorch.Trainer works as --trainer.NAME):")
    for name in TRAINER:
        print(f"  --trainer.{name} {shown(config['trainer'][name])}")
    print("\nRun:")
    print(f"  {'--seed_everything ' + str(config['seed_everything']):32s} shuffling, augmentation and "
          f"initialisation seed (true: a random one, recorded)")
    print("  --ckpt_path last|best|DIR|FILE   fit: resume; test/validate/predict/export: the checkpoint to use")
    print("  --config FILE                    options from a YAML file (--print_config writes one)")
    print(f"  {'--tf32 ' + str(config['tf32']):32s} TF32 matmuls and convolutions on NVIDIA GPUs")
    print("  --verbose                        tracebacks for errors that otherwise print one line\n")
    print(SUBCOMMANDS + "\n")
    print("Every option, with its type: python train.py --help all")
