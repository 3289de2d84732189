"""sweep.py's parts, in study.py: the search space, the study its workers share, and the objective
that trains a trial."""
