"""Train, test and use image classifiers with LightningCLI (README.md has the whole path).

    python train.py --model cnn                       # fit (the default subcommand), then test
    python train.py test --ckpt_path best             # the newest run's best checkpoint
    python train.py predict --ckpt_path best --inputs my_images/
    python train.py export --ckpt_path best --format onnx

Every option is LightningCLI's: `--trainer.*`, `--model.*`, `--data.*`, `--optimizer`,
`--lr_scheduler`, `--config FILE`, `--seed_everything`. lit_cli/command_line.py has the three
rules train.py adds (`--model NAME` is the recipe configs/NAME.yaml). A fit writes
lightning_logs/version_N/: TensorBoard events, checkpoints/, config.yaml (`--config` of it runs it
again) and results.json.
"""

import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden

from lit_cli import command_line, defaults, errors, runs
from lit_cli.errors import Stopped, UsageError
from lit_cli.trainer import Trainer
from lit_models import ImageClassifier, LastCheckpoint, RunRecord
from lit_models.callbacks import run_folder

DESCRIPTION = (f"Image classifiers with LightningCLI (README.md). --model {command_line.RECIPE} "
               "(configs/), or a class; --data CIFAR10DataModule, MNISTDataModule, "
               "FashionMNISTDataModule, ImageFolderDataModule, or yours")
# What Lightning and torch print that a user of train.py can do nothing about, and why.
QUIET = [
    # torch deprecates a use inside Lightning's own code (lightning/pytorch/utilities/_pytree.py).
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # The use commands load a checkpoint's weights alone into the callbacks they run.
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
    # The prediction writer (lit_models/predict.py) names its rows itself.
    r"Couldn't infer the batch indices fetched from your dataloader",
    # A resumed run goes on in its own folder, beside its own checkpoints.
    r"Checkpoint directory .* exists and is not empty",
    # `--data.val_size 0` asks for no validation: the data modules' val_dataloader is then [].
    r"Total length of `list` across ranks is zero",
    # A use command's checkpoint callbacks are not the fit's (they save nothing).
    r"The dirpath has changed from",
    # ImageClassifier logs its training metrics at each epoch's end too: no short epoch loses one.
    r"The number of training batches \(\d+\) is smaller than the logging interval",
]


class TrainCLI(LightningCLI):
    """LightningCLI for any LightningModule (ImageClassifier's recipes by default) and
    LightningDataModule, with its subcommands and `export`, and the project's defaults: 30 epochs,
    the default callbacks (lit_cli/defaults.py), bf16 mixed precision on GPUs that have it. A fit
    ends with a test, where the model has one; every stage that starts writes its record
    (RunRecord: results.json), and `record` is the last one.

    Args:
        args: the command line (default: sys.argv[1:]), written out by lit_cli/command_line.py.
        callbacks: callbacks of the caller's, added to the Trainer's (sweep.py's pruner).
        run: run the subcommand (LightningCLI's `run`); false builds the trainer, model and data
            module of a fit's command line, and stops there.
    """

    def __init__(self, args: list[str] | None = None, callbacks: tuple = (), run: bool = True):
        for message in QUIET:  # at each run: a caller's catch_warnings drops filters set in it
            warnings.filterwarnings("ignore", message=message)  # replaces the same filter
        self.record = None
        kwargs = {"exit_on_error": False, "description": DESCRIPTION}  # errors in one line
        try:
            self.args = command_line.expand(list(sys.argv[1:] if args is None else args))
            super().__init__(
                L.LightningModule, None, subclass_mode_model=True,  # None: --data optional
                subclass_mode_data=True, trainer_class=Trainer,
                save_config_callback=runs.SaveConfig, save_config_kwargs={"save_to_log_dir": False},
                trainer_defaults={"max_epochs": 30, "callbacks": [*callbacks, RunRecord()]},
                seed_everything_default=0, args=self.args if run else self.args[1:], run=run,
                parser_kwargs={**kwargs, **{name: kwargs for name in command_line.SUBCOMMANDS}})
        except (SystemExit, KeyboardInterrupt) as e:
            stop = self.stopped(e)
            if stop is None:
                raise
            raise stop from None

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return command_line.SUBCOMMANDS

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.callbacks": defaults.CALLBACKS})

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """The command line parsed, then command_line.py's rules on the configuration, which
        `--print_config` prints."""
        printed = [a for a in args if a.startswith("--print_config")]
        self.config = parser.parse_args([a for a in args if a not in printed])
        subcommand = self.config.get("subcommand")
        self.given = self.config.get(subcommand) if subcommand else self.config
        command_line.from_own_defaults(self.given, self.args)
        command_line.lightnings_flags_as_the_models(self.given)
        seed = self.given.get("seed_everything")
        if type(seed) is int and not 0 <= seed < 2**32:  # Lightning's refusal: a traceback
            raise UsageError(f"--seed_everything {seed}: a seed from 0 to {2**32 - 1}, or true")
        if printed:
            print(self._parser(subcommand).dump(self.given, skip_unset="skip_null" in printed[0]))
            raise SystemExit(0)

    def _parse_ckpt_path(self) -> None:
        """Nothing: command_line.expand has put the checkpoint's model beneath the command line;
        Lightning's puts it over the command line, replacing options the user gave
        (Lightning-AI/pytorch-lightning#21455; docs/design.md)."""

    def before_instantiate_classes(self) -> None:
        trainer = self.given.trainer
        trainer.callbacks = defaults.step_aside(trainer, self.given.model)
        defaults.on_gpus(trainer)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as e:  # a class that cannot be built from its arguments
            if errors.explain(e)[0] is not None:
                raise
            raise UsageError(f"the command line does not build: {e}") from e

    def after_instantiate_classes(self) -> None:
        # The network now, sized from the data, not when fitting starts: callbacks such as
        # StochasticWeightAveraging copy the model before its configure_model runs.
        if isinstance(self.model, ImageClassifier) and self.datamodule is not None:
            self.model.take_from_data(self.datamodule, statistics=False)
        if self.datamodule is None and not is_overridden("train_dataloader", self.model):
            raise UsageError(f"{type(self.model).__name__} has no data: give --data and a "
                             f"LightningDataModule (MNISTDataModule, or the class path of yours)")
        defaults.on_the_trainer(self.trainer)
        # The run's folder, chosen here: a fit and its test in processes started from this one
        # (ddp_spawn) would each choose the next free one.
        getattr(self.trainer.logger, "version", None)

    def after_fit(self) -> None:
        """Test the best checkpoint (the last weights where there is none), where the model has a
        test_step and the data a test split; then the run's line."""
        has_test = is_overridden("test_step", self.model) and self.datamodule is not None
        if has_test and is_overridden("test_dataloader", self.datamodule):
            best = next((c.best_model_path for c in self.trainer.checkpoint_callbacks
                         if c.monitor and c.best_model_path), None)
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best,
                              verbose=self.given.trainer.enable_progress_bar is not False)
        self.say()

    def say(self) -> None:
        """The record's line: the model, the data, the metrics it logged, where its run is."""
        folder = run_folder(self.trainer) if self.trainer.is_global_zero else None
        # The file, not the callback's copy: under ddp_spawn, a process of its own wrote it.
        self.record = (runs.record(Path(folder)) if folder else None) or None
        if self.record:
            print(RunRecord.summary(self.record), flush=True)

    after_test = after_validate = say

    def stopped(self, error: BaseException) -> Stopped | None:
        """The one line and exit code of a command that a signal ended: where, what was saved,
        how to go on (SIGTERM: 143, Ctrl-C: 130); None for any other end."""
        trainer = getattr(self, "trainer", None)
        last = [c for c in getattr(trainer, "callbacks", []) if isinstance(c, LastCheckpoint)]
        by = last[0].stopped_by if last else None
        if isinstance(error, KeyboardInterrupt) or by == "Ctrl-C" and error.code == 1:
            by = "Ctrl-C"  # Lightning ends a second Ctrl-C in a stage with exit(1)
        elif not isinstance(error, SIGTERMException):
            return None
        by, code = by or "SIGTERM", {"Ctrl-C": 130}.get(by, 143)
        # The Trainer's stage, or the subcommand where none runs (export, the model being built)
        fn = getattr(getattr(trainer, "state", None), "fn", None) or getattr(self, "subcommand", "")
        if trainer is None or fn == "fit" and trainer.state.fn is None:
            return Stopped(f"stopped by {by} before the command started; nothing was written", code)
        saved = [c.saved_on_stop for c in last if c.saved_on_stop]
        said = f"while {getattr(fn, 'value', fn).rstrip('e')}ing; what it wrote before is whole"
        if fn == "fit":
            said = f"in epoch {trainer.current_epoch}; no checkpoint was written"
        if fn == "fit" and saved:
            said = (f"in epoch {trainer.current_epoch} at step {trainer.global_step}; saved "
                    f"{saved[0]}: add --ckpt_path {saved[0]} to the same command to go on")
        return Stopped(f"stopped by {by} {said}", code)


def main(argv: list[str] | None = None) -> int:
    """`python train.py ARGS` (`lit-train ARGS`): one command line; its exit code, and one line for
    what went wrong (`--verbose` adds the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        TrainCLI([a for a in argv if a != "--verbose"])
    except (SystemExit, Exception, KeyboardInterrupt) as e:
        return errors.exit_code(e, verbose="--verbose" in argv)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # gloo's threads would abort the exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
