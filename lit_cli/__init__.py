"""train.py's parts: the command line's short forms, runs and checkpoints, the default callbacks,
the model's option rules, the record, signals and errors, predict, and the Trainer it runs."""
