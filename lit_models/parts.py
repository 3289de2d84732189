"""The model's parts (network, optimizer, schedule) as data a checkpoint keeps, and as the callables
that data stands for: how a checkpoint rebuilds the same network, optimizer and schedule. And the
mixing of a training batch (mixup, cutmix)."""

import contextlib
import functools
import inspect
from typing import Callable, Union

import torch

from lit_models.checks import ModelError
from lit_models.networks import NETWORKS, import_class, network_class

# A network class, or a partial of one, that takes (image_shape, num_classes) and builds the
# network: what LightningCLI makes of `--model.net CLASS --model.net.ARG VALUE`, as it makes
# optimizers of `--model.optimizer` (the first arguments are the call's, not options). Or one
# that takes `num_classes` alone, as torchvision's builders and most nn.Module classes do.
NetworkCallable = Union[Callable[[tuple[int, int, int], int], torch.nn.Module],
                        Callable[[int], torch.nn.Module]]


def as_spec(part):
    """A part of the model (network, optimizer, schedule) as a checkpoint keeps it: `{class_path,
    init_args}`, plain data that loads with torch's weights_only=True. A name, a class or a
    `functools.partial` of a class or of a module's function (torchvision's model builders);
    anything else (LightningCLI's own partials, whose configuration LightningCLI records itself) as
    it is."""
    if isinstance(part, str):
        part = network_class(part)
    if importable(part):
        part = functools.partial(part)
    if isinstance(part, functools.partial) and importable(part.func) and not part.args:
        function = part.func
        return {"class_path": f"{function.__module__}.{function.__qualname__}",
                "init_args": dict(part.keywords)}
    return part


def importable(part) -> bool:
    """Whether `part` is a class or a function that its import path names again."""
    named = isinstance(part, type) or inspect.isfunction(part)
    return named and "<locals>" not in part.__qualname__


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
        class_path = spec  # as given: an import path, or {class_path, init_args}
        if isinstance(spec, dict):
            class_path = spec.get("class_path", "")
        return str(class_path or "").rpartition(".")[2] or "network"
    names = {cls: name for name, cls in NETWORKS.items()}
    return names.get(type(net), type(net).__name__)


def build_network(factory: NetworkCallable, spec, image_shape,
                  num_classes: int) -> torch.nn.Module:
    """The network `factory` (of the spec `spec`) builds for `image_shape` images of `num_classes`
    classes; a ModelError if it cannot."""
    shape = tuple(image_shape)
    name = network_name(None, spec)
    try:
        args, kwargs = arguments(named(factory, spec), shape, num_classes)
        net = factory(*args, **kwargs)
    except (ValueError, TypeError) as e:
        # What a network says about the shape or arguments it was given.
        raise ModelError(f"the network {name} cannot be built for {shape} images of "
                         f"{num_classes} classes: {e}") from None
    if not isinstance(net, torch.nn.Module):
        raise ModelError(f"--model.net built a {type(net).__name__}, not an nn.Module")
    try_on(net, name, shape, num_classes)
    return net


def named(factory, spec):
    """The class or function a network's callable builds with: the one its spec names (LightningCLI
    records `{class_path, init_args}`), else the one a partial wraps (jsonargparse's, outside
    LightningCLI's run, `load_from_checkpoint`: the last of its arguments), else the callable."""
    for part in (spec, factory):
        if isinstance(part, dict):
            part = part.get("class_path")
        if isinstance(part, str):
            try:
                return import_class(part)
            except (ImportError, AttributeError, ValueError):
                continue
        if isinstance(part, functools.partial):
            return [f for f in (part.func, *part.args) if callable(f)][-1]
    return factory


def arguments(factory, shape: tuple[int, int, int], num_classes: int) -> tuple[tuple, dict]:
    """What a network callable is called with: `(image_shape, num_classes)`, as this project's
    networks take them; `num_classes=` alone where it takes no image shape, as torchvision's
    builders (whose `weights` default is None: nothing is downloaded) and most nn.Module classes."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature: the project's convention
        return (shape, num_classes), {}
    keywords = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    if "image_shape" in parameters or not ("num_classes" in parameters or keywords):
        return (shape, num_classes), {}
    return (), {"num_classes": num_classes}


def try_on(net: torch.nn.Module, name: str, shape: tuple[int, int, int], num_classes: int) -> None:
    """A ModelError, before anything trains, for a network that cannot take images of `shape`
    (two black ones, in eval mode) or does not give one output per class."""
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            outputs = net(torch.zeros(2, *shape))
    except (RuntimeError, AssertionError, ValueError, IndexError) as e:  # its first line says why
        reason = str(e).strip().splitlines()[0]
        raise ModelError(f"the network {name} cannot take {shape} images: {reason}") from None
    finally:
        net.train(was_training)
    given = tuple(getattr(outputs, "shape", ()))
    if given != (2, num_classes):
        raise ModelError(f"the network {name} gives outputs of shape {given} for a batch of 2, "
                         f"not (2, {num_classes}): one logit per class")


def build_optimizer(factory, params: list) -> torch.optim.Optimizer:
    """The optimizer `factory` builds for `params`."""
    try:
        return factory(params)
    except ValueError as e:
        # torch's own check of its arguments (a negative lr, betas out of range).
        raise ModelError(f"--model.optimizer: {e}") from None


def learning_rate(factory) -> float | None:
    """The learning rate an optimizer callable gives: its `lr` argument, or its class's default."""
    if "lr" in getattr(factory, "keywords", {}):
        return factory.keywords["lr"]
    with contextlib.suppress(TypeError, ValueError, KeyError):  # no signature, or no lr
        return inspect.signature(named(factory, None)).parameters["lr"].default
    return None


def with_learning_rate(part, lr: float):
    """An optimizer part (a callable, or its `{class_path, init_args}` spec) with learning rate
    `lr`."""
    if isinstance(part, dict):
        return {**part, "init_args": {**(part.get("init_args") or {}), "lr": lr}}
    return functools.partial(part, lr=lr)


def plans_over_run(schedule) -> bool:
    """Whether the schedule `schedule` builds is planned over the run's steps (it takes
    `total_steps`: OneCycle)."""
    # A schedule class, or a partial of one (what LightningCLI makes of --model.scheduler, its
    # arguments bound).
    takes_steps = schedule is not None and "total_steps" in inspect.signature(schedule).parameters
    return takes_steps or "total_steps" in getattr(schedule, "keywords", {})



def mixed(images: torch.Tensor, labels: torch.Tensor, mixup: float, cutmix: float,
          num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's MixUp or CutMix (one of those whose alpha is above 0, at random) of a batch, as
    floats on the 0..255 scale, and its labels as class probabilities; drawn from `seed`."""
    from torchvision.transforms import v2

    alphas = ((mixup, v2.MixUp), (cutmix, v2.CutMix))
    mixes = [transform(alpha=alpha, num_classes=num_classes)
             for alpha, transform in alphas if alpha > 0]
    # torchvision draws from the CPU's generator: no device sync.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return v2.RandomChoice(mixes)(images.float(), labels)
