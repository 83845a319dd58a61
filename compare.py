r"""
The papers' comparison in one command: a grid of training runs that differ only in their
residual connections (or their linears), N paired seeds each, one table and a few pictures.

    python compare.py config/train_shakespeare_char.py --seeds=3                 # the residual grid
    python compare.py config/train_shakespeare_char.py --seeds=3 --runs=lowrank  # dense vs rank 32 vs rank 32 + DLR
    python compare.py config/train_shakespeare_char.py --runs=standard,delta/res_blocks=2 --max_iters=500
    python compare.py config/train_shakespeare_char.py --sweep=n_layer=4,8,16 --runs=depth --seeds=3 --jobs=2 \
        --publish=docs/compare/depth                                             # the depth study
    python compare.py config/rd_fineweb_edu_120m.py --eval_tasks=hellaswag,arc_easy,piqa  # + downstream scores

Options:
  --runs=R        a grid name from GRIDS (residual, lowrank, all, depth, width), or a comma list of run names
  --seeds=N       seeds 0..N-1
  --sweep=K=A,B   run the grid at each value of one train.py key K (e.g. n_layer=4,8,16)
  --jobs=N        N training runs at a time; with N > 1 each on one torch thread unless OMP_NUM_THREADS
                  is set (N = 1: torch's own default)
  --publish=DIR   copy results.md, results.json, the pictures and every finished run's log (and scores)
                  into DIR, a folder outside <out_dir>/compare: the runs this command trains and those an
                  earlier one did, here or in another grid sharing the out_dir (results.md links its
                  pictures as files next to it, so its links work in DIR too); a run whose published log
                  has finished is taken from DIR, never trained again (one unfinished here with a
                  checkpoint is an error: delete it to take the published run, or continue it without
                  --publish)
  --report=True   write the results from the runs finished so far, train and evaluate nothing (with
                  --publish, publish them too)
  --eval_tasks=T,U  score every finished run with eval.py on these lm-evaluation-harness tasks (pip
                  install lm-eval): each metric becomes a column, paired across seeds like val loss;
                  --eval_limit=N scores only the first N examples of each task, --eval_include_path=DIR
                  adds task YAMLs of your own (a task eval.py does not know stops the grid before it
                  starts). A run already scored on the same tasks and limit keeps its scores
                  (run_dir/ckpt.eval.json; --publish copies it beside the run's log)
Every other --key=value goes to train.py, for every run (python train.py --help lists them); all are
read as train.py reads its own, so a wrong key or value stops the grid before it starts, and so do
eval_only=True and init_from=resume: compare.py trains each run itself, and resumes an unfinished one.

A run name is what the run changes: `standard`, `<mode>/res_blocks=N` (attnres, delta, rd),
`rd_fixedv/res_blocks=N` (rd whose value route never learns: the RD paper's control),
`lowrank/rank=R` (standard residual, low-rank linears), `dlr/rank=R` (the same plus DLR). With
--sweep a name may start with one value, `n_layer=16/rd/res_blocks=4`, to run only there; the runs
of a sweep are named so (folders too: runs/n_layer=16/rd/res_blocks=4/seed0). Each run is
`python train.py <config> --out_dir=<out_dir>/compare/runs/<name>/seed<k> --seed=<k> <the run's
settings> <your --key=value>`. A run whose log.jsonl has a `done` event is not trained again, so
rerunning the command resumes the grid (an unfinished run continues from its checkpoint, exactly, or starts
over where it has none; Ctrl-C or SIGTERM stops the running ones with a checkpoint each, with always_save_checkpoint=True,
train.py's default). Runs are told apart by the settings their arguments stand for, not by how the
command spells them: the same flags in another order are the same runs. A checkpoint is never deleted:
one begun with other train.py settings or other code (the repository's .py files and the config file)
is an error that says what differs, and so is a finished run whose log records other settings than
the grid gives now (config file, command line, the run's own): not a silent mix. Runs go value by
value, seed by seed: the cheapest values first, and each value's table is complete before the next one starts.

Paired protocol (as in the RD paper): train.py seeds the backbone init and the batch order with
--seed only, so for a given seed every run starts from the same weights and sees the same batches;
only the residual machinery differs. Each run is compared with the `standard` (dense) run of the same
seed and value, and with its parent in the papers: rd and delta with attnres at the same res_blocks
(the RD and Delta papers' baselines), rd_fixedv with rd and attnres, a DLR run with its plain
low-rank twin.

The train.py processes inherit the environment: on a CPU that other programs share, OMP_NUM_THREADS=1
avoids torch threads waiting on each other, which slows small models several times over (docs/speed.md,
"Measurements behind the code"); --jobs above 1 sets it when you have not.

Output in <out_dir>/compare/: results.md (with --eval_tasks, a second table: the task scores),
results.json, val_loss.png, routing_<run>.png (one per routed run) and, where the grid holds attnres or
delta runs, max_weight_by_depth.png (one of each per value with --sweep), and with --sweep
sweep_val_loss.png and sweep_max_weight.png, all
drawn by figures.py (which also sets published grids side by side: python figures.py --help).
results.md names the machine the runs trained on, as each run's log records it (its `start` event), not
the machine that writes the report; when this command trained every run, that machine in full (cores,
torch threads, runs at a time). Finished runs kept from earlier commands may have trained elsewhere:
results.md then says which run trained where.
"""

import hashlib
import heapq
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import configurator
from common import (REFERENCE, cannot_write, die, hms, is_number, lock_folder, read_train_args, routing_summary, run_name,
                    split_point, task_scores)
from common import run_settings as common_run_settings
from figures import comparisons, plot_max_weight, plot_routing, plot_sweep, plot_sweep_max_weight, plot_val_loss

GRIDS = {
    "residual": ["standard"] + [f"{m}/res_blocks={n}" for m in ("attnres", "delta", "rd") for n in (0, 4)],
    "lowrank": ["standard", "lowrank/rank=32", "dlr/rank=32"],
    # the depth study: per-sublayer routing at every depth, the RD control at 8 and 16, block routing at 16
    "depth": ["standard"] + [f"{m}/res_blocks=0" for m in ("attnres", "delta", "rd")]
             + [f"n_layer={n}/rd_fixedv/res_blocks=0" for n in (8, 16)]
             + [f"n_layer=16/{m}/res_blocks=4" for m in ("attnres", "delta", "rd")],
    # the width study (with --sweep=n_embd=...): 8 layers, per-sublayer routing, the RD control, block attnres
    "width": ["standard", "attnres/res_blocks=0", "rd/res_blocks=0", "rd_fixedv/res_blocks=0", "attnres/res_blocks=4"],
}
GRIDS["all"] = list(dict.fromkeys(GRIDS["residual"] + GRIDS["lowrank"]))
# what each kind of run is compared with besides standard: its baseline in the papers (same res_blocks or rank)
PARENTS = {"rd": ["attnres"], "delta": ["attnres"], "rd_fixedv": ["rd", "attnres"], "dlr": ["lowrank"]}
RUN_KEYS = ("residual", "res_blocks", "fixed_value_route", "lowrank_rank", "dlr",
            "wandb_run_name")  # set by each run, not on the command line
# train.py settings that would take a run out of compare.py's hands: it trains each run itself, and a rerun
# of the same command resumes an unfinished one from its checkpoint
NOT_PASSED_ON = {"eval_only": True, "init_from": "resume"}
TRAINS_ITSELF = ("compare.py trains each run itself, and resumes an unfinished one from its checkpoint when the same "
                 "command runs again")
PROBE_ITERS = 10  # iterations of the timing probe that makes the up-front estimate
TRAIN = Path(__file__).resolve().parent / "train.py"
EVAL = TRAIN.parent / "eval.py"
TRAIN_DEFAULTS = configurator.script_defaults(TRAIN)  # every train.py key, with its default
OPTIONS = dict(runs="residual", seeds=3, sweep="", jobs=1, publish="", report=False,
               eval_tasks="", eval_limit=0, eval_include_path="")  # compare.py's own keys


# -----------------------------------------------------------------------------
# runs: names <-> train.py settings

def run_settings(name):
    """train.py settings of a run (common.run_settings), with the sweep value its name may start with:
    'n_layer=8/rd_fixedv/res_blocks=0' -> n_layer=8 and rd_fixedv's settings."""
    point, name = split_point(name)
    settings = common_run_settings(name)
    if point:
        key, _, value = point.partition("=")
        settings = {key: configurator.parse_value(key, value, TRAIN_DEFAULTS), **settings}
    return settings


def select_runs(runs, sweep=None):
    """The run names of a grid name or comma list, each once, the reference first; with a sweep
    (key, [values]) the same list at every value, value by value, each name prefixed 'key=value/'.
    A name that already starts with a value runs at that value only."""
    names = GRIDS[runs] if runs in GRIDS else [n for n in runs.split(",") if n]
    if not names:
        raise ValueError(f"--runs={runs!r} names no runs: use {', '.join(GRIDS)} or a comma list of run names")
    grids = [n for n in names if n in GRIDS]  # (no run is named like a grid)
    if grids:
        raise ValueError(f"--runs={runs}: a grid ({', '.join(grids)}) goes alone, not in a list: give one grid (all is "
                         "residual and lowrank together) or a comma list of run names")
    canonical = []
    for name in names:
        point, kind = split_point(name)
        canonical.append((point, run_name(run_settings(kind))))
    if not sweep:
        if any(point for point, _ in canonical):
            raise ValueError(f"--runs={runs} names runs at a sweep value ({', '.join(p + '/' + k for p, k in canonical if p)}): "
                             "add --sweep=key=value,... or drop the value")
        return list(dict.fromkeys([REFERENCE] + [kind for _, kind in canonical]))
    key, values = sweep
    points = [f"{key}={v}" for v in values]
    stray = [p + "/" + k for p, k in canonical if p and p not in points]
    if stray:
        raise ValueError(f"run(s) {', '.join(stray)} name a value that --sweep={key}={','.join(values)} does not have")
    out = []
    for point in points:  # the reference is always trained: it anchors every comparison at its value
        kinds = dict.fromkeys([REFERENCE] + [k for p, k in canonical if p in ("", point)])
        out += [f"{point}/{kind}" for kind in kinds]
    return out


def references(name, names):
    """What a run is compared with: the standard run at its value, and its papers' parent (PARENTS) at
    the same value and res_blocks (or rank) where the grid has it."""
    point, kind_name = split_point(name)
    if kind_name == REFERENCE:
        return []
    prefix = point + "/" if point else ""
    kind, _, rest = kind_name.partition("/")
    parents = [f"{prefix}{parent}/{rest}" for parent in PARENTS.get(kind, [])]
    return [prefix + REFERENCE] + [p for p in parents if p in names]


def slug(name):
    """A file-name form of a run name: 'attnres/res_blocks=4' -> 'attnres_res_blocks4'."""
    return name.replace("/", "_").replace("=", "")


# -----------------------------------------------------------------------------
# reading the logs

def read_log(run_dir):
    """The events of run_dir/log.jsonl (an empty list if there is none); a half-written last line, or any
    line that is no JSON object, is skipped."""
    path = Path(run_dir) / "log.jsonl"
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def finished(events):
    """The run's `done` event, or None if it has not finished."""
    return next((e for e in reversed(events) if e.get("event") == "done"), None)


def run_record(events):
    """What the aggregation needs from one finished run's log: its final val loss, time, val curve,
    routing at the last eval, and the commit and machine that trained it (from its `start` event).
    A value the log lacks is None here: record_problem says what is wrong."""
    done = finished(events)
    evals = [e for e in events if e.get("event") == "eval"]
    routing = evals[-1].get("routing") if evals else None
    start = next((e for e in events if e.get("event") == "start"), {})
    machine = f"{start['device_name']}, torch {start.get('torch')}" if start.get("device_name") else None
    return dict(val_loss=done.get("val_loss"), elapsed_s=done.get("elapsed_s"), commit=start.get("commit"),
                machine=machine, curve=[(e.get("iter"), e.get("val_loss")) for e in evals], routing=routing or None)


def routing_problem(routing):
    """What keeps one eval's routing (model.last_routing, as a log holds it) out of the routing columns
    and pictures, or None: every route needs its source weights, a route that chooses among them its max
    weight and entropy, all numbers."""
    if not isinstance(routing, dict) or not all(isinstance(route, dict) for route in routing.values()):
        return "its last eval's routing is not one entry per route"
    for name, route in routing.items():
        weights = route.get("weights")
        if not isinstance(weights, list) or not weights or not all(map(is_number, weights)):
            return f"its last eval's routing has no weights for {name}"
        if ("max_weight" in route) != ("entropy" in route) or not all(
                is_number(route[k]) for k in ("max_weight", "entropy", "js_qk_v") if k in route):
            return f"its last eval's routing of {name} lacks a number for its max_weight or entropy"
    if not routing_summary(routing):
        return "its last eval's routing has no route with a max_weight and an entropy"
    return None


def record_problem(record):
    """What in a finished run's record (run_record) the tables and pictures cannot read, or None. train.py
    writes no such log, but one edited, or cut and pasted, by hand may be: found here, it is one line that
    names the file, not a traceback from deep in the statistics."""
    if not is_number(record["val_loss"]):
        return f"its done event has val_loss={record['val_loss']!r}, not a number"
    if record["elapsed_s"] is not None and not is_number(record["elapsed_s"]):  # (without one: no time in the table)
        return f"its done event has elapsed_s={record['elapsed_s']!r}, not a number"
    if not all(is_number(it) and is_number(val) for it, val in record["curve"]):
        return "an eval event lacks a number for its iter or val_loss"
    if record["commit"] is not None and not isinstance(record["commit"], str):
        return f"its start event has commit={record['commit']!r}, not a git commit"
    return routing_problem(record["routing"]) if record["routing"] is not None else None


def eval_file(run_dir):
    """Where eval.py writes a run's scores: next to its checkpoint."""
    return Path(run_dir) / "ckpt.eval.json"


def eval_record(run_dir, report=False):
    """(eval.py's record in run_dir, its downstream scores {"task/metric": (value, higher_is_better)}), or
    (None, {}) where there is none. A file that is not eval.py's (damaged, or edited by hand) is a ValueError
    that names it and says what to do (report: under --report=True, which scores nothing), rather than a run
    silently left out of the scores table."""
    path = eval_file(run_dir)
    if not path.exists():
        return None, {}
    rescore = ("delete it and run the command again to report the run without scores; the grid's command with "
               "--eval_tasks and without --report=True scores it again" if report else
               "delete it and run the grid's command again (with --eval_tasks, eval.py scores the run again)")
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not eval.py's scores (not JSON: {e}): {rescore}") from None
    try:
        return record, task_scores(record["harness"])
    except (KeyError, TypeError, AttributeError):  # {}, [], results of another shape
        raise ValueError(f"{path} is not eval.py's scores (no harness results in it): {rescore}") from None


def read_scores(run_dir, report=False):
    """The run's downstream scores, eval_record's: {} where eval.py has not scored it."""
    return eval_record(run_dir, report)[1]


def routing_shape(routing):
    """A routing's routes and the number of sources of each: what the seeds of one run share."""
    return tuple((name, len(route["weights"]), "max_weight" in route) for name, route in routing.items())


def load_records(runs_dir, names, seeds, publish=None, scores=True, report=False):
    """{name: {seed: record}} for every finished run of the grid, with its downstream scores if it has some
    (scores=False: none read, for scores eval.py is about to write again; report: read for --report=True,
    which scores nothing). A log the tables and pictures cannot read (record_problem), or seeds of one run
    whose routings differ in shape, is a ValueError that names the file and says to train the run again
    (its copy in publish, if it has one, deleted too)."""
    records = {}
    for name in names:
        logs = {}  # routing shape -> the first log that has it
        for seed in seeds:
            run_dir = Path(runs_dir) / name / f"seed{seed}"
            events = read_log(run_dir)
            if not finished(events):
                continue
            record = run_record(events)
            problem = record_problem(record)
            if problem:
                published = Path(publish) / "runs" / name / f"seed{seed}" if publish else None
                copy = f" and {published}" if published and published.exists() else ""
                raise ValueError(f"{run_dir / 'log.jsonl'} is damaged ({problem}): delete {run_dir}{copy} and run the "
                                 "grid's command again to retrain the run")
            if record["routing"]:
                logs.setdefault(routing_shape(record["routing"]), run_dir / "log.jsonl")
                if len(logs) > 1:
                    raise ValueError(f"{' and '.join(map(str, logs.values()))} hold routings of other routes or sources, "
                                     "though the seeds of one run route alike: one is damaged; delete its run's folder "
                                     "and run the grid's command again to retrain the run")
            records.setdefault(name, {})[seed] = dict(record, scores=read_scores(run_dir, report) if scores else {})
    return records


# -----------------------------------------------------------------------------
# statistics

def mean_std(values):
    """(mean, std with ddof=1); std is None for fewer than two values."""
    values = list(values)
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def paired_diffs(run, ref, higher_is_better=False):
    """Paired comparison of two runs over the seeds both finished. run, ref: {seed: value}. Per seed
    diff = run - ref, then its mean and std (ddof=1) over seeds, and wins = seeds where the run is
    better: lower, or higher for a score where higher is better."""
    seeds = sorted(set(run) & set(ref))
    diffs = [run[s] - ref[s] for s in seeds]
    mean, std = mean_std(diffs)
    return dict(seeds=seeds, n=len(seeds), diff=diffs, diff_mean=mean, diff_std=std,
                wins=sum(d > 0 if higher_is_better else d < 0 for d in diffs))


def paired(run, ref):
    """paired_diffs of two runs' val losses ({seed: val_loss}), in nats, and per seed 100 (exp(diff) - 1),
    the perplexity change in percent, with its mean and std over seeds."""
    p = paired_diffs(run, ref)
    ppl = [100 * math.expm1(d) for d in p["diff"]]
    p_mean, p_std = mean_std(ppl)
    return dict(seeds=p["seeds"], n=p["n"], diff_nats=p["diff"], diff_nats_mean=p["diff_mean"], diff_nats_std=p["diff_std"],
                ppl_pct=ppl, ppl_pct_mean=p_mean, ppl_pct_std=p_std, wins=p["wins"])


def aggregate_scores(records, name, refs):
    """A run's downstream scores: per task metric its value per seed, mean and std over seeds, whether
    higher is better (the harness says), and its paired comparisons with refs, the run's references."""
    def values(run, metric):
        return {s: r["scores"][metric][0] for s, r in records.get(run, {}).items() if metric in r["scores"]}
    out = {}
    for metric, (_, higher) in {m: v for r in records.get(name, {}).values() for m, v in r["scores"].items()}.items():
        mean, std = mean_std(values(name, metric).values())
        out[metric] = dict(value=values(name, metric), mean=mean, std=std, higher_is_better=higher,
                           paired={ref: paired_diffs(values(name, metric), values(ref, metric), higher) for ref in refs})
    return out


def mean_routing(routings):
    """One run's routing over its seeds, from their final evals' routing (one dict per seed):
    routing_summary's numbers (deepest route, its max weight and entropy, rd's QK/V JS) and every
    route's max weight and depth weights, each averaged over seeds."""
    routings = [r for r in routings if r]
    if not routings:
        return None
    summaries = [routing_summary(r) for r in routings]
    js = [s["mean_js"] for s in summaries if "mean_js" in s]
    return dict(deepest=summaries[0]["deepest"],
                deep_max_weight=statistics.fmean(s["deep_max_weight"] for s in summaries),
                deep_entropy=statistics.fmean(s["deep_entropy"] for s in summaries),
                mean_js=statistics.fmean(js) if js else None,
                max_weight={route: statistics.fmean(r[route]["max_weight"] for r in routings)
                            for route in routings[0] if "max_weight" in routings[0][route]},
                weights={route: np.mean([r[route]["weights"] for r in routings], axis=0).tolist()
                         for route in routings[0]})


def aggregate(records, names):
    """results.json's 'runs': per run its seeds' val losses, mean and std, paired comparisons with its
    references, routing diagnostics and time per run."""
    out = {}
    for name in names:
        recs = records.get(name, {})
        val = {s: r["val_loss"] for s, r in recs.items()}
        v_mean, v_std = mean_std(val.values())
        times = [r["elapsed_s"] for r in recs.values() if r["elapsed_s"] is not None]
        out[name] = dict(settings=run_settings(name), val_loss=val, val_loss_mean=v_mean, val_loss_std=v_std,
                         elapsed_s_mean=statistics.fmean(times) if times else None,
                         commits=sorted({r["commit"] for r in recs.values() if r.get("commit")}),
                         machines=sorted({r["machine"] for r in recs.values() if r.get("machine")}),
                         paired={ref: paired(val, {s: r["val_loss"] for s, r in records.get(ref, {}).items()})
                                 for ref in references(name, names)},
                         routing=mean_routing([r["routing"] for r in recs.values()]),
                         scores=aggregate_scores(records, name, references(name, names)))
    return out


# -----------------------------------------------------------------------------
# results.md

def fmt(x, digits=4, sign=False):
    """A table cell's number: `digits` decimals, with its sign if `sign`; "" for None (nothing measured)."""
    return "" if x is None else f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def pm(mean, std, digits=4, sign=False, unit=""):
    """A table cell's "mean ± std" (mean alone where std is None: one seed); "" for no mean."""
    if mean is None:
        return ""
    return fmt(mean, digits, sign) + unit + ("" if std is None else f" ± {fmt(std, digits)}{unit}")


def table(results):
    """The results table in markdown: one row per run and reference it is compared with. The routing
    columns appear when some run routes, the JS column when some run is rd."""
    runs = results["runs"]
    routing = [k for k in ("deep_max_weight", "deep_entropy", "mean_js")
               if any((r["routing"] or {}).get(k) is not None for r in runs.values())]
    titles = dict(deep_max_weight="deep max weight", deep_entropy="deep entropy", mean_js="JS(QK, V)")
    head = ["run", "vs", "val loss", "Δ val (nats)", "Δ perplexity", "wins", *(titles[k] for k in routing), "s/run"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in runs.items():
        rt = r["routing"] or {}
        run_cells = [pm(r["val_loss_mean"], r["val_loss_std"]),
                     *(fmt(rt.get(k), 4 if k == "mean_js" else 3) for k in routing),
                     "" if r["elapsed_s_mean"] is None else f"{r['elapsed_s_mean']:.0f}"]
        if len(r["val_loss"]) < len(results["seeds"]):
            run_cells[0] += f" ({len(r['val_loss'])} of {len(results['seeds'])} seeds)"
        pairs = list(r["paired"].items()) or [("", None)]
        for i, (ref, p) in enumerate(pairs):
            cells = run_cells if i == 0 else [""] * len(run_cells)  # a second reference: only the comparison
            diff = ["", "", ""] if not p or not p["n"] else [
                pm(p["diff_nats_mean"], p["diff_nats_std"], sign=True),
                pm(p["ppl_pct_mean"], p["ppl_pct_std"], 2, sign=True, unit="%"), f"{p['wins']}/{p['n']}"]
            lines.append("| " + " | ".join([name, ref, cells[0], *diff, *cells[1:]]) + " |")
    return "\n".join(lines)


def score_table(results):
    """The downstream scores in markdown, rows as in table(): per task metric (↑: higher is better, ↓:
    lower) the run's mean ± std over seeds, and the paired Δ to the row's reference with its wins. ""
    when no run has scores."""
    runs = results["runs"]
    metrics = {m: s["higher_is_better"] for r in runs.values() for m, s in r.get("scores", {}).items()}
    if not metrics:
        return ""
    head = ["run", "vs"] + [cell for m, higher in metrics.items() for cell in (f"{m} {'↑' if higher else '↓'}", "Δ (wins)")]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in runs.items():
        for i, ref in enumerate(list(r["paired"]) or [""]):  # the references of the val loss table
            cells = [name, ref]
            for metric in metrics:
                s = r["scores"].get(metric)
                p = s["paired"].get(ref) if s else None
                cells += ["" if not s or i else pm(s["mean"], s["std"]),
                          "" if not p or not p["n"] else f"{pm(p['diff_mean'], p['diff_std'], sign=True)} ({p['wins']}/{p['n']})"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_table(results):
    """The sweep in one markdown table: a row per comparison, a column per value, cells the paired
    Δ val loss (nats, mean ± std over seeds) and the wins."""
    points = results["points"]
    lines = ["| run | vs | " + " | ".join(points) + " |", "|" + " --- |" * (len(points) + 2)]
    for (kind, ref), by_point in comparisons(results).items():
        cells = ["" if pt not in by_point else
                 f"{pm(by_point[pt]['diff_nats_mean'], by_point[pt]['diff_nats_std'], 3, sign=True)} "
                 f"({by_point[pt]['wins']}/{by_point[pt]['n']})" for pt in points]
        lines.append("| " + " | ".join([kind, ref, *cells]) + " |")
    return "\n".join(lines)


def runs_by_machine(runs):
    """{machine: [the runs (any of their seeds) that trained on it]}, from results.json's runs, machines
    in the order their first run comes."""
    out = {}
    for name, run in runs.items():
        for where in run["machines"]:
            out.setdefault(where, []).append(name)
    return out


def markdown(results):
    """results.md: the tables and the pictures, linked as files next to results.md (so the links work
    where it is published, e.g. docs/compare/<grid>/results.md)."""
    figures = results["figures"]
    lines = [f"Measured with `{results['command']}`: {results['max_iters']} iterations per run, "
             f"seeds {', '.join(map(str, results['seeds']))}, on {results['machine']}.", ""]
    where = runs_by_machine(results["runs"])
    if len(where) > 1:  # finished runs kept from an earlier command, on another computer
        lines += ["Not every run trained on one machine (a finished run is kept, not retrained): "
                  + "; ".join(f"{', '.join(names)} on {machine}" for machine, names in where.items())
                  + ". Compare s/run only between runs of one machine.", ""]
    if results["points"] != [""]:
        lines += ["Paired Δ val loss (nats, run − reference, mean ± std over seeds; wins/seeds) at each value:", "",
                  sweep_table(results), ""]
        lines += [f"![{title}]({figures[key]})" for key, title in
                  (("sweep_val_loss", "paired Δ val loss at each value"), ("sweep_max_weight", "deepest route's max weight at each value"))
                  if key in figures] + ["", "Every run:", ""]
    lines.append(table(results))
    note = ("val loss: the final eval's, mean ± std over seeds (std with ddof=1). Δ: paired, per seed run − "
            "reference (same init, same batches), then mean ± std over seeds; Δ perplexity = 100 (exp Δ − 1) %; "
            "wins: seeds where the run's val loss is below the reference's. ")
    if results["deepest"]:
        deepest = ", ".join(f"{route} at {pt}" if pt else route for pt, route in results["deepest"].items())
        note += (f"Routing at the final eval, averaged over seeds: deep = the last sublayer's input route ({deepest}), "
                 "its max weight (a uniform route over m sources has 1/m) and entropy / log m (1 = uniform). ")
    if any((r["routing"] or {}).get("mean_js") is not None for r in results["runs"].values()):
        note += "JS: mean Jensen-Shannon divergence (nats) between rd's QK and V routes. "
    lines += ["", note + "s/run: train.py's time for one run (evals included).", ""]
    scores = score_table(results)
    if scores:
        lines += ["Downstream tasks (eval.py, lm-evaluation-harness) on each run's checkpoint:", "", scores, "",
                  "Each score: mean ± std over seeds; Δ: paired, per seed run − reference, mean ± std; wins: seeds "
                  "where the run scores better (↑ higher, ↓ lower).", ""]
    for key, title in (("val_loss", "val loss of every run, mean over seeds"),
                       ("max_weight_by_depth", "max routing weight by depth, attnres vs delta")):
        lines += [f"![{title}{' at ' + pt if pt else ''}]({file})" for pt, file in figures.get(key, {}).items()]
        lines += [""] if figures.get(key) else []
    routing = figures.get("routing", {})
    if routing:
        lines.append("Depth routing at the final eval (rows: the route's sublayer; columns: its sources; mean weight):")
        lines.append("")
        width = "49%" if len(routing) > 1 else "70%"
        lines += [f'<img src="{file}" alt="routing of {name}" width="{width}">' for name, file in routing.items()]
        lines.append("")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# results.json, results.md and the pictures (figures.py draws them)

UNNAMED = "a machine its log does not name"


def with_machines(records, trained, here):
    """records with every run's machine: the one its log names, else `here` (this machine) if this
    command trained it (trained: its (name, seed) pairs), else UNNAMED: a kept run's machine is not guessed."""
    return {name: {seed: dict(r, machine=r.get("machine") or (here if (name, seed) in trained else UNNAMED))
                   for seed, r in by_seed.items()} for name, by_seed in records.items()}


def trained_on(runs, all_here, here):
    """Where the runs trained, for results.md's first line: `here`, this machine in full (cores, torch
    threads, runs at a time), when this command trained every run (all_here) on one machine; else the
    machine(s) the runs' logs name, so that a report written on another computer does not relabel them."""
    machines = list(runs_by_machine(runs))
    if all_here and len(machines) <= 1:
        return here
    return machines[0] if len(machines) == 1 else f"{len(machines)} machines: {'; '.join(machines)}"


def write_results(compare_dir, records, names, seeds, meta, publish=None, trained=()):
    """results.json, results.md and the pictures in compare_dir (and a copy in publish, if given).
    Per sweep value a val loss and a max-weight picture; with a sweep, the two sweep pictures.
    meta: the command, max_iters and `machine`, this one's; trained: the (name, seed) runs this command
    trained on it (the others finished before, maybe elsewhere: their logs say where)."""
    compare_dir, trained = Path(compare_dir), set(trained)
    compare_dir.mkdir(parents=True, exist_ok=True)
    records = with_machines(records, trained, meta["machine"])
    runs = aggregate(records, names)
    all_here = all((name, seed) in trained for name, by_seed in records.items() for seed in by_seed)
    points = list(dict.fromkeys(split_point(n)[0] for n in names))
    suffix = lambda point: f"_{slug(point)}" if point else ""
    figures = {"val_loss": {}, "max_weight_by_depth": {}, "routing": {}}
    deepest = {}
    for point in points:
        here = [n for n in names if split_point(n)[0] == point]
        file = f"val_loss{suffix(point)}.png"
        if plot_val_loss(records, here, compare_dir / file):
            figures["val_loss"][point] = file
        summaries = {n: runs[n]["routing"] for n in here if runs[n]["routing"]}
        file = f"max_weight_by_depth{suffix(point)}.png"
        if plot_max_weight(summaries, compare_dir / file):
            figures["max_weight_by_depth"][point] = file
        for name, summary in summaries.items():
            plot_routing(name, summary, compare_dir / f"routing_{slug(name)}.png")
            figures["routing"][name] = f"routing_{slug(name)}.png"
            deepest.setdefault(point, summary["deepest"])
    results = dict(meta, machine=trained_on(runs, all_here, meta["machine"]), seeds=list(seeds), reference=REFERENCE,
                   points=points, deepest=deepest, figures=figures,
                   commits=sorted({c for r in runs.values() for c in r["commits"]}), runs=runs)
    if points != [""]:
        plot_sweep(results, compare_dir / "sweep_val_loss.png")
        figures["sweep_val_loss"] = "sweep_val_loss.png"
        if deepest:
            plot_sweep_max_weight(results, compare_dir / "sweep_max_weight.png")
            figures["sweep_max_weight"] = "sweep_max_weight.png"
    (compare_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (compare_dir / "results.md").write_text(markdown(results) + "\n")
    if publish:
        publish = Path(publish)
        publish.mkdir(parents=True, exist_ok=True)
        files = [figures.get("sweep_val_loss"), figures.get("sweep_max_weight"), *figures["val_loss"].values(),
                 *figures["max_weight_by_depth"].values(), *figures["routing"].values()]
        for file in filter(None, files):
            shutil.copyfile(compare_dir / file, publish / file)
        for file in ("results.json", "results.md"):
            shutil.copyfile(compare_dir / file, publish / file)
    return results


# -----------------------------------------------------------------------------
# the command line and the training loop

def parse_args(argv):
    """(config file or None, compare.py's own options, the --key=value list for train.py). Both are read
    by train.py's configurator, so a bad key or value is the same one-line error, before any training."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        sys.exit(0)
    own = [a for a in argv if a.startswith("--") and a[2:].partition("=")[0] in OPTIONS]
    rest = [a for a in argv if a not in own]
    options, _ = configurator.configure(OPTIONS, own, __file__)
    configs = [a for a in rest if not a.startswith("--")]
    if len(configs) > 1:
        raise ValueError(f"one config file only, got {' and '.join(configs)}")
    for arg in rest:
        key = arg[2:].partition("=")[0]
        if arg.startswith("--") and (key in RUN_KEYS or key == "seed"):
            raise ValueError(f"--{key} is set by each run; choose runs with --runs (e.g. --runs=delta/res_blocks=2,dlr/rank=16)"
                             if key != "seed" else "--seed: use --seeds=N, the runs use seeds 0..N-1")
    settings = configurator.configure(TRAIN_DEFAULTS, rest, str(TRAIN))[0]  # train.py's keys and values, checked now
    for key, value in NOT_PASSED_ON.items():  # (a config file may set them too)
        if settings[key] == value:
            given = (f"--{key}={value}" if any(a.startswith(f"--{key}=") for a in rest)
                     else f"{key}={value!r} in {configs[0]}")
            raise ValueError(f"{given}: {TRAINS_ITSELF}: drop it")
    for key in ("seeds", "jobs"):
        if options[key] < 1:
            raise ValueError(f"--{key}={options[key]}: use a positive integer")
    if options["eval_limit"] < 0:
        raise ValueError(f"--eval_limit={options['eval_limit']}: use a positive number of examples, or 0 for all")
    for key in ("eval_limit", "eval_include_path"):  # (without tasks nothing is scored: the option would do nothing)
        if options[key] and not options["eval_tasks"]:
            raise ValueError(f"--{key} says how --eval_tasks scores the runs: add --eval_tasks=T,U or drop it")
    if options["eval_tasks"] and not eval_task_names(options):
        raise ValueError(f"--eval_tasks={options['eval_tasks']} names no task: give one or more, e.g. --eval_tasks=hellaswag,piqa")
    if options["eval_tasks"] and importlib.util.find_spec("lm_eval") is None:  # before any training, not after it
        raise ValueError("--eval_tasks scores the runs with lm-evaluation-harness, which is not installed: pip install lm-eval")
    if options["sweep"]:
        key, sep, values = options["sweep"].partition("=")
        values = [v for v in values.split(",") if v]
        if not sep or not values:
            raise ValueError(f"--sweep={options['sweep']}: use --sweep=key=value,value,... e.g. --sweep=n_layer=4,8,16")
        if any("/" in v for v in values):  # (the value starts each run's name and folder: runs/key=value/<run>)
            raise ValueError(f"--sweep={options['sweep']}: a value with a '/' cannot name the runs' folders: give values "
                             "without one (a dataset by its folder name in data/)")
        if key in RUN_KEYS or key in ("seed", "out_dir"):
            raise ValueError(f"--sweep: {key} cannot be swept (each run or --seeds sets it, or it is where the grid lives)")
        if key not in TRAIN_DEFAULTS:
            raise ValueError(f"--sweep: {key} is not a train.py key (python train.py --help lists them)")
        if any(a[2:].partition("=")[0] == key for a in rest):
            raise ValueError(f"--{key} is swept: give its values in --sweep only")
        configurator.configure(TRAIN_DEFAULTS, [f"--{key}={v}" for v in values], str(TRAIN))  # each value checked
        parsed = [configurator.read_value(key, v, TRAIN_DEFAULTS) for v in values]
        if key in NOT_PASSED_ON and NOT_PASSED_ON[key] in parsed:
            raise ValueError(f"--sweep={options['sweep']} has {key}={NOT_PASSED_ON[key]}, but {TRAINS_ITSELF}: drop that value")
        for i, value in enumerate(parsed):  # a value twice would train its runs twice, at once in one folder with --jobs
            if value in parsed[:i]:
                raise ValueError(f"--sweep={options['sweep']}: {values[parsed.index(value)]} and {values[i]} are "
                                 "the same value: give each value once")
        options["sweep"] = (key, values)
    return (configs[0] if configs else None), options, [a for a in rest if a.startswith("--")]


def train_settings(config, passthrough):
    """train.py's settings for a run: its defaults, the config file's, then the command line's, read
    as train.py reads them. compare.py needs out_dir, max_iters, eval_interval and eval_iters."""
    return configurator.configure(TRAIN_DEFAULTS, ([config] if config else []) + passthrough, str(TRAIN))[0]


def train_command(config, run_dir, seed, name, passthrough):
    """The train.py command line of run `name` at `seed`, writing in run_dir: the run's own settings come
    before the command line's (passthrough), which may override none of them (parse_args refuses it)."""
    settings = run_settings(name)
    return ([sys.executable, str(TRAIN)] + ([config] if config else []) +
            [f"--out_dir={run_dir}", f"--seed={seed}", f"--wandb_run_name={name}/seed{seed}"] +
            [f"--{k}={v}" for k, v in settings.items()] + passthrough)


def train_args(config, run_dir, seed, name, passthrough):
    """What makes a run what it is: its train.py arguments, less where it writes and where it reports
    (out_dir, wandb_*: they change nothing it computes). Kept in train_args.json."""
    return [a for a in train_command(config, run_dir, seed, name, passthrough)[2:]
            if not a.startswith(("--out_dir=", "--wandb_"))]


def arg_settings(args):
    """The settings train.py arguments stand for, read left to right as train.py reads them: its defaults,
    then each config file's settings and each --key=value. So the same flags in another order, 1e-3 and
    0.001, or a flag that repeats what the config file says, are one run. A key train.py no longer has, or
    a value it would refuse, is kept as written: it differs from anything the grid gives now."""
    settings = dict(TRAIN_DEFAULTS)
    for arg in args:
        if not arg.startswith("--"):  # a config file (differing_args reads only the grid's own, which exists)
            values, given = configurator.configure(TRAIN_DEFAULTS, [arg], str(TRAIN))
            settings.update({k: values[k] for k in given})
            continue
        key, _, text = arg[2:].partition("=")
        try:
            settings[key] = configurator.read_value(key, text, TRAIN_DEFAULTS)
        except (KeyError, ValueError, SyntaxError):  # (kept as written: see above)
            settings[key] = text
    return settings


def differing_args(old, new):
    """What two lists of a run's train.py arguments (train_args.json's) set differently, as
    ['max_iters=40000 (now 50000)', ...]; [] where they stand for the same settings. Config files are
    compared by name (config/x.py and ./config/x.py are one file): what a file says, a finished run's log
    tells (changed_setting)."""
    files = [" ".join(os.path.normpath(a) for a in args if not a.startswith("--")) or "none" for args in (old, new)]
    if files[0] != files[1]:
        return [f"config file {files[0]} (now {files[1]})"]
    was, now = arg_settings(old), arg_settings(new)
    shown = lambda settings, key: repr(settings[key]) if key in settings else "unset"
    return [f"{key}={shown(was, key)} (now {shown(now, key)})" for key in sorted(was.keys() | now.keys())
            if key not in was or key not in now or was[key] != now[key]]


def changed_setting(config, run_dir, seed, name, passthrough, remedy):
    """(key, value trained with, value now, what gives it now) for the first setting the grid gives this
    run (the config file's, the run's own: its name and seed, the command line's) that the finished run in
    run_dir did not train with, else None. Its log's start line records every setting it trained with,
    whether or not it has a train_args.json (a run trained before compare.py wrote one has none), and what
    the config file said then. Not compared: where it wrote and reported (out_dir, wandb_*), and what the
    log records resolved, not as given: the device (auto -> cpu; a run may finish on another machine),
    dtype=auto and vocab_size=0 (the data's). A start line without its settings, or with a compared one
    not of train.py's type (a log edited by hand), is a ValueError that names the log, ending in remedy."""
    start = next((e for e in read_log(run_dir) if e.get("event") == "start"), None)
    if not start:
        return None

    def damaged(problem):  # one line, as load_records says of a log the tables cannot read
        return ValueError(f"{run_dir / 'log.jsonl'} is damaged ({problem}): {remedy}")
    trained = start.get("config")
    if not isinstance(trained, dict):  # train.py writes every setting there
        raise damaged("its start event has no config" if trained is None else
                      f"its start event has config={trained!r}, not train.py's settings")
    own = [f"--seed={seed}", *[f"--{k}={v}" for k, v in run_settings(name).items()]]
    given = {}  # key -> what sets it, the last of the config file, the run and the command line
    for where, args in ((str(config), [config] if config else []), (f"the run {name} seed{seed}", own),
                        ("the command line", passthrough)):
        given.update(dict.fromkeys(configurator.configure(TRAIN_DEFAULTS, args, str(TRAIN))[1], where))
    now = train_settings(config, own + passthrough)
    for key in sorted(given):
        value = json.loads(json.dumps(now[key]))  # as the log holds it
        resolved = (key in ("out_dir", "device") or key.startswith("wandb_") or (key == "dtype" and value == "auto")
                    or (key == "vocab_size" and value == 0))
        if key not in trained or resolved:
            continue
        if not configurator.same_kind(trained[key], TRAIN_DEFAULTS[key]):  # else "trained with '10', now 10"
            raise damaged(f"its start event's config has {key}={trained[key]!r}, not "
                          f"{configurator.KINDS[type(TRAIN_DEFAULTS[key])]}")
        if trained[key] != value:
            return key, trained[key], value, given[key]
    return None


def check_finished(config, run_dir, seed, name, passthrough, args, publish):
    """A ValueError, saying how to retrain it, where the finished run in run_dir trained with other settings
    than the grid gives it now: other train.py arguments (train_args.json, args: the grid's) or, whether or
    not it has that file, another setting its log records (changed_setting), or where its log's record of
    them is damaged."""
    published = Path(publish) / "runs" / name / f"seed{seed}" if publish else None
    folders = " and ".join(map(str, dict.fromkeys([run_dir] + ([published] if published and published.exists() else []))))
    retrain = f"use another --out_dir{' and --publish folder' if publish else ''}, or delete {folders} to retrain it"
    if (run_dir / "train_args.json").exists():
        began = read_train_args(run_dir / "train_args.json", f"delete it to have the run checked against its log, or {retrain}")
        differ = differing_args(began, args)
        if differ:
            raise ValueError(f"{run_dir} finished with other train.py arguments ({'; '.join(differ)}): {retrain}")
    changed = changed_setting(config, run_dir, seed, name, passthrough,
                              f"delete {folders} and run the grid's command again to retrain the run")
    if changed:
        key, trained, now, where = changed
        raise ValueError(f"{run_dir} finished with {key}={trained!r}, but {where} now gives {key}={now!r}: {retrain}")


def still_training(run_dir):
    """Whether a train.py runs in run_dir now (it holds the folder's lock): one this grid runs from another
    terminal, or one that a compare.py killed outright (kill -9) left running."""
    return run_dir.is_dir() and lock_folder(run_dir, hold=False) is False


def writable(folder, option):
    """A ValueError unless files can be written in folder, checked without making it (a mistyped out_dir
    with --report=True leaves nothing behind)."""
    problem = cannot_write(Path(folder).absolute() / ".probe")  # (a name no file here has: only the folder is asked about)
    if problem:
        raise ValueError(f"cannot write {Path(folder).absolute()} (--{option}): {problem}; give --{option} a folder "
                         "you can write")


def outside(publish, compare_dir):
    """A ValueError unless --publish lies outside the grid's own folder: there its copies would be the very
    files they copy (an error after the whole grid has trained, and again at every rerun). Resolved, so a
    relative path or a symlink into it is caught too."""
    where, compare_dir = Path(publish).resolve(), compare_dir.resolve()
    if where == compare_dir or compare_dir in where.parents:
        raise ValueError(f"--publish={publish} is in the grid's own folder {compare_dir}, where it writes its runs and "
                         "results: publish them elsewhere, e.g. --publish=docs/compare/<grid>")


def run_env(jobs):
    """The train.py processes' environment: this one's, with one torch thread each when several run at
    once on a machine's cores (unless OMP_NUM_THREADS says otherwise)."""
    env = dict(os.environ)
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def visible_gpus(env):
    """The GPUs the runs share: those CUDA_VISIBLE_DEVICES lists where it is set, else every GPU torch sees."""
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())]


def slot_env(env, slot, gpus):
    """The environment of the run in job slot `slot`: with several GPUs, each slot takes its own
    (slot modulo their number; the run's "cuda" is that GPU), rather than every run on GPU 0."""
    if len(gpus) < 2:
        return env
    return {**env, "CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)]}


def launch(cmd, run_dir, env, append=False):
    """Start train.py, its output in run_dir/train.log (append: after a stopped run's own output)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "train.log", "a" if append else "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def code_digest(config):
    """sha256 of what a run trains with besides its arguments: the repository's Python files (committed or
    not) and its config file. A run is one code's: it continues only under the digest it started with."""
    digest = hashlib.sha256()
    for path in sorted(TRAIN.parent.glob("*.py")) + ([Path(config)] if config else []):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def resumable(run_dir, args, code):
    """Whether an unfinished run continues from its checkpoint (a run stopped by Ctrl-C saves one; a killed
    one has its last evaluation's) rather than starts over, as it does where it has none. A checkpoint is
    work: one the grid cannot continue, begun with other train.py settings (train_args.json, whatever order
    they came in) or other code (code_digest), is a ValueError that says what differs and what to do,
    never deleted."""
    if not (run_dir / "ckpt.pt").exists():
        return False
    remedy = f"to train it anew, delete or move {run_dir} yourself (compare.py never deletes a checkpoint)"
    old = read_train_args(run_dir / "train_args.json", remedy)
    differ = differing_args(old, args)
    if differ:
        raise ValueError(f"{run_dir} holds a checkpoint of a run begun with other train.py settings: {'; '.join(differ)}. "
                         f"To continue it, run the grid with its settings again; {remedy}")
    try:
        began = (run_dir / "code.sha256").read_text().strip()
    except OSError:
        began = None
    if began != code:
        why = ("the repository's .py files or the config file changed since it began" if began is not None
               else f"{run_dir / 'code.sha256'} is missing: the code it began with is unknown")
        raise ValueError(f"{run_dir} holds a checkpoint that cannot continue under this code ({why}; a run continues "
                         f"only with its own code). To continue it, go back to that code; {remedy}")
    return True


def failure(cmd, run_dir, rc, log="train.log"):
    """The RuntimeError for a train.py (or eval.py) that exited with rc: the end of its log, its command."""
    tail = (run_dir / log).read_text().splitlines()[-15:]
    resumed = ("\nit continued the run from its checkpoint: delete the folder to train it from the start"
               if "--init_from=resume" in cmd else "")
    return RuntimeError(f"{Path(cmd[1]).name} failed (exit code {rc}); the end of {run_dir / log}:\n  " + "\n  ".join(tail)
                        + f"\ncommand: {' '.join(cmd)}" + resumed)


def train_probe(cmd, run_dir, env=None):
    """Run a timing probe's train.py to the end; its wall time in seconds (failure()'s RuntimeError if it fails)."""
    t0 = time.time()
    proc = launch(cmd, run_dir, env)
    try:
        rc = proc.wait()
    except BaseException:  # Ctrl-C or SIGTERM: a probe is no run to keep, and must not outlive the grid (and its folder)
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        raise failure(cmd, run_dir, rc)
    return time.time() - t0


def finish_time(running_left, queued, jobs):
    """Seconds until the last run ends: the running runs' remaining times, then each queued run (in
    order) on whichever of the jobs slots frees first."""
    slots = sorted(list(running_left) + [0.0] * (jobs - len(running_left)))
    for seconds in queued:
        heapq.heappush(slots, heapq.heappop(slots) + seconds)
    return max(slots, default=0.0)


def publish_run(run_dir, dest):
    """A finished run into the published folder: its train_args.json, its scores (if eval.py scored it)
    and its log.jsonl without the per-iteration `train` lines (what compare.py reads: the start, evals
    and done; a few KB, not MB)."""
    dest.mkdir(parents=True, exist_ok=True)
    for file in (run_dir / "train_args.json", eval_file(run_dir)):
        if file.exists():  # a run trained before compare.py wrote train_args.json has none
            shutil.copyfile(file, dest / file.name)
    kept = [line for line in (run_dir / "log.jsonl").read_text().splitlines() if '"event": "train"' not in line]
    tmp = dest / "log.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(dest / "log.jsonl")  # a published log is whole or absent: its `done` line means finished


def publish_runs(plan, runs_dir, publish):
    """Every finished run of the plan into publish/runs, not only those this command trained: a run an
    earlier command finished (or another grid sharing the out_dir, e.g. the standard runs) belongs to
    this grid's results too. A run published before keeps its log; its scores are copied if they changed."""
    for name, seed in plan:
        run_dir, dest = runs_dir / name / f"seed{seed}", Path(publish) / "runs" / name / f"seed{seed}"
        if not finished(read_log(run_dir)):
            continue
        if not finished(read_log(dest)):
            publish_run(run_dir, dest)
        elif eval_file(run_dir).exists() and (not eval_file(dest).exists()
                                              or eval_file(dest).read_bytes() != eval_file(run_dir).read_bytes()):
            shutil.copyfile(eval_file(run_dir), eval_file(dest))


def estimate_run_s(config, name, passthrough, env):
    """Seconds for one run, from a PROBE_ITERS-iteration timing run of train.py: its startup, plus
    max_iters training steps at the measured ms/iter, plus the evals (a forward costs ~1/3 of a step)."""
    settings = train_settings(config, passthrough + [f"--{k}={v}" for k, v in run_settings(name).items()])
    with tempfile.TemporaryDirectory() as tmp:
        probe = [f"--max_iters={PROBE_ITERS}", f"--eval_interval={PROBE_ITERS}", "--eval_iters=1", "--log_interval=1",
                 "--wandb_log=False"]  # a probe is no run to report
        cmd = train_command(config, tmp, 0, name, passthrough + probe)
        try:
            wall = train_probe(cmd, Path(tmp), env)
        except RuntimeError:
            last = ((Path(tmp) / "train.log").read_text().splitlines() or [""])[-1]
            if last.startswith("error: "):  # train.py refused the run's settings: its one line, not a log about to go
                raise ValueError(f"run {name}: {last.removeprefix('error: ')}") from None
            raise
        ms = [e["ms_per_iter"] for e in read_log(tmp) if e.get("event") == "train"][1:]  # the first step warms up
    step_s = statistics.median(ms) / 1000 if ms else wall / PROBE_ITERS
    max_iters, eval_interval, eval_iters = (settings[k] for k in ("max_iters", "eval_interval", "eval_iters"))
    eval_steps = (max_iters // eval_interval + 1) * 2 * eval_iters / 3
    return max(wall - PROBE_ITERS * step_s, 0) + (max_iters + eval_steps) * step_s


def eval_task_names(options):
    """--eval_tasks as a list, each task once, as eval.py reads (and records) its --tasks."""
    return list(dict.fromkeys(t for t in options["eval_tasks"].split(",") if t))


def check_tasks(tasks, include_path):
    """eval.py's own check of its task names and --include_path, made before the grid trains: found by
    eval.py after it, a mistyped task would cost the whole grid's training first. A ValueError with
    eval.py's message, its option named as compare.py's."""
    from eval import task_manager  # (lm-eval is installed: parse_args checked)
    try:
        task_manager(tasks, include_path or None)
    except ValueError as e:
        raise ValueError(str(e).replace("--include_path=", "--eval_include_path=")) from None


def evaluated(run_dir, tasks, limit):
    """Whether the run holds eval.py's scores for exactly these tasks and limit (None: all examples); a
    file that is not eval.py's (eval_record refuses it) holds none: eval.py scores the run again."""
    try:
        record, _ = eval_record(run_dir)
    except (OSError, ValueError):
        return False
    return record is not None and record.get("tasks") == tasks and record.get("limit") == limit  # (a dict: it has scores)


def to_score(plan, runs_dir, options):
    """(the runs of the plan finished here, those of them eval.py has not scored on options' tasks and limit)."""
    tasks, limit = eval_task_names(options), options["eval_limit"] or None
    runs = [(n, s) for n, s in plan if finished(read_log(runs_dir / n / f"seed{s}"))]
    return runs, [(n, s) for n, s in runs if not evaluated(runs_dir / n / f"seed{s}", tasks, limit)]


def evaluate_runs(plan, runs_dir, options, env, publish):
    """eval.py on the checkpoint of every finished run of the plan not yet scored on options' tasks, one
    run at a time (eval.py batches its work itself), its output in run_dir/eval.log; a published run gets
    its scores published beside its log."""
    tasks, limit = eval_task_names(options), options["eval_limit"] or None
    runs, todo = to_score(plan, runs_dir, options)
    if todo:
        print(f"scoring {len(todo)} runs on {', '.join(tasks)} with eval.py ({len(runs) - len(todo)} scored before)", flush=True)
    for k, (name, seed) in enumerate(todo, 1):
        run_dir = runs_dir / name / f"seed{seed}"
        if not (run_dir / "ckpt.pt").exists():
            raise RuntimeError(f"{run_dir} has no ckpt.pt to score (a run taken from --publish brings only its log and "
                               "scores): drop --eval_tasks, or delete the run folder to train it here")
        cmd = [sys.executable, str(EVAL), f"--ckpt={run_dir / 'ckpt.pt'}", f"--tasks={','.join(tasks)}",
               *([f"--limit={limit}"] if limit else []),
               *([f"--include_path={options['eval_include_path']}"] if options["eval_include_path"] else [])]
        with open(run_dir / "eval.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0:
            raise failure(cmd, run_dir, rc, "eval.log")
        if publish:
            dest = Path(publish) / "runs" / name / f"seed{seed}"
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(eval_file(run_dir), dest / eval_file(run_dir).name)
        scores = ", ".join(f"{m} {v:.4f}" for m, (v, _) in read_scores(run_dir).items())
        print(f"[eval {k}/{len(todo)}] {name} seed{seed}: {scores}", flush=True)


def machine(env, jobs):
    """A line about this computer for results.md: CPU (or GPU), cores, torch threads per run, torch version."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = int(env.get("OMP_NUM_THREADS") or torch.get_num_threads())  # what each train.py gets
    runs = f", {jobs} runs at a time" if jobs > 1 else ""
    return (f"{cpu} ({os.cpu_count()} cores, torch on {threads} thread{'s' * (threads > 1)}{runs}){gpu}, "
            f"torch {torch.__version__}")


def main(argv):
    config, options, passthrough = parse_args(argv)
    settings = train_settings(config, passthrough)
    sweep, jobs, publish = options["sweep"], options["jobs"], options["publish"]
    names = select_runs(options["runs"], sweep)
    seeds = list(range(options["seeds"]))
    compare_dir = Path(settings["out_dir"]) / "compare"
    runs_dir = compare_dir / "runs"
    passthrough = [a for a in passthrough if not a.startswith("--out_dir=")]
    # with wandb_log=True the grid's runs form one wandb group, named after its out_dir (a --wandb_group wins)
    passthrough = [f"--wandb_group={Path(settings['out_dir']).resolve().name}", *passthrough]
    env = run_env(jobs)
    gpus = visible_gpus(env)
    writable(compare_dir, "out_dir")  # now, not after a timing probe or hours of training
    if publish:  # (inside first: a link into the grid's folder, not made yet, is a link to nowhere until it is)
        outside(publish, compare_dir)
        writable(publish, "publish")

    # value by value, seed by seed: each value's comparison completes before the next (costlier) one starts
    points = list(dict.fromkeys(split_point(n)[0] for n in names))
    plan = [(n, seed) for pt in points for seed in seeds for n in names if split_point(n)[0] == pt]
    # the tasks are checked before anything trains or is taken from --publish (a misspelt one found by eval.py
    # would cost the grid's training first), unless every run has finished and is scored on them (nothing is left
    # to score): lm-eval's task index takes 10-20 s
    if options["eval_tasks"] and not options["report"] and to_score(plan, runs_dir, options) != (plan, []):
        check_tasks(eval_task_names(options), options["eval_include_path"])
    if publish:  # a run finished elsewhere and published is taken as it is, never trained twice
        pairs = [(name, seed, runs_dir / name / f"seed{seed}", Path(publish) / "runs" / name / f"seed{seed}")
                 for name, seed in plan]
        taken = [(name, seed, local, published) for name, seed, local, published in pairs
                 if not finished(read_log(local)) and finished(read_log(published))]
        for name, seed, local, published in taken:  # all checked before any is taken: a checkpoint is never deleted
            if (local / "ckpt.pt").exists() or still_training(local):
                raise ValueError(f"{local} holds an unfinished run, and {published} has the run finished: stop it if it "
                                 f"runs, then delete {local} to take the published run, or rerun without --publish to "
                                 "continue it")
            check_finished(config, published, seed, name, passthrough, train_args(config, local, seed, name, passthrough),
                           publish)  # one the grid would refuse is not copied in first
        for *_, local, published in taken:
            shutil.rmtree(local, ignore_errors=True)  # what a run leaves before its first checkpoint: a log, its arguments
            shutil.copytree(published, local)
    todo = [(n, s) for n, s in plan if not finished(read_log(runs_dir / n / f"seed{s}"))]
    if options["report"] and len(todo) == len(plan):
        raise ValueError(f"no finished run in {runs_dir} to report: train the grid first (the same command "
                         "without --report=True), or check --out_dir")
    code = code_digest(config)
    for name, seed in plan:  # a run begun or finished with other settings would not be comparable
        run_dir = runs_dir / name / f"seed{seed}"
        args = train_args(config, run_dir, seed, name, passthrough)
        if (name, seed) not in todo:
            check_finished(config, run_dir, seed, name, passthrough, args, publish)
        elif not options["report"]:
            resumable(run_dir, args, code)  # a checkpoint the grid cannot continue stops it now, before any run
            if still_training(run_dir):  # never its folder deleted under it, nor a second train.py started there
                raise ValueError(f"a train.py is still running in {run_dir} (one an earlier compare.py, killed, left "
                                 "running?): let it finish or stop it, then run the same command again")
    # a finished run's log or scores the tables cannot read stops the grid now, not after its training (with
    # --eval_tasks, eval.py scores again a run whose scores file is damaged: not read here)
    scoring = options["eval_tasks"] and not options["report"]
    load_records(runs_dir, names, seeds, publish, scores=not scoring, report=options["report"])
    print(f"{len(plan)} runs ({len(names)} x {len(seeds)} seeds) in {compare_dir}: {len(plan) - len(todo)} done, "
          f"{len(todo)} to train" + (f", {jobs} at a time" if jobs > 1 and todo and not options["report"] else ""), flush=True)
    if options["report"]:
        todo = []
    trained = list(todo)  # what this command trains, on this machine (the others finished before, maybe elsewhere)

    # expected time: finished runs' times where there are some, else a short timing probe of train.py
    known = {}
    for name, seed in plan:
        done = finished(read_log(runs_dir / name / f"seed{seed}"))
        if done and done.get("elapsed_s"):
            known.setdefault(name, []).append(done["elapsed_s"])
    estimate = {n: statistics.fmean(t) for n, t in known.items()}
    for name in dict.fromkeys(n for n, _ in todo):
        if name not in estimate:
            estimate[name] = estimate_run_s(config, name, passthrough, env)
            print(f"  timing probe ({PROBE_ITERS} iterations): {name} ~{hms(estimate[name])} per run", flush=True)
    if todo:
        source = " and ".join(filter(None, ["finished runs" * bool(known), "timing probes" * (len(known) < len(estimate))]))
        eta = finish_time([], [estimate[n] for n, _ in todo], jobs)
        print(f"expected time: ~{hms(eta)} (from {source}; updated after every run)", flush=True)

    # up to `jobs` train.py processes at once; a failure lets the others finish, then ends the grid
    queue, running, measured, errors, n_done = list(todo), {}, {}, [], 0
    try:
        while running or (queue and not errors):  # after a failure: let the running finish, start nothing
            while queue and len(running) < jobs and not errors:
                name, seed = queue.pop(0)
                slot = min(set(range(jobs)) - {slot for *_, slot in running.values()})
                run_dir = runs_dir / name / f"seed{seed}"
                cmd, args = train_command(config, run_dir, seed, name, passthrough), train_args(config, run_dir, seed, name, passthrough)
                resumed = resumable(run_dir, args, code)
                if resumed:  # stopped (Ctrl-C) or killed after a checkpoint: train.py continues it exactly
                    cmd = cmd + ["--init_from=resume"]
                else:  # no checkpoint (resumable raises for one it cannot continue): at most a log to start over from
                    shutil.rmtree(run_dir, ignore_errors=True)
                    run_dir.mkdir(parents=True)
                    (run_dir / "train_args.json").write_text(json.dumps(args) + "\n")
                    (run_dir / "code.sha256").write_text(code + "\n")
                running[(name, seed)] = (launch(cmd, run_dir, slot_env(env, slot, gpus), append=resumed), cmd, time.time(), slot)
            time.sleep(0.2)
            for (name, seed), (proc, cmd, t0, _) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[(name, seed)]
                run_dir = runs_dir / name / f"seed{seed}"
                if proc.returncode != 0:
                    errors.append(failure(cmd, run_dir, proc.returncode))
                    continue
                wall = time.time() - t0
                if "--init_from=resume" in cmd:  # this process's time is part of the run's: its log has the whole
                    wall = finished(read_log(run_dir))["elapsed_s"]
                measured.setdefault(name, []).append(wall)
                estimate[name] = statistics.fmean(measured[name])
                if publish:
                    publish_run(run_dir, Path(publish) / "runs" / name / f"seed{seed}")
                n_done += 1
                now = time.time()
                eta = finish_time([max(estimate[n] - (now - t), 0) for (n, _), (_, _, t, _) in running.items()],
                                  [estimate[n] for n, _ in queue] if not errors else [], jobs)
                val = finished(read_log(run_dir))["val_loss"]
                print(f"[{n_done}/{len(todo)}] {name} seed{seed}: val loss {val:.4f} in {hms(wall)}; ETA {hms(eta)}", flush=True)
    except BaseException:  # Ctrl-C, SIGTERM (or an error here): each running train.py stops at its next log line with a checkpoint
        for proc, *_ in running.values():
            if os.name != "nt":  # (on Windows the console sends Ctrl-C to every process itself)
                # SIGTERM, not SIGINT: a grid started in the background (nohup ... &) has SIGINT ignored, and so has train.py;
                # train.py stops on either the same way (and takes the terminal's signal and this one as one request)
                proc.send_signal(signal.SIGTERM)
        for proc, *_ in running.values():
            proc.wait()
        raise
    if errors:
        raise errors[0]
    if options["eval_tasks"] and not options["report"]:
        evaluate_runs(plan, runs_dir, options, env, publish)
    if publish:  # every finished run, the ones an earlier command trained too: the published results are made of them
        publish_runs(plan, runs_dir, publish)

    records = load_records(runs_dir, names, seeds, publish, report=options["report"])
    command = "python compare.py " + " ".join(a for a in argv if not a.startswith("--report="))  # the command that trains them
    max_iters = settings["max_iters"] if not sweep or sweep[0] != "max_iters" else "/".join(sweep[1])
    results = write_results(compare_dir, records, names, seeds,
                            dict(command=command, machine=machine(env, jobs), max_iters=max_iters), publish, trained)
    print(f"wrote {compare_dir / 'results.md'}" + (f" and {publish}/" if publish else ""))
    print(table(results))
    if score_table(results):
        print("\n" + score_table(results))
    return results


if __name__ == "__main__":
    # a scheduler's or `kill`'s SIGTERM stops the grid as Ctrl-C does: without this, compare.py would die at once
    # and leave its train.py processes running, unwatched, in the folders a rerun would train in too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        main(sys.argv[1:])
    except (ValueError, RuntimeError) as e:
        die(e)
    except OSError as e:  # a file that cannot be written or read mid-grid (a full disk, a lost mount); finished runs are kept
        die(f"{e.strerror or e}: {e.filename}: fix that, then run the same command again to resume the grid"
            if e.filename else f"{e}: fix that, then run the same command again to resume the grid")
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept, running ones stop with a checkpoint; run the same command "
              "again to resume", file=sys.stderr)
        sys.exit(130)
