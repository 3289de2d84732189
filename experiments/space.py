"""What a sweep varies: a search space over train.py's options (a YAML file) or a grid (`--grid`), and how
many seeds every setting runs with.

A space file maps train.py options to what they may be:

    model.optimizer.lr: {low: 0.001, high: 0.1, log: true}   # a float range, sampled on a log scale
    trainer.max_epochs: {low: 2, high: 8, step: 2}            # an int range (low and high are integers)
    data.batch_size: [256, 512, 1024]                         # a list of values to choose from

A grid names values: `--grid "model.optimizer.lr=0.01,0.03,0.1"`, one `--grid` per option (or several in one,
separated by spaces), and runs every combination. Keys are train.py's own option names, with or without
their dashes (`model.optimizer.lr`, `--model.init_args.optimizer.init_args.lr`). Nothing here knows which
options train.py has: the sweep asks train.py's parser (experiments/worker.py).
"""

import itertools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

KEY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
RANGE_FIELDS = {"low", "high", "log", "step"}


class SpaceError(ValueError):
    """A space file or grid that cannot be swept; the message says where and why."""


@dataclass(frozen=True)
class Param:
    """One option a sweep varies: a float or int range, or a list of choices."""

    key: str  # train.py's option without its dashes, e.g. model.optimizer.lr
    kind: str  # "float", "int" or "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "float":
            return FloatDistribution(self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)
        return CategoricalDistribution(self.choices)

    def extremes(self) -> list:
        """The values that bound what a trial can get: train.py must accept each of them."""
        return [self.low, self.high] if self.kind != "choice" else list(self.choices)

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.key} in {{{', '.join(value_text(c) for c in self.choices)}}}"
        scale = ", log" if self.log else (f", step {self.step}" if self.step else "")
        return f"{self.key} in [{self.low}, {self.high}]{scale}"


@dataclass(frozen=True)
class Plan:
    """The settings a sweep tries, each with `seeds` seeds.

    grid: every combination of the params' choices is a setting, each run once per seed. Otherwise Optuna's
    sampler chooses the settings (`--trials` of them) from the params' ranges.
    """

    params: tuple[Param, ...]
    grid: bool
    seeds: int = 1

    def points(self) -> list[dict]:
        """The grid's settings, in order (one empty setting for a plan without params: seeds only)."""
        keys = [p.key for p in self.params]
        return [dict(zip(keys, values)) for values in itertools.product(*(p.choices for p in self.params))]

    def canonical(self) -> str:
        """What makes two sweeps the same study: the params, grid or not, and the number of seeds."""
        return json.dumps({"grid": self.grid, "seeds": self.seeds, "params": [asdict(p) for p in self.params]},
                          sort_keys=True)

    def describe(self) -> str:
        what = "; ".join(p.describe() for p in self.params) or "no options varied"
        return f"{'grid' if self.grid else 'space'}: {what}; {self.seeds} seed{'s' if self.seeds > 1 else ''}"


def value_text(value) -> str:
    """A value as train.py's command line takes it: strings as they are, anything else as JSON (which is YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def override(key: str, value) -> str:
    return f"--{key}={value_text(value)}"


def parse_key(raw: str, where: str) -> str:
    key = str(raw).strip().removeprefix("--")
    if not KEY.fullmatch(key):
        raise SpaceError(f"{where}: '{raw}' is not an option name (write it as train.py takes it, "
                         f"e.g. model.optimizer.lr)")
    return key


def choice_value(value):
    """Optuna's choices are None, bool, int, float or str: a list or mapping is kept as its JSON text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)


def load_space(path: Path) -> tuple[Param, ...]:
    """The params of a space file; a SpaceError for a missing, malformed or empty file or entry."""
    if not path.is_file():
        raise SpaceError(f"space file {path} does not exist")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SpaceError(f"space file {path} is not a text file (a YAML mapping was expected)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpaceError(f"space file {path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(content, dict) or not content:
        what = "empty" if not content else f"a YAML {type(content).__name__}"
        raise SpaceError(f"space file {path} is {what}; it should map train.py options to ranges "
                         f"({{low, high}}) or lists of values")
    return tuple(space_param(parse_key(key, f"space file {path}"), spec, f"space file {path}: {key}")
                 for key, spec in content.items())


def space_param(key: str, spec, where: str) -> Param:
    if isinstance(spec, list):
        if not spec:
            raise SpaceError(f"{where}: an empty list of values")
        return Param(key, "choice", choices=tuple(choice_value(v) for v in spec))
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: {spec!r} is neither a range ({{low, high[, log, step]}}) nor a list of values "
                         f"(a fixed value belongs on the command line)")
    unknown = set(spec) - RANGE_FIELDS
    if unknown or not {"low", "high"} <= set(spec):
        problem = f"unknown field {', '.join(map(str, sorted(unknown, key=str)))}" if unknown else "needs low and high"
        raise SpaceError(f"{where}: a range {problem} (fields: low, high, log, step)")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    for name, value in (("low", low), ("high", high), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SpaceError(f"{where}: {name} {value!r} is not a number")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: log {log!r} is not true or false")
    if not low < high:
        raise SpaceError(f"{where}: an empty range (low {low} is not below high {high})")
    if log and (low <= 0 or step is not None):
        raise SpaceError(f"{where}: a log range needs low > 0 and no step")
    if step is not None and step <= 0:
        raise SpaceError(f"{where}: step {step} is not positive")
    kind = "int" if all(isinstance(v, int) for v in (low, high, step or 1)) else "float"
    cast = int if kind == "int" else float
    return Param(key, kind, cast(low), cast(high), log, cast(step) if step is not None else None)


def split_values(text: str) -> list[str]:
    """Comma-separated values, where commas inside brackets or quotes belong to the value (`[0.5],[0.2]`)."""
    values, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(current.strip())
            current = ""
            continue
        current += ch
    values.append(current.strip())
    return values


def grid_value(text: str):
    """A grid value as YAML reads it, and `1e-3` as a number (YAML 1.1 reads it as a string)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return choice_value(value)


def parse_grid(specs: list[str]) -> tuple[Param, ...]:
    """`--grid` arguments (`KEY=V1,V2 KEY2=V3,V4`) as choice params; a SpaceError for a malformed one."""
    params = []
    for spec in specs:
        for item in spec.split():
            key, eq, values = item.partition("=")
            where = f"--grid {item}"
            if not eq:
                raise SpaceError(f"{where}: write KEY=VALUE1,VALUE2,... (e.g. model.optimizer.lr=0.01,0.03)")
            key = parse_key(key, where)
            texts = split_values(values)
            if not values.strip() or any(not t for t in texts):
                raise SpaceError(f"{where}: an empty value")
            if key in (p.key for p in params):
                raise SpaceError(f"{where}: {key} is in the grid twice")
            params.append(Param(key, "choice", choices=tuple(grid_value(t) for t in texts)))
    return tuple(params)


def short_names(keys: list[str]) -> dict[str, str]:
    """The shortest trailing part of each key that tells it from the others (model.optimizer.lr -> lr)."""
    parts = {key: [p for p in key.split(".") if p != "init_args"] for key in keys}
    names = {}
    for key in keys:
        for n in range(1, len(parts[key]) + 1):
            name = ".".join(parts[key][-n:])
            if not any(".".join(parts[k][-n:]) == name for k in keys if k != key):
                break
        names[key] = name
    return names
