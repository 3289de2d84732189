"""Experiments: many train.py command lines as one Optuna study (`python sweep.py`, see experiments/main.py)."""
