"""The command line before LightningCLI sees it: the subcommand, the short names, and config files checked.

`--model NAME` is the recipe `configs/NAME.yaml` (placed first, so that everything after it overrides it);
`--data NAME` is a data module's short name (datamodules/registry.py). Full class paths work for both.
"""

from pathlib import Path

import yaml

from datamodules import registry

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
RECIPES = {"cnn": CONFIGS / "cnn.yaml", "mlp": CONFIGS / "mlp.yaml"}
MODEL_CLASS = "lit_models.ImageClassifier"
STAGES = ("fit", "validate", "test", "predict", "export")

# jsonargparse would print every one of LightningCLI's ~150 options above each error.
USAGE = ("train.py [fit|validate|test|predict|export] [--model cnn|mlp] [--data NAME] [--config FILE] "
         "[--ckpt_path CKPT] [options]  (--help: the options)")


class UsageError(Exception):
    """A command line that cannot run; reported like an argparse error (exit code 2)."""


def split_stage(argv: list[str]) -> tuple[str, list[str]]:
    """The subcommand (default: fit, which also tests the best checkpoint) and the arguments after it."""
    if argv and argv[0] in STAGES:
        return argv[0], argv[1:]
    if argv and not argv[0].startswith("-") and argv[0] not in ("help",):
        raise UsageError(f"unknown subcommand '{argv[0]}'; choose one of: {', '.join(STAGES)}")
    return "fit", argv


def expand_short_names(argv: list[str], default_recipe: bool = True) -> list[str]:
    """Turn `--model NAME` into the recipe's `--config` (placed first) and `--data NAME` into a class path.

    The same for `--model.help NAME` and `--data.help NAME`. Without a recipe or config, the CNN's.
    """
    presets, rest, i = [], [], 0
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if key not in ("--model", "--data", "--model.help", "--data.help") or (not eq and i + 1 >= len(argv)):
            rest.append(argv[i])
            i += 1
            continue
        if not eq:
            value = argv[i + 1]
        i += 1 if eq else 2
        group, is_help = key[2:].split(".")[0], key.endswith(".help")
        if group == "model" and value in RECIPES:
            if is_help:
                rest.append(f"{key}={MODEL_CLASS}")
            else:
                presets += ["--config", str(RECIPES[value])]
        elif group == "data" and registry.class_path(value):
            rest.append(f"{key}={registry.class_path(value)}")
        elif "." in value or value in ("ImageClassifier", *(p.rsplit(".", 1)[1] for p in registry.DATA.values())) \
                or value.lstrip().startswith("{"):
            rest.append(f"{key}={value}")  # a class path, class name or inline dict: jsonargparse's job
        else:
            names = RECIPES if group == "model" else registry.DATA
            raise UsageError(f"unknown --{group} '{value}'; choose one of: {', '.join(names)} "
                             f"(or a full class path)")
    for path in config_files(argv):
        check_config_file(Path(path))
    if default_recipe and not presets and not config_files(argv):
        presets = ["--config", str(RECIPES["cnn"])]  # the default recipe
    return presets + rest


def config_files(argv: list[str]) -> list[str]:
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return files + [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def check_config_file(path: Path) -> None:
    """A missing, unreadable or malformed --config file, named, before jsonargparse reports it without the name."""
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not a text file (a YAML config was expected)") from None
    except OSError as e:
        raise UsageError(f"config file {path} cannot be read ({e.strerror})") from None
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UsageError(f"config file {path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(content, dict):
        what = "empty" if content is None else f"a YAML {type(content).__name__}, not a mapping of options"
        raise UsageError(f"config file {path} is {what}; write options as in `python train.py --print_config`")


def option_value(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one given), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def without_option(argv: list[str], name: str) -> list[str]:
    """argv without `--name VALUE` / `--name=VALUE`."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out
