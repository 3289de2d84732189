"""The command line's short forms, written out as LightningCLI parses them (README.md: Train, Use).

LightningCLI takes subcommands, class paths and `--config FILE`; these are the few things it cannot
do by itself, and the one place where train.py reads its command line before LightningCLI does.
"""

import importlib.util
import itertools
import json
import os
import random
from contextlib import suppress
from pathlib import Path

import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_only

import datamodules
from lit_cli import runs
from lit_cli.errors import UsageError
from lit_models import NETWORKS, ImageClassifier
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
DEFAULT_RECIPE = "cnn"
DESCRIPTION = ("Train, test and use image classifiers with LightningCLI (README.md has the whole "
               "path). The model's options: --model.help ImageClassifier (or a LightningModule of "
               "yours); its network's: --model.net.help mlp (or cnn, or a class).")

# The classes a short name stands for, by the option that takes it.
SHORT_NAMES = {"--data": datamodules.DATA, "--data.help": datamodules.DATA,
               "--model.net": NETWORKS, "--model.net.help": NETWORKS}


def recipes() -> list[str]:
    """The recipes `--model NAME` takes: configs/NAME.yaml."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def usage() -> str:
    """train.py's usage line, with the names it knows."""
    return (f"train.py [{'|'.join(SUBCOMMANDS)}] [--model {'|'.join(recipes())}] "
            f"[--data {'|'.join(datamodules.DATA)}] [--config FILE] [--ckpt_path CKPT] "
            f"[--trainer.*] [--model.*] [--data.*]")


def expand(argv: list[str]) -> list[str]:
    """`argv` with its short forms written out:

    - no subcommand: `fit`;
    - `--model NAME`: the recipe `--config configs/NAME.yaml`, before the other options, so that
      they override it; without one (and no `--config` naming a model), configs/cnn.yaml;
    - `--data NAME`, `--model.net NAME`, and their `.help NAME`: the class's import path;
    - `--inputs A B ...` (predict): the list [A, B, ...];
    - `--ckpt_path best|last|RUN`: the checkpoint file, after its run's config.yaml (runs.replay;
      a fit given a `--config` or `--model` of its own takes that instead).
    """
    subcommand, args = split_subcommand(argv)
    given_recipes, args = written_out(args)
    models = [sets_model(config) for config in configs(args)]
    spec = runs.option(args, "--ckpt_path")[0]
    model_given = runs.option(args, "--model")[0] is not None
    configured = bool(given_recipes) or bool(models) or model_given
    if spec is not None:
        base, args = runs.replay(subcommand, spec, args, configured)
    elif "-h" in args or "--help" in args:
        base = []
    elif subcommand != "fit":
        raise UsageError(f"{subcommand} needs --ckpt_path: a checkpoint file, a run folder, or "
                         f"best/last")
    else:
        base = default_recipe(given_recipes + models, args)
    return [subcommand, *base, *given_recipes, *args]


def seed(given: int | bool) -> int | bool:
    """The seed `--seed_everything` gives: a whole number from 0 to 2**32 - 1 as it is, true a
    random one (random_seed), false none; a UsageError for any other number."""
    if given is True:
        return random_seed()
    if given is not False and not 0 <= given < 2**32:
        raise UsageError(f"--seed_everything {given}: a seed is a whole number from 0 to "
                         f"{2**32 - 1}, or true for a random one")
    return given


def random_seed() -> int:
    """What `--seed_everything true` means: a random seed (Lightning 2.6's seed_everything(None)
    takes 0), the same in the processes Lightning starts for DDP, which inherit it as
    PL_GLOBAL_SEED."""
    inherited = os.environ.get("PL_GLOBAL_SEED")
    if rank_zero_only.rank and inherited:
        return int(inherited)
    return random.randint(1, 2**31 - 1)


def split_subcommand(argv: list[str]) -> tuple[str, list[str]]:
    if argv and argv[0] in SUBCOMMANDS:
        return argv[0], argv[1:]
    if argv and not argv[0].startswith("-"):
        raise UsageError(f"unknown subcommand '{argv[0]}'; choose one of: {', '.join(SUBCOMMANDS)}")
    return "fit", argv


def written_out(args: list[str]) -> tuple[list[str], list[str]]:
    """The `--config` of each recipe `--model NAME` names, and the other arguments with their short
    class names written out."""
    found, out, i = [], [], 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        if key == "--inputs":  # files, folders and globs, as a shell gives them: a list
            files = list(itertools.takewhile(is_value, args[i + 1:]))
            if eq:
                files = [value]
            out.append(f"--inputs={json.dumps(files)}")
            i += 1 + len(files) * (not eq)
            continue
        short = key == "--model" or key in SHORT_NAMES
        if not short or not (eq or i + 1 < len(args)):
            out.append(args[i])
            i += 1
            continue
        if not eq:
            value = args[i + 1]
        i += 2 - bool(eq)
        if key == "--model" and value in recipes():
            found += ["--config", str(RECIPES / f"{value}.yaml")]
        else:
            out.append(f"{key}={class_path(key, value)}")
    return found, out


def is_value(arg: str) -> bool:
    return not arg.startswith("-")


def class_path(key: str, value: str) -> str:
    """The import path a short name stands for; a class path, a class name or a dict as given."""
    names = SHORT_NAMES.get(key, {})
    if value in names:
        return f"{names[value].__module__}.{names[value].__qualname__}"
    looks_like_a_class = "." in value or value.lstrip().startswith("{")
    if key != "--model.net" and value[:1].isupper():  # jsonargparse finds a subclass by its name
        looks_like_a_class = True
    if looks_like_a_class:
        return value
    known = list(names) or recipes()  # --model NAME: the recipes
    option = key.removesuffix(".help")
    raise UsageError(f"unknown {option} '{value}'; choose one of: {', '.join(known)} "
                     f"(or a class path)")


def default_recipe(named: list, args: list[str]) -> list[str]:
    """The default recipe, beneath a command line that names no model of its own (`named`: the
    recipes it gives, and whether each `--config` names a model): nothing, a `--config` of a few
    trainer options, or a subclass of ImageClassifier (`--model my_losses.Focal`: the recipe's
    settings apply to it too). A LightningModule of the user's runs with its own defaults."""
    if any(named):
        return []
    model = runs.option(args, "--model")[0]
    if model is not None and not extends_ours(model):
        return []
    return ["--config", str(RECIPES / f"{DEFAULT_RECIPE}.yaml")]


def extends_ours(class_path: str) -> bool:
    """Whether a model's class path names ImageClassifier or a subclass of it; True where it does
    not import (jsonargparse then says why)."""
    with suppress(ImportError, AttributeError, ValueError, TypeError):
        return issubclass(import_class(class_path), ImageClassifier)
    return True


def configs(args: list[str]) -> list[str]:
    """The files `--config` (or `-c`) names."""
    found = [b for a, b in zip(args, args[1:]) if a in ("--config", "-c")]
    return found + [a.split("=", 1)[1] for a in args if a.startswith(("--config=", "-c="))]


def sets_model(config: str) -> bool:
    """Whether a `--config` file names a model (True where it cannot be read: jsonargparse then
    says why); a UsageError for one that is not text (jsonargparse's reader would end in a
    UnicodeDecodeError's traceback)."""
    try:
        text = Path(config).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--config {config}: not a YAML or JSON text file ({e.reason} at byte "
                         f"{e.start})") from None
    except OSError:
        return True
    with suppress(yaml.YAMLError, TypeError, AttributeError):
        return "model" in (yaml.safe_load(text) or {})
    return True


def classes_given(args: list[str]) -> dict[str, tuple[str, set[str]]]:
    """The parts of the model (`net`, `optimizer`, `scheduler`) that the written-out command line
    names as a class: the class, and the settings of it the command line also gives. A class
    named there starts from its own defaults (model_options.from_own_defaults)."""
    keys = [a.partition("=")[0] for a in args if a.startswith("--model.")]
    given = {}
    for part in ("net", "optimizer", "scheduler"):
        chosen = runs.option(args, f"--model.{part}")[0]
        if chosen is None or chosen.lstrip().startswith("{"):
            continue
        prefix = f"--model.{part}."
        given[part] = (chosen, {k.removeprefix(prefix) for k in keys if k.startswith(prefix)})
    return given
