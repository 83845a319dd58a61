"""
The papers' comparison in one command: a grid of training runs that differ only in their
residual connections (or their linears), N paired seeds each, one table and a few pictures.

    python compare.py config/train_shakespeare_char.py --seeds=3                 # the residual grid
    python compare.py config/train_shakespeare_char.py --seeds=3 --runs=lowrank  # dense vs rank 32 vs rank 32 + DLR
    python compare.py config/train_shakespeare_char.py --runs=standard,delta/res_blocks=2 --max_iters=500
    python compare.py config/train_shakespeare_char.py --seeds=3 --runs=residual --publish=docs/compare/residual

Options: --runs (a grid name from GRIDS, or a comma list of run names), --seeds=N (seeds 0..N-1),
--publish=DIR (copy results.md, results.json and the pictures into DIR; that results.md links its images
as DIR/<file>, so it pastes into a README in the current folder). Every other --key=value goes to
train.py, for every run.

A run name is what the run changes: `standard`, `<mode>/res_blocks=N` (attnres, delta, rd),
`lowrank/rank=R` (standard residual, low-rank linears), `dlr/rank=R` (the same plus DLR).
Each run is `python train.py <config> --out_dir=<out_dir>/compare/runs/<name>/seed<k> --seed=<k>
<the run's settings> <your --key=value>`, one at a time. A run whose log.jsonl has a `done` event is
not trained again, so rerunning the command resumes the grid (an unfinished run starts over; a
finished one with other train.py arguments is an error, not a silent mix).

Paired protocol (as in the RD paper): train.py seeds the backbone init and the batch order with
--seed only, so for a given seed every run starts from the same weights and sees the same batches;
only the residual machinery differs. Each run is compared with the `standard` (dense) run of the same
seed, and a DLR run also with its plain low-rank twin.

The train.py processes inherit the environment: on a CPU that other programs share, OMP_NUM_THREADS=1
avoids torch threads waiting on each other (measured: 2 threads on 2 busy cores made the Shakespeare
recipe's steps 6-10x slower than 1 thread).

Output in <out_dir>/compare/: results.md, results.json, val_loss.png, routing_<run>.png (one per
routed run) and max_weight_by_depth.png.
"""

import ast
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from model import RESIDUAL_MODES  # noqa: E402

REFERENCE = "standard"  # every run is compared with the standard (dense) run of the same seed
GRIDS = {
    "residual": ["standard"] + [f"{m}/res_blocks={n}" for m in ("attnres", "delta", "rd") for n in (0, 4)],
    "lowrank": ["standard", "lowrank/rank=32", "dlr/rank=32"],
}
GRIDS["all"] = list(dict.fromkeys(GRIDS["residual"] + GRIDS["lowrank"]))
RUN_KEYS = ("residual", "res_blocks", "lowrank_rank", "dlr")  # set by each run, not on the command line
PROBE_ITERS = 10  # iterations of the timing probe that makes the up-front estimate
TRAIN = Path(__file__).resolve().parent / "train.py"


# -----------------------------------------------------------------------------
# runs: names <-> train.py settings

def run_settings(name):
    """train.py settings of a run, read from its name: `<kind>[/key=value...]`, e.g. 'delta/res_blocks=4',
    'dlr/rank=32'. kind is a residual mode, 'lowrank' or 'dlr'; keys are res_blocks (routed modes) and rank."""
    kind, *parts = name.split("/")
    if kind not in RESIDUAL_MODES + ("lowrank", "dlr"):
        raise ValueError(f"run {name!r}: it must start with one of {', '.join(RESIDUAL_MODES)}, lowrank, dlr")
    routed = kind in RESIDUAL_MODES and kind != "standard"
    settings = dict(residual=kind if kind in RESIDUAL_MODES else "standard", **dict(res_blocks=0) if routed else {},
                    lowrank_rank=0, dlr=kind == "dlr")
    keys = {"res_blocks": "res_blocks", "rank": "lowrank_rank"} if routed else {"rank": "lowrank_rank"}
    for part in parts:
        key, sep, value = part.partition("=")
        if key not in keys or not sep or not value.isdigit():
            raise ValueError(f"run {name!r}: {part!r} is not {' or '.join(k + '=N' for k in keys)} (N an integer)")
        settings[keys[key]] = int(value)
    if kind in ("lowrank", "dlr") and not settings["lowrank_rank"]:
        raise ValueError(f"run {name!r}: {kind} needs a rank, e.g. {kind}/rank=32")
    return settings


def run_name(settings):
    """The canonical name of a run's settings (so 'attnres' and 'attnres/res_blocks=0' are one run)."""
    if settings["residual"] == "standard" and settings["lowrank_rank"]:
        return f"{'dlr' if settings['dlr'] else 'lowrank'}/rank={settings['lowrank_rank']}"
    name = settings["residual"]
    if name != "standard":
        name += f"/res_blocks={settings['res_blocks']}"
    if settings["lowrank_rank"]:
        name += f"/rank={settings['lowrank_rank']}"
    return name


def select_runs(runs):
    """The run names of a grid name or comma list, the reference first and each run once."""
    names = GRIDS[runs] if runs in GRIDS else [n for n in runs.split(",") if n]
    if not names:
        raise ValueError(f"--runs={runs!r} names no runs: use {', '.join(GRIDS)} or a comma list of run names")
    names = [run_name(run_settings(n)) for n in names]
    return list(dict.fromkeys([REFERENCE] + names))  # the reference is always trained: it anchors every comparison


def references(name, names):
    """What a run is compared with: the standard run, and for a DLR run also its plain low-rank twin."""
    if name == REFERENCE:
        return []
    refs = [REFERENCE]
    twin = name.replace("dlr/", "lowrank/", 1)
    if name.startswith("dlr/") and twin in names:
        refs.append(twin)
    return refs


def slug(name):
    """A file-name form of a run name: 'attnres/res_blocks=4' -> 'attnres_res_blocks4'."""
    return name.replace("/", "_").replace("=", "")


# -----------------------------------------------------------------------------
# reading the logs

def read_log(run_dir):
    """The events of run_dir/log.jsonl (an empty list if there is none); a half-written last line is skipped."""
    path = Path(run_dir) / "log.jsonl"
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events


def finished(events):
    """The run's `done` event, or None if it has not finished."""
    return next((e for e in reversed(events) if e.get("event") == "done"), None)


def run_record(events):
    """What the aggregation needs from one finished run's log."""
    done = finished(events)
    evals = [e for e in events if e.get("event") == "eval"]
    routing = evals[-1].get("routing") if evals else None
    return dict(val_loss=done["val_loss"], elapsed_s=done.get("elapsed_s"),
                curve=[(e["iter"], e["val_loss"]) for e in evals], routing=routing or None)


def load_records(runs_dir, names, seeds):
    """{name: {seed: record}} for every finished run of the grid."""
    records = {}
    for name in names:
        for seed in seeds:
            events = read_log(Path(runs_dir) / name / f"seed{seed}")
            if finished(events):
                records.setdefault(name, {})[seed] = run_record(events)
    return records


# -----------------------------------------------------------------------------
# statistics

def mean_std(values):
    """(mean, std with ddof=1); std is None for fewer than two values."""
    values = list(values)
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def paired(run, ref):
    """Paired comparison of two runs over the seeds both finished. run, ref: {seed: val_loss}.
    Per seed: diff = run - ref (nats) and 100 (exp(diff) - 1), the perplexity change in percent;
    then mean and std (ddof=1) over seeds, and wins = seeds where the run's val loss is lower."""
    seeds = sorted(set(run) & set(ref))
    diffs = [run[s] - ref[s] for s in seeds]
    ppl = [100 * math.expm1(d) for d in diffs]
    (d_mean, d_std), (p_mean, p_std) = mean_std(diffs), mean_std(ppl)
    return dict(seeds=seeds, n=len(seeds), diff_nats=diffs, diff_nats_mean=d_mean, diff_nats_std=d_std,
                ppl_pct=ppl, ppl_pct_mean=p_mean, ppl_pct_std=p_std, wins=sum(d < 0 for d in diffs))


def sublayer_routes(routing):
    """The input routes of the sublayers, in depth order ('L0.attn', 'L0.mlp', ...): no value or output routes."""
    return [r for r in routing if r != "out" and not r.endswith(".v")]


def routing_summary(routings):
    """Routing diagnostics of one run, from its final evals' routing (one dict per seed): the per-seed
    max weight and normalised entropy of the deepest sublayer, and the mean QK/V JS divergence (rd),
    averaged over seeds; and the mean depth weights of every route, averaged over seeds."""
    routings = [r for r in routings if r]
    if not routings:
        return None
    deepest = sublayer_routes(routings[0])[-1]
    js = [statistics.fmean(v["js_qk_v"] for v in r.values() if "js_qk_v" in v) for r in routings
          if any("js_qk_v" in v for v in r.values())]
    return dict(deepest=deepest,
                deep_max_weight=statistics.fmean(r[deepest]["max_weight"] for r in routings),
                deep_entropy=statistics.fmean(r[deepest]["entropy"] for r in routings),
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
                         paired={ref: paired(val, {s: r["val_loss"] for s, r in records.get(ref, {}).items()})
                                 for ref in references(name, names)},
                         routing=routing_summary([r["routing"] for r in recs.values()]))
    return out


# -----------------------------------------------------------------------------
# results.md

def fmt(x, digits=4, sign=False):
    return "" if x is None else f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def pm(mean, std, digits=4, sign=False, unit=""):
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


def markdown(results, image_dir):
    """results.md: the table and the pictures, image links under image_dir ('' for next to results.md)."""
    lines = [f"Measured with `{results['command']}`: {results['max_iters']} iterations per run, "
             f"seeds {', '.join(map(str, results['seeds']))}, on {results['machine']}.", "", table(results)]
    note = ("val loss: the final eval's, mean ± std over seeds (std with ddof=1). Δ: paired, per seed run − "
            "reference (same init, same batches), then mean ± std over seeds; Δ perplexity = 100 (exp Δ − 1) %; "
            "wins: seeds where the run's val loss is below the reference's. ")
    if results["deepest"]:
        note += ("Routing at the final eval, averaged over seeds: deep = the last sublayer's input route "
                 f"({results['deepest']}), its max weight (a uniform route over m sources has 1/m) and entropy / "
                 "log m (1 = uniform). ")
    if any((r["routing"] or {}).get("mean_js") is not None for r in results["runs"].values()):
        note += "JS: mean Jensen-Shannon divergence (nats) between rd's QK and V routes. "
    lines += ["", note + "s/run: train.py's time for one run (evals included).", ""]
    img = lambda file: f"{image_dir}/{file}" if image_dir else file
    figures = results["figures"]
    if "val_loss" in figures:
        lines += [f"![val loss of every run, mean over seeds]({img(figures['val_loss'])})", ""]
    if "max_weight_by_depth" in figures:
        lines += [f"![max routing weight by depth, attnres vs delta]({img(figures['max_weight_by_depth'])})", ""]
    routing = figures.get("routing", {})
    if routing:
        lines.append("Depth routing at the final eval (rows: the route's sublayer; columns: its sources; mean weight):")
        lines.append("")
        width = "49%" if len(routing) > 1 else "70%"
        lines += [f'<img src="{img(file)}" alt="routing of {name}" width="{width}">' for name, file in routing.items()]
        lines.append("")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# pictures

COLORS = {"standard": "black", "attnres": "tab:blue", "delta": "tab:red", "rd": "tab:green",
          "lowrank": "tab:purple", "dlr": "tab:orange"}


def line_style(name):
    """Colour by mode (or linear kind), dashed for block routing."""
    kind = name.split("/")[0]
    settings = run_settings(name)
    return dict(color=COLORS[kind], linestyle="--" if settings.get("res_blocks") else "-")


def plot_val_loss(records, names, path):
    """Left: val loss vs iteration, mean over seeds, every run. Right: the paired difference to the
    reference (run - reference on the same seeds), mean over seeds: what the table's Δ is made of."""
    def curves(name):
        return {seed: dict(r["curve"]) for seed, r in records.get(name, {}).items()}
    ref = curves(REFERENCE)
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(11, 4.2))
    low = []
    for name in names:
        runs = curves(name)
        if not runs:
            continue
        iters = sorted(set.intersection(*(set(c) for c in runs.values())))
        mean = [statistics.fmean(c[i] for c in runs.values()) for i in iters]
        n = len(runs)
        ax.plot(iters, mean, label=f"{name} ({n} seed{'s' * (n > 1)})", lw=1.4, **line_style(name))
        low += mean[1:]  # the first eval (at init) would squash the rest of the curve
        seeds = sorted(set(runs) & set(ref))
        if name != REFERENCE and seeds:
            both = [i for i in iters if all(i in ref[s] for s in seeds)]
            diff = [statistics.fmean(runs[s][i] - ref[s][i] for s in seeds) for i in both]
            dax.plot(both, diff, lw=1.4, **line_style(name))
    if not low:
        plt.close(fig)
        return False
    ax.set_ylim(min(low) - 0.02, max(low) + 0.02)
    ax.set_title("val loss (mean over seeds)")
    ax.set_ylabel("val loss (nats)")
    ax.legend(fontsize=7, loc="upper right")
    dax.axhline(0, color=COLORS[REFERENCE], lw=1)
    dax.set_title(f"paired Δ to {REFERENCE}, mean over seeds (< 0: better)")
    dax.set_ylabel("Δ val loss (nats)")
    later = [i for r in records.values() for rec in r.values() for i, _ in rec["curve"] if i > 0]
    for a in (ax, dax):
        if later:
            a.set_xlim(left=min(later))  # leave out the eval at init: every run starts near log(vocab_size)
        a.set_xlabel("iteration")
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def route_order(routes):
    """Heatmap rows: the sublayer routes in depth order, each rd value route under its attention route, 'out' last."""
    rows = []
    for r in sublayer_routes(routes):
        rows.append(r)
        if r + ".v" in routes:
            rows.append(r + ".v")
    return rows + (["out"] if "out" in routes else [])


def plot_routing(name, summary, path):
    """Heatmap of one run's depth routing: rows are routes, columns sources, cells the mean weight."""
    weights = summary["weights"]
    rows = route_order(weights)
    m = max(len(w) for w in weights.values())
    grid = np.full((len(rows), m), np.nan)  # a source a route does not have stays NaN: drawn grey
    for i, r in enumerate(rows):
        grid[i, :len(weights[r])] = weights[r]
    per_sublayer = run_settings(name)["res_blocks"] == 0
    # source 0 is the embedding; source i is sublayer i-1's output (per-sublayer) or block i's (blocks)
    labels = (["emb"] + sublayer_routes(weights))[:m] if per_sublayer else ["emb"] + [f"block {k}" for k in range(1, m)]
    fig, ax = plt.subplots(figsize=(1.2 + 0.62 * m, 0.9 + 0.36 * len(rows)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for (i, j), w in np.ndenumerate(grid):
        if not np.isnan(w):
            ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=7, color="white" if w < 0.6 else "black")
    ax.set_xticks(range(m), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("source: the embedding, or the output of a " + ("sublayer" if per_sublayer else "block"))
    ax.set_title(f"{name}: mean routing weight", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_max_weight(summaries, path):
    """The Delta paper's routing-collapse figure: max weight of each sublayer's route, attnres vs delta,
    per-sublayer (solid) and block (dashed) routing; grey: a uniform route's 1/m."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = set()
    for name, s in summaries.items():
        if name.split("/")[0] not in ("attnres", "delta"):
            continue
        routes = [r for r in sublayer_routes(s["weights"]) if r in s["max_weight"]]
        x = [sublayer_routes(s["weights"]).index(r) for r in routes]
        style = line_style(name)
        ax.plot(x, [s["max_weight"][r] for r in routes], marker="o", ms=4, label=name, **style)
        if style["linestyle"] not in drawn:  # 1/m for this granularity (the same m in attnres and delta)
            drawn.add(style["linestyle"])
            ax.plot(x, [1 / len(s["weights"][r]) for r in routes], color="grey", lw=1, linestyle=style["linestyle"],
                    label=f"uniform 1/m ({'block' if style['linestyle'] == '--' else 'per-sublayer'})")
    if not drawn:
        plt.close(fig)
        return False
    names = sublayer_routes(next(iter(summaries.values()))["weights"])
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("max routing weight")
    ax.set_title("max routing weight by depth (final eval, mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_results(compare_dir, records, names, seeds, meta, publish=None):
    """results.json, results.md and the pictures in compare_dir (and a copy in publish, if given)."""
    compare_dir = Path(compare_dir)
    runs = aggregate(records, names)
    figures = {}
    if plot_val_loss(records, names, compare_dir / "val_loss.png"):
        figures["val_loss"] = "val_loss.png"
    summaries = {n: r["routing"] for n, r in runs.items() if r["routing"]}
    if plot_max_weight(summaries, compare_dir / "max_weight_by_depth.png"):
        figures["max_weight_by_depth"] = "max_weight_by_depth.png"
    figures["routing"] = {}
    for name, s in summaries.items():
        plot_routing(name, s, compare_dir / f"routing_{slug(name)}.png")
        figures["routing"][name] = f"routing_{slug(name)}.png"
    deepest = next((s["deepest"] for s in summaries.values()), None)
    results = dict(meta, seeds=list(seeds), reference=REFERENCE, deepest=deepest, figures=figures, runs=runs)
    (compare_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (compare_dir / "results.md").write_text(markdown(results, "") + "\n")
    if publish:
        publish = Path(publish)
        publish.mkdir(parents=True, exist_ok=True)
        files = [figures.get("val_loss"), figures.get("max_weight_by_depth"), *figures["routing"].values()]
        for file in filter(None, files):
            shutil.copyfile(compare_dir / file, publish / file)
        shutil.copyfile(compare_dir / "results.json", publish / "results.json")
        (publish / "results.md").write_text(markdown(results, publish.as_posix()) + "\n")
    return results


# -----------------------------------------------------------------------------
# the command line and the training loop

def parse_args(argv):
    """(config file or None, compare's own options, the --key=value list for train.py)."""
    config, options, passthrough = None, dict(runs="residual", seeds=3, publish=None), []
    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__.strip())
            sys.exit(0)
        if not arg.startswith("--"):
            if config is not None:
                raise ValueError(f"one config file only, got {config} and {arg}")
            config = arg
            continue
        key, sep, value = arg[2:].partition("=")
        if not sep:
            raise ValueError(f"{arg}: use --key=value")
        if key in options:
            if key == "seeds" and not value.isdigit():
                raise ValueError(f"{arg}: the number of seeds is a positive integer")
            options[key] = int(value) if key == "seeds" else value
        elif key in RUN_KEYS or key == "seed":
            raise ValueError(f"--{key} is set by each run; choose runs with --runs (e.g. --runs=delta/res_blocks=2,dlr/rank=16)"
                             if key != "seed" else "--seed: use --seeds=N, the runs use seeds 0..N-1")
        else:
            passthrough.append(arg)
    if options["seeds"] < 1:
        raise ValueError("--seeds must be at least 1")
    return config, options, passthrough


def train_settings(config, passthrough):
    """The settings compare.py needs to know (out_dir, max_iters, eval_interval, eval_iters): train.py's
    defaults (its module-level `key = value` lines, which --help lists), the config file's, then the
    command line's, read as train.py's configurator reads them."""
    tree = ast.parse(TRAIN.read_text())
    settings = {node.targets[0].id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)}
    if config:
        exec(Path(config).read_text(), {}, settings)
    for arg in passthrough:
        key, _, value = arg[2:].partition("=")
        try:
            settings[key] = value if isinstance(settings.get(key), str) else ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[key] = value  # train.py will say what is wrong with it
    return settings


def train_command(config, run_dir, seed, name, passthrough):
    settings = run_settings(name)
    return ([sys.executable, str(TRAIN)] + ([config] if config else []) +
            [f"--out_dir={run_dir}", f"--seed={seed}"] + [f"--{k}={v}" for k, v in settings.items()] + passthrough)


def train_args(config, run_dir, seed, name, passthrough):
    """What makes a run what it is: its train.py arguments, less where it writes (kept in train_args.json)."""
    return [a for a in train_command(config, run_dir, seed, name, passthrough)[2:] if not a.startswith("--out_dir=")]


def train(cmd, run_dir):
    """Run train.py, its output in run_dir/train.log; the wall time in seconds. A failure ends the grid."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(run_dir / "train.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = (run_dir / "train.log").read_text().splitlines()[-15:]
        raise RuntimeError(f"train.py failed (exit code {rc}); the end of {run_dir / 'train.log'}:\n  " + "\n  ".join(tail)
                           + f"\ncommand: {' '.join(cmd)}")
    return time.time() - t0


def estimate_run_s(config, name, passthrough, settings):
    """Seconds for one run, from a PROBE_ITERS-iteration timing run of train.py: its startup, plus
    max_iters training steps at the measured ms/iter, plus the evals (a forward costs ~1/3 of a step)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = [f"--max_iters={PROBE_ITERS}", f"--eval_interval={PROBE_ITERS}", "--eval_iters=1", "--log_interval=1"]
        cmd = train_command(config, tmp, 0, name, passthrough + probe)
        wall = train(cmd, Path(tmp))
        ms = [e["ms_per_iter"] for e in read_log(tmp) if e.get("event") == "train"][1:]  # the first step warms up
    step_s = statistics.median(ms) / 1000 if ms else wall / PROBE_ITERS
    max_iters, eval_interval, eval_iters = (settings[k] for k in ("max_iters", "eval_interval", "eval_iters"))
    eval_steps = (max_iters // eval_interval + 1) * 2 * eval_iters / 3
    return max(wall - PROBE_ITERS * step_s, 0) + (max_iters + eval_steps) * step_s


def hms(seconds):
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def machine():
    """A line about this computer for results.md: CPU (or GPU), cores, torch version."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = torch.get_num_threads()  # what train.py gets too: it inherits OMP_NUM_THREADS
    return f"{cpu} ({os.cpu_count()} cores, torch on {threads} thread{'s' * (threads > 1)}){gpu}, torch {torch.__version__}"


def main(argv):
    config, options, passthrough = parse_args(argv)
    settings = train_settings(config, passthrough)
    names = select_runs(options["runs"])
    seeds = list(range(options["seeds"]))
    compare_dir = Path(settings["out_dir"]) / "compare"
    runs_dir = compare_dir / "runs"
    passthrough = [a for a in passthrough if not a.startswith("--out_dir=")]

    # seed-major order: after the first round every run has one paired seed, and the table is already meaningful
    plan = [(name, seed) for seed in seeds for name in names]
    todo = [(n, s) for n, s in plan if not finished(read_log(runs_dir / n / f"seed{s}"))]
    for name, seed in plan:  # a run that finished with other train.py arguments would not be comparable
        run_dir = runs_dir / name / f"seed{seed}"
        args_file = run_dir / "train_args.json"
        if (name, seed) not in todo and args_file.exists():
            old, new = json.loads(args_file.read_text()), train_args(config, run_dir, seed, name, passthrough)
            if old != new:
                raise ValueError(f"{run_dir} finished with other train.py arguments:\n  {' '.join(old)}\nnot\n  "
                                 f"{' '.join(new)}\nuse another --out_dir, or delete {run_dir} to retrain it")
    print(f"{len(plan)} runs ({len(names)} x {len(seeds)} seeds) in {compare_dir}: {len(plan) - len(todo)} done, "
          f"{len(todo)} to train", flush=True)

    # expected time: finished runs' times where there are some, else a short timing probe of train.py
    known = {}
    for name, seed in plan:
        done = finished(read_log(runs_dir / name / f"seed{seed}"))
        if done and done.get("elapsed_s"):
            known.setdefault(name, []).append(done["elapsed_s"])
    estimate = {n: statistics.fmean(t) for n, t in known.items()}
    for name in dict.fromkeys(n for n, _ in todo):
        if name not in estimate:
            estimate[name] = estimate_run_s(config, name, passthrough, settings)
            print(f"  timing probe ({PROBE_ITERS} iterations): {name} ~{hms(estimate[name])} per run", flush=True)
    if todo:
        source = " and ".join(filter(None, ["finished runs" * bool(known), "timing probes" * (len(known) < len(estimate))]))
        print(f"expected time: ~{hms(sum(estimate[n] for n, _ in todo))} (from {source}; updated after every run)", flush=True)

    measured = {}
    for i, (name, seed) in enumerate(todo, 1):
        run_dir = runs_dir / name / f"seed{seed}"
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished run starts over: a resumed one might not see the same batches
        cmd = train_command(config, run_dir, seed, name, passthrough)
        run_dir.mkdir(parents=True)
        (run_dir / "train_args.json").write_text(json.dumps(train_args(config, run_dir, seed, name, passthrough)) + "\n")
        wall = train(cmd, run_dir)
        measured.setdefault(name, []).append(wall)
        estimate[name] = statistics.fmean(measured[name])
        val = finished(read_log(run_dir))["val_loss"]
        eta = sum(estimate[n] for n, _ in todo[i:])
        print(f"[{i}/{len(todo)}] {name} seed{seed}: val loss {val:.4f} in {hms(wall)}; ETA {hms(eta)}", flush=True)

    records = load_records(runs_dir, names, seeds)
    command = "python compare.py " + " ".join(argv)
    results = write_results(compare_dir, records, names, seeds,
                            dict(command=command, machine=machine(), max_iters=settings["max_iters"]),
                            options["publish"])
    print(f"wrote {compare_dir / 'results.md'}" + (f" and {options['publish']}/" if options["publish"] else ""))
    print(table(results))
    return results


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        sys.exit(130)
