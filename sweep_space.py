"""A sweep's search space, read and checked before any trial: a `--space` file of ranges and
choices, or `--grid KEY=V1,V2,...` options.

A range is {low, high[, log, step]}: an int of a range of ints (its low, high and step), else a
float. A list is a choice. Each is made into Optuna's own distribution here, so that what Optuna
refuses (low above high, a log range from 0, a step of 0) is refused before any trial, in one
line that names the option.
"""

import math
import warnings
from pathlib import Path

import jsonargparse
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from lit_cli.errors import UsageError

RANGE_KEYS = ("low", "high", "log", "step")
# The options the sweep gives every trial itself: in a space they would be replaced in silence.
SET_BY_THE_SWEEP = {
    "seed_everything": "--seeds N runs each setting with seeds S, S+1, ...",
    "trainer.default_root_dir": "each trial runs in its own folder of the sweep's",
}


def read_space(path: str) -> dict:
    """The ranges and lists of a `--space` file, checked, as train.py reads YAML: 1e-3 is a
    number there (YAML 1.2), where PyYAML's safe_load reads it as a string."""
    load = jsonargparse.get_loader("yaml")
    try:
        space = load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(f"--space {path}: cannot read it as YAML ({e})") from None
    if not isinstance(space, dict) or not space:
        message = "a mapping of train.py options to {low, high} ranges or lists of choices"
        raise UsageError(f"--space {path}: {message}")
    checked = {}
    for key, spec in space.items():
        if not isinstance(key, str):
            raise UsageError(f"--space {path}: {key!r} is not the name of an option")
        option = key.lstrip("-")
        if option in checked:
            raise UsageError(f"--space {path}: {option} is given twice")
        try:
            distribution(option, spec)
        except ValueError as e:
            raise UsageError(f"--space {path}: {option}: {e}") from None
        checked[option] = spec
    return checked


def grid_space(items: list[str]) -> dict:
    """The values of each `--grid KEY=V1,V2,...`, checked."""
    space = {}
    for item in items:
        key, _, values = item.partition("=")
        key = key.lstrip("-")
        if not key or not values:
            raise UsageError(f"--grid {item}: write KEY=V1,V2,...")
        if key in space:
            raise UsageError(f"--grid {key} is given twice: give each option's values in one")
        if "" in values.split(","):
            raise UsageError(f"--grid {item}: a value is empty")
        space[key] = [value(v) for v in values.split(",")]
        try:
            distribution(key, space[key])
        except ValueError as e:
            raise UsageError(f"--grid {key}: {e}") from None
    return space


def value(text: str):
    """A grid value as a number where it is one (YAML reads 1e-3 as a string), else as YAML reads
    it."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def distribution(key: str, spec):
    """Optuna's distribution of one option's range or list; a ValueError says what is wrong."""
    if key in SET_BY_THE_SWEEP:
        raise ValueError(f"the sweep sets it in every trial ({SET_BY_THE_SWEEP[key]})")
    if isinstance(spec, list):
        return choices(spec)
    if not isinstance(spec, dict):
        raise ValueError(f"{spec!r} is neither a range {{low, high}} nor a list of choices")
    check_range(spec)
    options = {"log": bool(spec.get("log"))}
    if "step" in spec:
        options["step"] = spec["step"]
    kind = FloatDistribution
    if all(isinstance(spec.get(k, 1), int) for k in ("low", "high", "step")):
        kind = IntDistribution
    with warnings.catch_warnings():
        # A range that its step does not divide: Optuna warns and cuts it; refused below.
        warnings.simplefilter("ignore")
        made = kind(spec["low"], spec["high"], **options)
    if made.high != spec["high"]:
        raise ValueError(f"high {spec['high']} is not low plus a multiple of step "
                         f"{spec['step']} (Optuna would sample up to {made.high})")
    return made


def check_range(spec: dict) -> None:
    """A range's keys, its ends and step finite numbers (a quoted '1e-3' is a string), its log
    true or false."""
    unknown = [k for k in spec if k not in RANGE_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (a range is {{low, high[, log, step]}})")
    if "low" not in spec or "high" not in spec:
        raise ValueError("a range needs low and high (and optionally log, step)")
    for k in ("low", "high", "step"):
        if k in spec and not is_number(spec[k]):
            raise ValueError(f"{k} must be a finite number, not {spec[k]!r}")
    if not isinstance(spec.get("log", False), bool):
        raise ValueError(f"log must be true or false, not {spec['log']!r}")


def is_number(x) -> bool:
    """An int or a finite float, not a bool (YAML's true is an int to Python)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return math.isfinite(x)


def choices(values: list) -> CategoricalDistribution:
    """Optuna's distribution of a list of choices: one at least, each once."""
    if not values:
        raise ValueError("an empty list: give one choice at least")
    for i, choice in enumerate(values):
        if choice in values[:i]:
            raise ValueError(f"{choice!r} is given twice")
    with warnings.catch_warnings():
        # Lists among the choices: Optuna's storages keep them (as JSON) and train.py reads them.
        warnings.simplefilter("ignore")
        return CategoricalDistribution(values)


def range_ends(key: str, spec) -> list:
    """A list's values, or a range's low and high as Optuna samples them: floats of a float range
    (a train.py option that takes ints refuses 64.0)."""
    made = distribution(key, spec)
    if isinstance(made, CategoricalDistribution):
        return list(made.choices)
    return [made.low, made.high]
