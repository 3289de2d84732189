"""What a sweep reports, from its study: a table with a row per trial (also summary.csv), the settings ranked
by their mean val/acc_best over seeds, the test accuracy of the chosen one only, and best.yaml.

Settings are chosen on the validation split; the test set is looked at once, for the setting chosen, so that
the number reported is not itself the result of a choice.
"""

import csv
import shlex
import statistics
from pathlib import Path

import yaml
from optuna.trial import TrialState

from experiments.space import short_names, value_text
from experiments.study import interrupted, setting_params, slot, surplus

STATES = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
          TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}
CSV_COLUMNS = ["trial", "seed", "state", "epochs", "val/acc_best", "fit_seconds", "note", "command", "log_dir"]


def trial_rows(trials: list, keys: list[str]) -> list[dict]:
    """One row per trial that holds a slot or was interrupted, in trial order (surplus trials never ran)."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        if surplus(t) or slot(t) is None:
            continue
        attrs, results = t.user_attrs, t.user_attrs.get("results") or {}
        params = setting_params(t)
        note = attrs.get("error")
        if interrupted(t):
            again = next((u.number for u in trials if u.number > t.number and slot(u) == slot(t) and not surplus(u)
                          and not interrupted(u)), None)
            reason = attrs.get("interrupted", "its process stopped sending heartbeats")
            note = f"{reason}; " + (f"run again as trial {again}" if again is not None else
                                                  "it runs again when the same command is run again")
        if t.state == TrialState.PRUNED:
            note = f"pruned after epoch {attrs.get('pruned_epoch', 0) + 1}: its val/acc was below the median"
        rows.append({"trial": t.number, "params": {k: params.get(k) for k in keys}, "seed": attrs.get("seed"),
                     "state": "interrupted" if interrupted(t) else STATES[t.state],
                     "epochs": results.get("epochs"), "val/acc_best": results.get("val/acc_best"),
                     "fit_seconds": results.get("fit_seconds"), "note": note, "command": attrs.get("command"),
                     "log_dir": results.get("log_dir"), "setting": attrs["setting"],
                     "test/acc": results.get("test/acc")})
    return rows


def ranked_settings(rows: list[dict]) -> list[list[dict]]:
    """The settings with a complete trial, each as its complete trials, best mean val/acc_best first."""
    groups: dict = {}
    for row in rows:
        if row["state"] == "complete" and row["val/acc_best"] is not None:
            groups.setdefault(row["setting"], []).append(row)
    return sorted(groups.values(), key=lambda g: (-statistics.fmean(r["val/acc_best"] for r in g), g[0]["trial"]))


def mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def shown(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else value_text(value)


def setting_text(params: dict, names: dict) -> str:
    return ", ".join(f"{names[k]}={shown(v)}" for k, v in params.items()) or "(the command as given)"


def table(rows: list[dict], names: dict) -> str:
    header = ["trial", *names.values(), "seed", "state", "epochs", "val/acc_best", "fit s"]
    body = [[str(r["trial"]), *(shown(v) for v in r["params"].values()), shown(r["seed"]), r["state"],
             shown(r["epochs"]), f"{r['val/acc_best']:.4f}" if r["val/acc_best"] is not None else "-",
             f"{r['fit_seconds']:.1f}" if r["fit_seconds"] is not None else "-"] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    left = {1 + i for i in range(len(names))} | {len(names) + 2}  # params and state: text, left-aligned
    return "\n".join("  ".join(cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(line, widths))).rstrip() for line in [header, *body])


def write_csv(rows: list[dict], keys: list[str], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", *keys, *CSV_COLUMNS[1:]])
        for r in rows:
            writer.writerow([r["trial"], *(value_text(v) if v is not None else "" for v in r["params"].values()),
                             *("" if r[c] is None else r[c] for c in CSV_COLUMNS[1:])])


def write_best(row: dict, plumbing: dict, path: Path, comment: str) -> bool:
    """best.yaml: the chosen trial's own config.yaml, with what the sweep set for its bookkeeping (where the
    run writes, the progress bar, the device) back as the sweep's command had it. False if the trial's run
    directory is not on this machine."""
    config_file = Path(row["log_dir"] or "") / "config.yaml"
    if not config_file.is_file():
        return False
    config = yaml.safe_load(config_file.read_text())
    trainer = config.setdefault("trainer", {})
    logger = trainer.get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
        logger["init_args"].update({k: plumbing[k] for k in ("save_dir", "name", "version")})
    trainer["enable_progress_bar"] = plumbing["enable_progress_bar"]
    trainer["devices"] = plumbing["devices"]
    lines = "".join(f"# {line}\n" for line in comment.splitlines())
    path.write_text(lines + yaml.safe_dump(config, sort_keys=False))
    return True


def shown_path(path: Path) -> str:
    """A path as a user in this folder would type it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report(study, keys: list[str], sweep_dir: Path, plumbing: dict, name: str) -> tuple[str, int]:
    """Write summary.csv and best.yaml into `sweep_dir`; return the text to print and the number of settings
    with a complete trial."""
    rows = trial_rows(study.get_trials(deepcopy=False), keys)
    names = short_names(keys)
    write_csv(rows, keys, sweep_dir / "summary.csv")
    counts = {s: sum(r["state"] == s for r in rows) for s in [*STATES.values(), "interrupted"]}
    done = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    out = [f"Sweep {name}: {len(rows)} trials ({done or 'none yet'}) in {shown_path(sweep_dir)}/", "",
           table(rows, names)]
    notes = [f"  trial {r['trial']}: {r['note']}" for r in rows if r["note"] and r["state"] != "pruned"]
    if notes:
        out += ["", *notes]
    ranked = ranked_settings(rows)
    if not ranked:
        out += ["", "No setting has a complete trial yet."]
        return "\n".join(out), 0
    seeds = max(len(g) for g in ranked)
    over = " (mean ± std over seeds)" if seeds > 1 else ""
    out += ["", f"Settings by val/acc_best on the validation split{over}:"]
    width = max(len(setting_text(g[0]["params"], names)) for g in ranked[:5])
    for group in ranked[:5]:
        n = len(group)
        values = [r["val/acc_best"] for r in group]
        out.append(f"  {setting_text(group[0]['params'], names):{width}}  {mean_std(values)}"
                   f"  ({n} seed{'s' if n > 1 else ''}: trial{'s' if n > 1 else ''} "
                   f"{', '.join(str(r['trial']) for r in group)})")
    chosen = ranked[0]
    tests = [r["test/acc"] for r in chosen if r["test/acc"] is not None]
    if tests:
        out += ["", f"Chosen: {setting_text(chosen[0]['params'], names)}, test/acc {mean_std(tests)}"
                    f"{f' over {len(tests)} seeds' if len(tests) > 1 else ''}. The test accuracy is reported for "
                    f"the chosen setting only; every choice was made on the validation split."]
    best = min(chosen, key=lambda r: r["trial"])
    env = best["command"].split(" python train.py")[0] + " " if " python train.py" in best["command"] else ""
    comment = (f"The best setting of sweep {name}: {setting_text(best['params'], names)}, trial {best['trial']} "
               f"(seed {best['seed']}, val/acc_best {best['val/acc_best']:.4f}).\n"
               f"Its command: {best['command']}\n"
               f"Run it again with: {env}python train.py --config {shlex.quote(shown_path(sweep_dir / 'best.yaml'))}")
    if write_best(best, plumbing, sweep_dir / "best.yaml", comment):
        out.append(f"best.yaml: trial {best['trial']}'s configuration; {env}python train.py --config "
                   f"{shlex.quote(shown_path(sweep_dir / 'best.yaml'))} runs it again"
                   f"{' (with the threads it had: float sums depend on them)' if env else ''}.")
    else:
        out.append(f"best.yaml not written: trial {best['trial']}'s run directory {best['log_dir']} is on another "
                   f"machine. Its command: {best['command']}")
    out.append(f"Compare the trials: tensorboard --logdir {shlex.quote(shown_path(sweep_dir))} (the HParams tab).")
    return "\n".join(out), len(ranked)
