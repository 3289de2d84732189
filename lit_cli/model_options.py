"""Two rules that make the model's options mean what they say, applied to the parsed configuration
before anything is built."""

import sys

from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_only

from lit_cli.defaults import class_defaults
from lit_cli.errors import UsageError


def one_learning_rate(model: Namespace) -> None:
    """The learning rate is `--model.lr` (OneCycle's peak, what the learning-rate finder sets):
    an optimizer's own lr beside it is refused, unless `--model.lr` is null."""
    optimizer = model.get("optimizer")
    if not isinstance(optimizer, Namespace) or "class_path" not in optimizer:
        return
    given = (optimizer.get("init_args") or Namespace()).get("lr")
    default = class_defaults(optimizer.class_path).get("lr")
    if model.get("lr") is None:
        return
    if given != default:
        raise UsageError(f"--model.optimizer.lr {given}: the learning rate is --model.lr (the peak "
                         f"of OneCycle, what the learning-rate finder sets): give --model.lr "
                         f"{given}, or --model.lr null to use the optimizer's")
    # Not in config.yaml or the checkpoint: one learning rate in every record.
    optimizer.init_args.pop("lr", None)


# LightningCLI's `--optimizer` and `--lr_scheduler`, and the model's own options for them.
MODEL_OPTIONS = {"optimizer": "optimizer", "lr_scheduler": "scheduler"}


def lightnings_flags_as_the_models(config: Namespace) -> None:
    """LightningCLI's `--optimizer` and `--lr_scheduler` as the model's own `optimizer` and
    `scheduler` where it takes them (ImageClassifier): one way to say each, which the model's
    `lr` and schedule plan apply to. A model without them gets LightningCLI's (its
    configure_optimizers replaced, as LightningCLI documents)."""
    init = config.model.get("init_args")
    for flag, option in MODEL_OPTIONS.items():
        given = config.get(flag)
        if given is None or not isinstance(init, Namespace) or option not in init:
            continue
        init[option] = given
        config[flag] = None


def from_own_defaults(model: Namespace, given: dict[str, tuple[str, set[str]]]) -> None:
    """A class the command line gives for a part of the model (`--model.net`, `--model.optimizer`,
    `--model.scheduler`) starts from its own defaults, not from settings that the configuration
    before it gave another class (jsonargparse keeps those the new class also takes: its
    issue #460); one line says which were reset."""
    for part, (chosen, keys) in given.items():
        spec = model.get(part)
        if not isinstance(spec, Namespace) or not isinstance(spec.get("init_args"), Namespace):
            continue
        init, defaults = spec.init_args, class_defaults(spec.class_path)
        reset = sorted(key for key in init.keys()
                       if key in defaults and init[key] != defaults[key] and key not in keys)
        for key in reset:
            init[key] = defaults[key]
        if reset:
            rank_zero_only(print)(f"--model.{part} {chosen} starts from its own defaults: "
                                  f"{', '.join(reset)} of the configuration before it are reset "
                                  f"(--model.{part}.{reset[0]} ... sets one)", file=sys.stderr)
