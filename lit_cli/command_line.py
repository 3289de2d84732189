"""What train.py does to its command line before and after LightningCLI parses it (README.md:
Train, Use): three rules that write it out, and one that reads the parsed configuration.

1. No subcommand: `fit`.
2. `--model NAME` is the recipe configs/NAME.yaml, read where it stands (`--config`); a command
   line that names no model, configuration or checkpoint gets the recipe cnn.
3. `--ckpt_path best|last|RUN` names one file of one run, and brings what the run was (runs.py).

And a class named on the command line (`--data X`, `--model.net X`, `--optimizer X`, ...) starts
from its own defaults, not from the settings that a configuration before it gave another class
(jsonargparse keeps those the new class also takes: omni-us/jsonargparse#460), unless it
extends that class (`--data FashionMNISTDataModule` after the MNIST recipe keeps its settings).
"""

import importlib.util
import inspect
from pathlib import Path

import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from lit_cli import runs
from lit_cli.errors import UsageError
from lit_cli.runs import pairs
from lit_models.networks import import_class


def recipes_folder() -> Path:
    """configs/ of a checkout (beside train.py), or of the installed package lit_image_classifiers
    (pyproject.toml installs train.py and configs/ as that package)."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "train.py").is_file():
        return checkout / "configs"
    package = importlib.util.find_spec("lit_image_classifiers")
    return Path(package.submodule_search_locations[0], "configs")


RECIPES = recipes_folder()
# Each subcommand, and the arguments of its Trainer method that are not options (LightningCLI's).
SUBCOMMANDS = {**LightningCLI.subcommands(), "export": {"model", "datamodule"}}
# The options that name a class (the parsed configuration holds `--model.X` at model.init_args.X).
CLASS_OPTIONS = ("--model", "--data", "--optimizer", "--lr_scheduler", "--model.net",
                 "--model.optimizer", "--model.scheduler")


def recipes() -> list[str]:
    """The recipes `--model NAME` takes: configs/NAME.yaml."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


RECIPE = "|".join(recipes())  # for a usage line

def expand(argv: list[str]) -> list[str]:
    """`argv` as LightningCLI parses it: the three rules applied."""
    subcommand, args = "fit", list(argv)
    if args and args[0] in SUBCOMMANDS:
        subcommand, args = args[0], args[1:]
    elif args and not args[0].startswith("-"):
        raise UsageError(f"unknown subcommand '{args[0]}'; choose one of: {', '.join(SUBCOMMANDS)}")
    args = [arg for option, value in pairs(args) for arg in recipe(option, value)]
    spec = runs.option(args, "--ckpt_path")
    configured = any(names_model(option, value) for option, value in pairs(args))
    helped = "-h" in args or "--help" in args
    if spec is not None:
        args = runs.replay(subcommand, spec, args, configured)
    elif subcommand != "fit" and not helped:
        raise UsageError(f"{subcommand} needs --ckpt_path: a checkpoint file, a run folder, or "
                         f"best/last")
    elif not (configured or helped):
        args = ["--config", str(RECIPES / "cnn.yaml"), *args]
    return [subcommand, *args]


def names_model(option: str, value: str | None) -> bool:
    """Whether an option names the model: `--model`, or a configuration file with a `model` (or
    one jsonargparse will say it cannot read)."""
    if option not in ("--config", "-c") or value is None:
        return option == "--model"
    try:
        return "model" in (yaml.safe_load(Path(value).read_text(encoding="utf-8")) or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError):
        return True


def recipe(option: str, value: str | None) -> list[str]:
    """One option written out: `--model NAME` as the recipe's `--config`, anything else as it is."""
    if value is None:
        return [option]
    if option != "--model" or "." in value or value[:1].isupper() or value.startswith("{"):
        return [f"{option}={value}"]
    if value not in recipes():
        raise UsageError(f"unknown recipe '{value}' (--model NAME is configs/NAME.yaml); choose "
                         f"one of: {', '.join(recipes())}, or give a class path")
    return ["--config", str(RECIPES / f"{value}.yaml")]


def from_own_defaults(config: Namespace, args: list[str]) -> None:
    """Each class the written-out command line `args` names for an option (CLASS_OPTIONS) reset to
    its own defaults, but for the settings given after it, unless it extends the class that the
    configuration files before it gave that option."""
    options = list(pairs(args))
    for i, (option, value) in enumerate(options):
        key = option[2:].replace("model.", "model.init_args.", 1)
        spec = config.get(key) if option in CLASS_OPTIONS else None
        if not isinstance(spec, Namespace) or not isinstance(spec.get("init_args"), Namespace):
            continue
        given = {k.removeprefix(option + ".") for k, _ in options[i + 1:]}
        cls = import_class(spec.class_path)
        before = class_before(key, options[:i])
        if before is not None and issubclass(cls, before):
            continue
        defaults = class_defaults(cls)
        for name in spec.init_args.keys():
            if name in defaults and name not in given:
                spec.init_args[name] = defaults[name]


def class_defaults(cls: type) -> dict:
    """The default of each argument of `cls`, with those its `**kwargs` pass to its bases."""
    defaults = {}
    for klass in cls.__mro__:
        parameters = inspect.signature(klass).parameters.values()
        defaults = {p.name: p.default for p in parameters if p.default is not p.empty} | defaults
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return defaults
    return defaults


def class_before(key: str, before: list[tuple[str, str | None]]) -> type | None:
    """The class that the last configuration file among the options `before` gives `key`."""
    found = None
    for value in [value for option, value in before if option in ("--config", "-c") and value]:
        try:
            node = yaml.safe_load(Path(value).read_text(encoding="utf-8"))
            for part in key.split("."):
                node = node[part]
            found = import_class(node["class_path"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ImportError, AttributeError):
            continue
    return found


def lightnings_flags_as_the_models(config: Namespace) -> None:
    """LightningCLI's `--optimizer` and `--lr_scheduler` as the model's own `optimizer` and
    `scheduler` where it takes them (ImageClassifier): what they name is what runs, planned over
    the run by the model, the optimizer's `lr` the one learning rate and a ReduceLROnPlateau's
    `monitor` kept; config.yaml records them there. A model without them gets LightningCLI's
    (its configure_optimizers replaced, as LightningCLI documents)."""
    init = config.model.get("init_args")
    for flag, option in {"optimizer": "optimizer", "lr_scheduler": "scheduler"}.items():
        if config.get(flag) is not None and isinstance(init, Namespace) and option in init:
            init[option], config[flag] = config[flag], None

