"""The model's parts (network, optimizer, schedule) as data a checkpoint keeps, and as the callables
that data stands for: how a checkpoint rebuilds the same network, optimizer and schedule."""

import functools
import inspect
from typing import Callable

import torch

from lit_models.checks import ModelError
from lit_models.networks import NETWORKS, import_class, network_class

# A network class, or a partial of one, that takes (image_shape, num_classes) and builds the
# network: what LightningCLI makes of `--model.net CLASS --model.net.ARG VALUE`, as it makes
# optimizers of `--model.optimizer`.
NetworkCallable = Callable[[tuple[int, int, int], int], torch.nn.Module]


def as_spec(part):
    """A part of the model (network, optimizer, schedule) as a checkpoint keeps it: `{class_path,
    init_args}`, plain data that loads with torch's weights_only=True. A name, a class or a
    `functools.partial` of a class; anything else (LightningCLI's own partials, whose configuration
    LightningCLI records itself) as it is."""
    if isinstance(part, str):
        try:
            part = network_class(part)
        except ValueError as e:
            raise ModelError(str(e)) from None
    if isinstance(part, type):
        part = functools.partial(part)
    class_partial = isinstance(part, functools.partial) and isinstance(part.func, type)
    if class_partial and not part.args:
        cls = part.func
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}",
                "init_args": dict(part.keywords)}
    return part


def as_factory(part):
    """The callable a spec of `as_spec` stands for (a partial of its class); a callable as it is."""
    if isinstance(part, dict) and "class_path" in part:
        try:
            cls = import_class(part["class_path"])
        except (ImportError, AttributeError, ValueError):
            raise ModelError(f"{part['class_path']} cannot be imported") from None
        return functools.partial(cls, **(part.get("init_args") or {}))
    if isinstance(part, str):
        return as_factory(as_spec(part))
    return part


def network_name(net, spec) -> str:
    """The short name (NETWORKS) of the network `net`, or its class name; before it is built, the
    name of the class its spec `spec` (`{class_path, init_args}`) names."""
    if net is None:
        class_path = str((spec or {}).get("class_path", ""))
        return class_path.rpartition(".")[2] or "network"
    names = {cls: name for name, cls in NETWORKS.items()}
    return names.get(type(net), type(net).__name__)


def build_network(factory: NetworkCallable, spec, image_shape,
                  num_classes: int) -> torch.nn.Module:
    """The network `factory` (of the spec `spec`) builds for `image_shape` images of `num_classes`
    classes; a ModelError if it cannot."""
    shape = tuple(image_shape)
    try:
        net = factory(shape, num_classes)
    except (ValueError, TypeError) as e:
        # What a network says about the shape or arguments it was given.
        name = network_name(None, spec)
        raise ModelError(f"the network {name} cannot be built for {shape} images of "
                         f"{num_classes} classes: {e}") from None
    if not isinstance(net, torch.nn.Module):
        raise ModelError(f"--model.net built a {type(net).__name__}, not an nn.Module")
    return net


def build_optimizer(factory, params: list, lr) -> torch.optim.Optimizer:
    """The optimizer `factory` builds for `params`, with the learning rate `lr` (None: the
    optimizer's own)."""
    settings = {}
    if lr is not None:
        settings["lr"] = lr
    try:
        return factory(params, **settings)
    except ValueError as e:
        # torch's own check of its arguments (a negative lr, betas out of range).
        raise ModelError(f"--model.optimizer: {e}") from None


def plans_over_run(schedule) -> bool:
    """Whether the schedule `schedule` builds is planned over the run's steps (it takes
    `total_steps`: OneCycle)."""
    if schedule is None:
        return False
    # A schedule class, or a partial of one (what LightningCLI makes of --model.scheduler, its
    # arguments bound).
    takes_steps = "total_steps" in inspect.signature(schedule).parameters
    return takes_steps or "total_steps" in getattr(schedule, "keywords", {})

