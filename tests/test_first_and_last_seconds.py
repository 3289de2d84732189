"""The first and last seconds of a command: what it needs before it starts (data for a model, a
run's configuration edited by hand), and the record of a fit whatever its test does."""

import re
import textwrap

from conftest import results, run_train, runs

SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "64"]


def last_line(capsys) -> str:
    """The last line the command wrote to stderr."""
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_runs_configuration_damaged_by_hand_is_one_line(mnist_dir, in_tmp, capsys):
    """Going on from the run reads its config.yaml: a damaged one is one line (jsonargparse's).
    Testing it does not: its checkpoint carries its model and data."""
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT]) == 0
    (run,) = runs(in_tmp)
    config = run / "config.yaml"
    whole = config.read_text()
    for damaged, said in ((whole + "x: [\n", "Problems parsing config"),
                          ("- a list, not a mapping\n", "Unexpected config")):
        config.write_text(damaged)
        capsys.readouterr()
        assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
            f"train.py: error: {said}")
        assert results(run)["epochs"] == 1  # nothing went on
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    assert "ImageClassifier(mlp) on mnist: test/acc" in capsys.readouterr().out


FAILING_TEST = '''
from lit_models import ImageClassifier


class FailsItsTest(ImageClassifier):
    def test_step(self, batch, batch_idx):
        raise ValueError("the test set is not what this model was trained for")
'''


def test_a_fit_whose_test_fails_keeps_its_record_and_says_why(mnist_dir, own_modules,
                                                               monkeypatch):
    (own_modules / "failing.py").write_text(textwrap.dedent(FAILING_TEST))
    monkeypatch.chdir(own_modules)
    args = ["--model", "mlp", "--model", "failing.FailsItsTest", "--data.data_dir",
            str(mnist_dir), *SHORT]
    assert run_train(args) == 1
    (run,) = runs(own_modules)
    record = results(run)
    said = "the test set is not what this model was trained for"
    assert record["status"] == f"failed: ValueError: {said}" and record["stage"] == "fit"
    assert record["epochs"] == 1 and record["metrics"]["val/acc_best"] > 0.5
    assert "test/acc" not in record["metrics"]
    assert (run / "checkpoints" / "last.ckpt").is_file()  # the fit's, kept


def test_a_stop_in_the_test_after_a_fit_keeps_the_fit_and_its_test_runs(mnist_dir, in_tmp,
                                                                        capsys):
    """SIGTERM as the fit's test starts: exit 143 and one line; the fit's record and checkpoints
    stay, and `test --ckpt_path best` tests it then."""
    # In one of several test batches: Lightning stops an evaluation at a batch that is not its last.
    stop = ["--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=-1",
            "--data.eval_batch_size", "50"]
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *stop]) == 143
    assert last_line(capsys) == ("train.py: stopped by SIGTERM while testing; what it wrote "
                                 "before is whole")
    (run,) = runs(in_tmp)
    record = results(run)
    assert record["status"] == "stopped by SIGTERM" and record["metrics"]["val/acc_best"] > 0.5
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    assert re.search(r"test/acc \d\.\d{4} of \S+", capsys.readouterr().out)


LIT_MODEL = '''
import lightning as L
import torch
from torch import nn
from torch.nn import functional as F


class LitModel(L.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.layer = nn.Linear(28 * 28, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.layer(x.flatten(1)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
'''


def test_a_model_without_data_is_told_the_option_that_runs_it(mnist_dir, own_modules,
                                                              monkeypatch, capsys):
    (own_modules / "lit_model.py").write_text(textwrap.dedent(LIT_MODEL))
    monkeypatch.chdir(own_modules)
    assert run_train(["--model", "lit_model.LitModel", "--trainer.max_epochs", "1"]) == 2
    said = last_line(capsys)
    assert said.startswith("train.py: error: ") and "data" in said
    assert run_train(["--model", "lit_model.LitModel", "--data", "MNISTDataModule",
                      "--data.data_dir", str(mnist_dir), *SHORT]) == 0
    assert "LitModel on mnist" in capsys.readouterr().out
