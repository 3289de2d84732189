"""Train, test and use image classifiers with LightningCLI (README.md has the whole path).

    python train.py --model cnn                       # fit (the default subcommand), then test
    python train.py test --ckpt_path best             # the newest run's best checkpoint
    python train.py predict --ckpt_path best --inputs my_images/
    python train.py export --ckpt_path best --format onnx

Every option is LightningCLI's: `--trainer.*`, `--model.*`, `--data.*`, `--config FILE`,
`--seed_everything`. lit_cli/command_line.py writes out the few short forms (`--model NAME` is
the recipe configs/NAME.yaml). A fit writes lightning_logs/version_N/: TensorBoard events,
checkpoints/, config.yaml (`--config` of it runs it again) and results.json.
"""

# ruff: noqa: E402 (a stop while Python imports torch and Lightning: its handler comes first)
import sys

from lit_common.process import exit_with, stop_while_starting

if __name__ == "__main__":
    stop_while_starting()

import time
from pathlib import Path
from typing import NoReturn

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_cli import command_line, defaults, errors, model_options, record, runs, signals
from lit_cli.errors import UsageError
from lit_cli.trainer import Trainer, check_command
from lit_common import noise
from lit_models import ImageClassifier


class TrainCLI(LightningCLI):
    """LightningCLI for any LightningModule (ImageClassifier's recipes by default) and
    LightningDataModule, with its subcommands and `export`, and the project's defaults: 30 epochs,
    the default callbacks (lit_cli/defaults.py), bf16 mixed precision on GPUs that have it. A fit
    ends with a test, where the model has one, and a record (results.json) whatever it does.

    Args:
        args: the command line (default: sys.argv[1:]), short forms and all.
        callbacks: callbacks of the caller's, added to the Trainer's (sweep.py's pruner).
        run: run the subcommand (LightningCLI's `run`); false builds the trainer, model and data
            module of a fit's command line, and stops there.
    """

    def __init__(self, args: list[str] | None = None, callbacks: list | None = None,
                 run: bool = True):
        self.stops, self.fitted, self.best, self.results = signals.Stops(), False, None, {}
        self.runs_subcommand, self.claim = run, None
        # At each run, not once at import: a caller's warnings.catch_warnings (a test's, a
        # notebook's) drops on leaving it the filters that were set inside it.
        noise.silence()
        try:
            self.stops.start()
            args = command_line.expand(list(sys.argv[1:] if args is None else args))
            self.command = args[0]
            # jsonargparse's errors raised, not printed with a usage: main() says them.
            usage = {"usage": command_line.usage(), "description": command_line.DESCRIPTION,
                     "exit_on_error": False}
            super().__init__(
                L.LightningModule, subclass_mode_model=True, subclass_mode_data=True,
                trainer_class=Trainer, save_config_callback=runs.SaveConfig, args=args, run=run,
                trainer_defaults={"max_epochs": 30,
                                  "callbacks": [*(callbacks or []), signals.HeldStop(self.stops)]},
                seed_everything_default=0, save_config_kwargs={"save_to_log_dir": False},
                parser_kwargs={**usage, **{command: usage for command in self.subcommands()}})
        except BaseException as e:
            if self.claim is not None:  # of a command that wrote no checkpoint
                self.claim.give_back()
            stop = signals.as_stop(self, self.stops, e)
            if stop is None:
                raise
            raise stop from None
        finally:
            self.stops.stop()

    def subcommands(self) -> dict[str, set[str]]:
        """The subcommand this command line runs, of LightningCLI's and `export`: a parser for
        each of the others would be built and never used (docs/design.md)."""
        return {self.command: command_line.SUBCOMMANDS[self.command]}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.callbacks": defaults.DEFAULT_CALLBACKS})

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """The command line, its short forms written out (command_line.expand), with the
        model's option rules (model_options) applied."""
        if not self.runs_subcommand:  # a parser without subcommands: a fit's options alone
            args = args[1:]
        self.config = parser.parse_args(args)
        # The subcommand's options (all of them without subcommands).
        self.given = self.config.get(self.config.get("subcommand") or "fit") or self.config
        self.given.seed_everything = command_line.seed(self.given.seed_everything)
        model_options.lightnings_flags_as_the_models(self.given)
        model = self.given.model.get("init_args") or Namespace()
        model_options.from_own_defaults(model, command_line.classes_given(args))
        model_options.one_learning_rate(model)

    def _parse_ckpt_path(self) -> None:
        """Nothing: command_line.expand has put the checkpoint's model beneath the command line.
        Lightning's puts it over the command line, replacing options the user gave
        (Lightning-AI/pytorch-lightning#21455; docs/design.md)."""

    def before_instantiate_classes(self) -> None:
        trainer = self.given.trainer
        trainer.callbacks = defaults.without_those_that_step_aside(trainer, self.given.model)
        defaults.on_gpus(trainer)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as e:  # a class that cannot be built from its arguments
            if errors.explain(e)[0] is not None:
                raise
            raise UsageError(f"the command line does not build: {e}") from e

    def after_instantiate_classes(self) -> None:
        ours = isinstance(self.model, ImageClassifier)
        # The network now, sized from the data, not when fitting starts: callbacks such as
        # StochasticWeightAveraging copy the model before its configure_model runs.
        if ours and self.datamodule is not None:
            self.model.take_from_data(self.datamodule, statistics=False)
        check_command(self)
        defaults.on_the_trainer(self.trainer, self.given.trainer.logger)
        self.checkpoint = None
        if self.given.get("ckpt_path"):  # edited by hand: refused before anything starts
            self.checkpoint = runs.read_checkpoint(Path(self.given.ckpt_path))
            if ours:
                self.model.check_weights(self.checkpoint["state_dict"])

    def before_fit(self) -> None:
        if self.checkpoint is not None:
            runs.stop_if_finished(self.given.ckpt_path, self.checkpoint, self.trainer.max_epochs)
        self.claim = runs.claim(self.trainer.logger)
        self.fit_started = time.perf_counter()
        self.stops.hold()

    def after_fit(self) -> None:
        """Test the best checkpoint (the last weights without one); the record of the fit in
        results.json, whatever its test does."""
        self.stops.release()
        self.fitted = True
        trainer = self.trainer
        fit = record.of_the_fit(trainer, time.perf_counter() - self.fit_started)
        signals.raise_if_asked(trainer)  # after the last step, where the test would forget it
        monitored = sorted(trainer.checkpoint_callbacks, key=lambda c: not c.monitor)
        self.best = next((c.best_model_path for c in monitored), "") or None
        try:
            tested = record.test_after_fit(self)
        except BaseException as e:
            tested = {"test": record.failure(e)}
            raise
        finally:
            self.results = record.record(self, "fit", tested, self.best, fit)

    def before_test(self) -> None:
        self.claim = runs.claim(self.trainer.logger)
        self.stops.hold()

    def after_test(self) -> None:
        self.stops.release()
        metrics = record.metrics(self.trainer, self.model, self.subcommand)
        self.results = record.record(self, self.subcommand, metrics, self.given.ckpt_path, {})

    before_validate, after_validate = before_test, after_test


def main(argv: list[str] | None = None) -> int:
    """`python train.py ARGS`: one command line; its exit code, and one line for what went wrong
    (`--verbose` adds the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        TrainCLI([a for a in argv if a != "--verbose"])
    except (SystemExit, Exception) as e:
        return errors.exit_code(e, verbose="--verbose" in argv)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # gloo's threads would abort the exit
    return 0


def command() -> NoReturn:
    """`lit-train ARGS`, the installed command, as `python train.py ARGS`: main(), then the
    process's end (lit_common.process.exit_with)."""
    exit_with(main())


if __name__ == "__main__":
    command()
