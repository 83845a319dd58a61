r"""
The pictures: those of one grid, which compare.py draws as it writes its results.md (their files:
compare.py --help, "Output"), and figures that put published grids side by side, from the command line:

    python figures.py width docs/compare/depth docs/compare/width --n_layer=8 --out=docs/compare/width/delta_vs_width.png
    python figures.py depth docs/compare/depth docs/compare/width docs/compare/width16 \
        --runs=rd/res_blocks=0,attnres/res_blocks=0 --out=docs/compare/width16/delta_vs_depth.png

width: each run kind's paired Δ val loss to standard (results.json's, mean ± std over seeds) against
model width at one depth, from grids that differ in width (a sweep over n_embd, or another config).
depth: the same Δ against model depth, a panel per width, from every run of the grids given.
A run's width and depth are read from its train_args.json (its config file and arguments, as train.py
reads them), not from the grid's name; the plotted numbers are printed as a markdown table. --runs
keeps only the run kinds it names.
"""

import argparse
import contextlib
import io
import json
import os
import statistics
from pathlib import Path

import matplotlib
matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402

import configurator  # noqa: E402
from common import (REFERENCE, cannot_write, die, is_number, read_train_args, run_settings, split_point,  # noqa: E402
                    sublayer_routes)

ROOT = Path(__file__).resolve().parent
TRAIN = ROOT / "train.py"


# -----------------------------------------------------------------------------
# one grid: compare.py's pictures

COLORS = {"standard": "black", "attnres": "tab:blue", "delta": "tab:red", "rd": "tab:green", "rd_fixedv": "tab:olive",
          "lowrank": "tab:purple", "dlr": "tab:orange"}


def picture_path(path, option):
    """The file matplotlib writes for `--option=path` (NAME.png for a NAME without an extension), checked
    before any work: a ValueError says what to change where path is a folder, matplotlib does not know the
    format, or the folder cannot be written."""
    if os.path.isdir(path):  # (else matplotlib would write FOLDER.png beside it)
        raise ValueError(f"--{option}={path} is a folder: give the file to write, e.g. --{option}={Path(path) / 'NAME.png'}")
    path = str(path) if Path(path).suffix else f"{path}.png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(path).suffix[1:].lower() not in formats:
        raise ValueError(f"--{option}={path}: matplotlib cannot write {Path(path).suffix} files; end the name in one "
                         f"of .{', .'.join(sorted(formats))}")
    problem = cannot_write(path)
    if problem:
        raise ValueError(f"cannot write --{option}={path} ({problem}): give a path in a folder you can write")
    return path


def save(fig, path):
    """Every picture alike: laid out, at 120 dpi, and closed (pyplot keeps each figure until it is)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def granularity(name):
    """'per-sublayer' or 'res_blocks=N': what a run routes over, and so the source counts of its routes."""
    n = run_settings(split_point(name)[1]).get("res_blocks")
    return f"res_blocks={n}" if n else "per-sublayer"


def blocks(name):
    """Whether a run routes over blocks of sublayers (res_blocks > 0) rather than over each sublayer."""
    return granularity(name) != "per-sublayer"


def line_style(name):
    """Colour by mode (or linear kind), dashed for block routing."""
    kind = split_point(name)[1].split("/")[0]
    return dict(color=COLORS[kind], linestyle="--" if blocks(name) else "-")


def point_style(name):
    """line_style plus a marker, square for block routing: a sweep value with one point has no line to dash."""
    return dict(line_style(name), marker="s" if blocks(name) else "o")


def second_reference(style):
    """A run kind's style for its second reference in one picture (rd_fixedv − attnres after rd_fixedv − rd):
    hollow markers and a dotted line (dash-dotted for block routing, which is dashed), so that the two
    comparisons of one kind, one colour, are not drawn as one series twice."""
    return dict(style, linestyle=":" if style["linestyle"] == "-" else "-.", markerfacecolor="white")


def plot_val_loss(records, names, path):
    """Left: val loss vs iteration, mean over seeds, every run. Right: the paired difference to the
    reference (run - reference on the same seeds), mean over seeds: what the table's Δ is made of.
    names: the runs of one sweep value (the first is its reference)."""
    def curves(name):
        return {seed: dict(r["curve"]) for seed, r in records.get(name, {}).items()}
    ref = curves(names[0])
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
        if name != names[0] and seeds:
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
    later = [i for n in names for rec in records.get(n, {}).values() for i, _ in rec["curve"] if i > 0]
    for a in (ax, dax):
        if later:
            a.set_xlim(left=min(later))  # leave out the eval at init: every run starts near log(vocab_size)
        a.set_xlabel("iteration")
        a.grid(alpha=0.3)
    save(fig, path)
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
    per_sublayer = not blocks(name)
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
    save(fig, path)


def plot_max_weight(summaries, path):
    """The Delta paper's routing-collapse figure: max weight of each sublayer's route, attnres vs delta,
    per-sublayer (solid) and block (dashed) routing; grey: a uniform route's 1/m."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = set()
    for name, s in summaries.items():
        if split_point(name)[1].split("/")[0] not in ("attnres", "delta"):
            continue
        routes = [r for r in sublayer_routes(s["weights"]) if r in s["max_weight"]]
        x = [sublayer_routes(s["weights"]).index(r) for r in routes]
        style = line_style(name)
        ax.plot(x, [s["max_weight"][r] for r in routes], marker="o", ms=4, label=name, **style)
        if granularity(name) not in drawn:  # 1/m for each granularity (the same m in attnres and delta)
            drawn.add(granularity(name))
            ax.plot(x, [1 / len(s["weights"][r]) for r in routes], color="grey", lw=1, linestyle=style["linestyle"],
                    label=f"uniform 1/m ({granularity(name)})")
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
    save(fig, path)
    return True


def comparisons(results):
    """Every paired comparison of the grid by sweep value: {(run, reference): {value: paired}}, names
    without their value ('rd/res_blocks=0', 'attnres/res_blocks=0'); value '' without a sweep."""
    out = {}
    for name, r in results["runs"].items():
        point, kind = split_point(name)
        for ref, p in r["paired"].items():
            if p["n"]:
                out.setdefault((kind, split_point(ref)[1]), {})[point] = p
    return out


def plot_sweep(results, path):
    """The sweep's headline: paired Δ val loss at each swept value, mean over seeds with the paired std
    as error bars. Left: every run vs standard; right: the papers' own comparisons (compare.PARENTS)."""
    points, found = results["points"], comparisons(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, parents in zip(axes, (False, True)):
        pairs = [(kind, ref) for kind, ref in found if (ref != REFERENCE) == parents]
        for i, (kind, ref) in enumerate(pairs):
            by_point = found[(kind, ref)]
            x = [points.index(pt) + 0.04 * (i - (len(pairs) - 1) / 2) for pt in by_point]  # side by side, not on top
            y = [p["diff_nats_mean"] for p in by_point.values()]
            err = [p["diff_nats_std"] or 0.0 for p in by_point.values()]
            later = any(k == kind for k, _ in pairs[:i])  # the kind's colour is taken: its line style tells them apart
            style = second_reference(point_style(kind)) if later else point_style(kind)
            bars = ax.errorbar(x, y, yerr=err, ms=4, capsize=3, lw=1.4, **style,
                               label=kind if not parents else f"{kind} − {ref}")
            if later:  # its error bars dotted too: at a value with one point there is no line to tell it by
                bars.lines[2][0].set_linestyle(":")
        ax.axhline(0, color=COLORS[REFERENCE], lw=1)
        ax.set_xticks(range(len(points)), points)
        ax.set_xlim(-0.5, len(points) - 0.5)
        ax.grid(alpha=0.3)
        ax.set_title("vs standard" if not parents else "the papers' comparisons: run − its parent")
        if pairs:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("paired Δ val loss (nats, < 0: better)")
    fig.suptitle("paired Δ val loss, mean ± std over seeds", fontsize=10)
    save(fig, path)


def plot_sweep_max_weight(results, path):
    """The Delta paper's routing-collapse claim across the sweep: the deepest sublayer route's max
    weight at each value, per routed run kind; grey: a uniform route's 1/m over the same sources."""
    points = results["points"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    kinds, uniform = {}, {}
    for name, r in results["runs"].items():
        if r["routing"]:
            point, kind = split_point(name)
            routing = r["routing"]
            kinds.setdefault(kind, {})[point] = routing["deep_max_weight"]
            m = len(routing["weights"][routing["deepest"]])
            uniform.setdefault(granularity(name), (line_style(name)["linestyle"], {}))[1][point] = 1 / m
    for kind, by_point in kinds.items():
        ax.plot([points.index(pt) for pt in by_point], list(by_point.values()), ms=5, label=kind,
                **point_style(kind))
    for label, (linestyle, by_point) in uniform.items():
        ax.plot([points.index(pt) for pt in by_point], list(by_point.values()), color="grey", lw=1,
                linestyle=linestyle, marker=".", label=f"uniform 1/m ({label})")
    ax.set_xticks(range(len(points)), points)
    ax.set_ylim(0, 1)
    ax.set_ylabel("max weight of the deepest sublayer's route")
    ax.set_title("deepest route's max weight (final eval, mean over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, path)


# -----------------------------------------------------------------------------
# across grids: Δ val loss against width at one depth

def run_model(folder, name):
    """The train.py settings a run of a grid trained with, from its runs/<name>/seed<k>/train_args.json
    (any seed's: they differ only in --seed), its config file named from the repository root, where
    compare.py runs. Arguments train.py does not take are a ValueError that names the file."""
    files = sorted((Path(folder) / "runs" / name).glob("seed*/train_args.json"))
    if not files:
        raise ValueError(f"{Path(folder) / 'runs' / name} has no seed*/train_args.json to read the run's model from")
    remedy = "copy it again from the run's folder in the grid's out_dir, where compare.py wrote it"
    args = read_train_args(files[0], remedy)
    args = [a if a.startswith("--") else str(ROOT / a) for a in args]
    try:
        # configure's errors end in one line on stderr and an exit, as train.py's command line should: caught
        # here, that line says which file it came from
        with contextlib.redirect_stderr(io.StringIO()) as said:
            return configurator.configure(configurator.script_defaults(TRAIN), args, str(TRAIN))[0]
    except SystemExit:
        problem = said.getvalue().strip().removeprefix("error: ").removesuffix(" (see --help)")
        raise ValueError(f"{files[0]} holds arguments train.py does not take here ({problem}): {remedy}, or draw "
                         "the figure in the checkout that trained the grid") from None


PAIRED = ("n", "wins", "diff_nats_mean", "diff_nats_std")  # what the figures and tables read of a comparison


def read_comparisons(folder):
    """comparisons() of a grid's results.json. A file that is not compare.py's results (damaged, cut
    short, or other JSON) is a ValueError that names it, not a traceback from deep in the drawing."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no results.json: give folders compare.py wrote or published (e.g. docs/compare/depth)")
    redo = "write it again with the grid's compare.py command and --report=True (it trains nothing)"
    try:
        results = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror})") from None
    except ValueError as e:
        raise ValueError(f"{path} is not compare.py's results (not JSON: {e}): {redo}") from None
    try:
        found = comparisons(results)
    except (KeyError, TypeError, AttributeError):  # {}, [], runs of another shape
        found = None
    if found is None or not all(key in p for by_point in found.values() for p in by_point.values() for key in PAIRED):
        raise ValueError(f"{path} is not compare.py's results (no runs with their paired comparisons): {redo}")
    for name, run in results["runs"].items():
        for ref, p in run["paired"].items():
            problem = paired_problem(p) if p["n"] != 0 else None  # (no seed in common, n=0: nothing is drawn)
            if problem:
                raise ValueError(f"{path} is not compare.py's results (run {name} vs {ref}: {problem}): {redo}")
    return found


def paired_problem(p):
    """Why a paired comparison over seeds (n > 0) is not as compare.py writes it, in a few words, or None: the
    figures draw its numbers and the tables print them, so a null or a string among them would be a traceback
    from matplotlib, or a table cell that reads "None/3"."""
    def shown(key):
        return f"{key}={json.dumps(p[key])}"

    def count(x):
        return is_number(x) and float(x).is_integer()
    if not (count(p["n"]) and p["n"] > 0):
        return f"{shown('n')}, not a number of seeds"
    if not (count(p["wins"]) and 0 <= p["wins"] <= p["n"]):
        return f"{shown('wins')}, not a number of seeds out of n={p['n']}"
    if not is_number(p["diff_nats_mean"]):
        return f"{shown('diff_nats_mean')}, not a number"
    if not (is_number(p["diff_nats_std"]) or (p["diff_nats_std"] is None and p["n"] == 1)):
        return f"{shown('diff_nats_std')} over n={p['n']} seeds, not a number (one seed has none: null)"
    return None


def grid_deltas(folder):
    """Each run kind's paired comparison with the reference in one grid (a folder compare.py wrote or
    published), with the model the run trained: [(kind, n_embd, n_layer, paired with n_head and grid)],
    a kind without its sweep value ('rd/res_blocks=0')."""
    folder = Path(folder)
    found = []
    for (kind, ref), by_point in read_comparisons(folder).items():
        for point, paired in by_point.items() if ref == REFERENCE else ():
            model = run_model(folder, f"{point}/{kind}" if point else kind)
            found.append((kind, model["n_embd"], model["n_layer"], dict(paired, n_head=model["n_head"], grid=str(folder))))
    return found


def put_once(table, key, paired, kind, n_embd, n_layer):
    """table[key] = paired, unless two grids hold the same run: which one to draw is the caller's choice."""
    if key in table:
        raise ValueError(f"{kind} at n_embd={n_embd}, n_layer={n_layer} is in both {table[key]['grid']} and "
                         f"{paired['grid']}: give one of them")
    table[key] = paired


def deltas_by_width(folders, n_layer):
    """Every run's paired comparison with the reference at depth n_layer, from the results.json of grids:
    {run kind: {n_embd: paired, with the run's n_head and grid}}. Each folder must hold runs at that depth."""
    out = {}
    for folder in folders:
        found = grid_deltas(folder)
        depths = {depth for _, _, depth, _ in found}
        if n_layer not in depths:
            held = f"its runs have n_layer={','.join(map(str, sorted(depths)))}" if depths else "no run compared with standard yet"
            raise ValueError(f"{folder} has no runs at n_layer={n_layer} ({held})")
        for kind, n_embd, depth, paired in found:
            if depth == n_layer:
                put_once(out.setdefault(kind, {}), n_embd, paired, kind, n_embd, n_layer)
    return out


def deltas_by_depth(folders):
    """Every run's paired comparison with the reference in these grids: {run kind: {n_embd: {n_layer: paired}}}."""
    out = {}
    for folder in folders:
        for kind, n_embd, n_layer, paired in grid_deltas(folder):
            put_once(out.setdefault(kind, {}).setdefault(n_embd, {}), n_layer, paired, kind, n_embd, n_layer)
    return out


def only_runs(deltas, runs):
    """The kinds named in runs (all without it), in that order; a name no grid holds is an error, not an empty line."""
    if not runs:
        return deltas
    missing = [kind for kind in runs if kind not in deltas]
    if missing:
        raise ValueError(f"no grid has {', '.join(missing)} (they have {', '.join(deltas)}): check --runs")
    return {kind: deltas[kind] for kind in runs}


def draw_deltas(ax, series, sizes, xlabel):
    """Paired Δ val loss to the reference against a model size on a log2 axis, mean ± std over seeds (no
    bar: one seed): series {run kind: {size: paired}}, a line per kind, side by side rather than on top."""
    for i, (kind, by_size) in enumerate(series.items()):
        points = sorted(by_size.items())
        shift = 2 ** (0.02 * (i - (len(series) - 1) / 2))
        seeds = ", ".join(str(p["n"]) for _, p in points)
        ax.errorbar([size * shift for size, _ in points], [p["diff_nats_mean"] for _, p in points],
                    yerr=[p["diff_nats_std"] or 0.0 for _, p in points], ms=4, capsize=3, lw=1.4,
                    label=f"{kind} (seeds: {seeds})", **point_style(kind))
    ax.axhline(0, color=COLORS[REFERENCE], lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    # under the axes (below the x label: its pad is in font sizes), not on them: no point or bar is covered
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0), borderaxespad=5, ncol=1 if len(series) < 4 else 2)


def plot_width(deltas, n_layer, path):
    """Paired Δ val loss to the reference against n_embd at depth n_layer, a line per run kind measured
    at two widths or more. Returns those kinds."""
    kinds = [kind for kind, by_width in deltas.items() if len(by_width) > 1]
    if not kinds:
        raise ValueError(f"no run kind was measured at two widths at n_layer={n_layer}: no line to draw")
    fig, ax = plt.subplots(figsize=(7, 4.8))
    draw_deltas(ax, {kind: deltas[kind] for kind in kinds}, sorted({w for kind in kinds for w in deltas[kind]}),
                "n_embd (model width)")
    ax.set_ylabel(f"paired Δ val loss to {REFERENCE} (nats, < 0: better)")
    ax.set_title(f"paired Δ val loss vs {REFERENCE} at n_layer={n_layer}, mean ± std over seeds", fontsize=10)
    save(fig, path)
    return kinds


def paired_cells(p):
    """A paired comparison's table cells: Δ mean ± std (no std: one seed), wins/seeds, the grid it came from."""
    std = "" if p["diff_nats_std"] is None else f" ± {p['diff_nats_std']:.4f}"
    return f"{p['n_head']} | {p['diff_nats_mean']:+.4f}{std} | {p['wins']}/{p['n']} | {p['grid']} |"


def width_table(deltas, kinds):
    """The numbers plot_width draws, in markdown: a row per run kind and width."""
    lines = ["| run | n_embd | n_head | Δ val (nats) | wins | grid |", "|" + " --- |" * 6]
    for kind in kinds:
        lines += [f"| {kind} | {width} | {paired_cells(p)}" for width, p in sorted(deltas[kind].items())]
    return "\n".join(lines)


def plot_depth(deltas, path):
    """Paired Δ val loss to the reference against n_layer, a panel per width with one y axis, a line per
    run kind (a point where it was measured at one depth)."""
    if not any(len(by_depth) > 1 for by_width in deltas.values() for by_depth in by_width.values()):
        raise ValueError("no run kind was measured at two depths of one width: no line to draw")
    widths = sorted({width for by_width in deltas.values() for width in by_width})
    depths = sorted({depth for by_width in deltas.values() for by_depth in by_width.values() for depth in by_depth})
    fig, axes = plt.subplots(1, len(widths), figsize=(4.2 * len(widths) + 1, 4.8), sharey=True, squeeze=False)
    for ax, width in zip(axes[0], widths):
        draw_deltas(ax, {kind: by_width[width] for kind, by_width in deltas.items() if width in by_width}, depths,
                    "n_layer (model depth)")
        ax.set_title(f"n_embd={width}", fontsize=10)
    axes[0][0].set_ylabel(f"paired Δ val loss to {REFERENCE} (nats, < 0: better)")
    fig.suptitle(f"paired Δ val loss vs {REFERENCE} by depth, at each width: mean ± std over seeds", fontsize=10)
    save(fig, path)


def depth_table(deltas):
    """The numbers plot_depth draws, in markdown: a row per run kind, width and depth."""
    lines = ["| run | n_embd | n_layer | n_head | Δ val (nats) | wins | grid |", "|" + " --- |" * 7]
    for kind, by_width in deltas.items():
        for width, by_depth in sorted(by_width.items()):
            lines += [f"| {kind} | {width} | {depth} | {paired_cells(p)}" for depth, p in sorted(by_depth.items())]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["width", "depth"], help="the figure to draw")
    parser.add_argument("folders", nargs="+", help="grids compare.py wrote or published, each with results.json and runs/")
    parser.add_argument("--n_layer", type=int, help="width: the depth at which widths are compared (required)")
    parser.add_argument("--runs", type=lambda s: s.split(","), default=None,
                        help="only these run kinds, comma-separated (e.g. rd/res_blocks=0,attnres/res_blocks=0)")
    parser.add_argument("--out", help="the PNG to write (default: delta_vs_<figure>.png)")
    args = parser.parse_args(argv)
    if args.figure == "width" and args.n_layer is None:
        parser.error("the width figure compares widths at one depth: give --n_layer")
    args.out = args.out or f"delta_vs_{args.figure}.png"
    return args


def main(argv=None):
    args = parse_args(argv)
    args.out = picture_path(args.out, "out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    scale = "nats, run − {}, mean ± std over seeds; wins/seeds".format(REFERENCE)
    if args.figure == "depth":
        deltas = only_runs(deltas_by_depth(args.folders), args.runs)
        plot_depth(deltas, args.out)
        print(f"paired Δ val loss to {REFERENCE} by width and depth ({scale}):")
        print(depth_table(deltas))
    else:
        deltas = only_runs(deltas_by_width(args.folders, args.n_layer), args.runs)
        kinds = plot_width(deltas, args.n_layer, args.out)
        print(f"paired Δ val loss to {REFERENCE} at n_layer={args.n_layer} ({scale}):")
        print(width_table(deltas, kinds))
        once = [f"{kind} (n_embd={', '.join(map(str, deltas[kind]))})" for kind in deltas if kind not in kinds]
        if once:
            print(f"at one width only, not drawn: {'; '.join(once)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        die(e)
