"""The command line behind train.py: arguments and short names, run directories and checkpoints, the
LightningCLI class, results, and the use/experiment subcommands."""
