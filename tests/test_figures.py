"""
figures.py: the styles compare.py's pictures share, and the width and depth figures: the paired Δ val
loss read from grids as compare.py publishes them (results.json, each run's train_args.json), their
errors, their command lines. compare.py's own pictures, drawn through write_results: test_compare.py.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import compare
import figures
import model

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "config/train_shakespeare_char.py"  # 4 layers, 4 heads, 128 wide; named as compare.py records it


def write_grid(folder, passthrough, finals):
    """A grid as compare.py publishes it: results.json from compare.aggregate of these final val losses
    ({run name: [one per seed]}), and each run's train_args.json as compare.py writes it."""
    names = list(finals)
    records = {name: {seed: dict(val_loss=v, elapsed_s=None, commit=None, curve=[], routing=None, scores={})
                      for seed, v in enumerate(finals[name])} for name in names}
    for name in names:
        for seed in records[name]:
            run_dir = folder / "runs" / name / f"seed{seed}"
            run_dir.mkdir(parents=True)
            args = compare.train_args(CONFIG, run_dir, seed, name, passthrough)
            (run_dir / "train_args.json").write_text(json.dumps(args) + "\n")
    results = dict(reference=compare.REFERENCE, runs=compare.aggregate(records, names))
    (folder / "results.json").write_text(json.dumps(results) + "\n")
    return folder


@pytest.fixture
def grids(tmp_path):
    """A depth grid at the config's width (n_layer=2,4) and a width grid (n_embd=256 at 4 layers, 8 heads)
    whose runs have fewer seeds, as the published depth and width grids are."""
    depth = write_grid(tmp_path / "depth", [], {
        "n_layer=2/standard": [2.00, 2.10, 2.05], "n_layer=2/rd/res_blocks=0": [1.90, 2.00, 2.00],
        "n_layer=4/standard": [1.90, 1.95, 2.00], "n_layer=4/rd/res_blocks=0": [1.85, 1.93, 1.96],
        "n_layer=4/delta/res_blocks=0": [1.91, 1.94, 2.02]})
    width = write_grid(tmp_path / "width", ["--n_layer=4", "--n_head=8"], {
        "n_embd=256/standard": [1.80, 1.84], "n_embd=256/rd/res_blocks=0": [1.70, 1.80],
        "n_embd=256/attnres/res_blocks=4": [1.78]})
    return depth, width


def test_block_routing_is_dashed_with_square_markers():
    """Block routing (res_blocks > 0) is drawn dashed with squares, with or without a sweep value in its name."""
    assert figures.line_style("n_layer=16/rd/res_blocks=4") == dict(color="tab:green", linestyle="--")
    assert figures.point_style("rd/res_blocks=4")["marker"] == "s"
    assert figures.point_style("n_embd=256/attnres/res_blocks=0") == dict(color="tab:blue", linestyle="-", marker="o")
    assert figures.line_style("standard") == dict(color="black", linestyle="-")


def test_each_block_setting_gets_its_own_uniform_line(tmp_path, monkeypatch):
    """A uniform route's 1/m depends on how many sources each route has: two block settings (and
    per-sublayer routing) in one picture each get their grey line, with their own 1/m, not one per line style."""
    settings = {"attnres/res_blocks=0": 0, "attnres/res_blocks=2": 2, "delta/res_blocks=4": 4}
    counts, summaries = {}, {}
    for name, res_blocks in settings.items():
        net = model.GPT(model.GPTConfig(residual=name.split("/")[0], res_blocks=res_blocks, n_layer=4, n_embd=16,
                                        n_head=2, block_size=8, vocab_size=32))
        net(torch.zeros(1, 8, dtype=torch.long), collect_routing=True)
        summaries[name] = compare.mean_routing([net.last_routing])
        weights = summaries[name]["weights"]  # (a route with one source has no max weight to draw)
        counts[figures.granularity(name)] = [len(weights[r]) for r in figures.sublayer_routes(weights)
                                             if r in summaries[name]["max_weight"]]
    assert len({tuple(c) for c in counts.values()}) == 3  # three different source counts to draw
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))

    figures.plot_max_weight(summaries, tmp_path / "max_weight.png")
    grey = {line.get_label(): list(line.get_ydata()) for line in drawn[0].axes[0].lines if line.get_color() == "grey"}
    assert grey == {f"uniform 1/m ({g})": [1 / m for m in c] for g, c in counts.items()}
    # each run's point at a route's tick is that route's max weight (the first route, one source, has none)
    ticks = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    for line in drawn[0].axes[0].lines:
        if line.get_label() in summaries:
            max_weight = summaries[line.get_label()]["max_weight"]
            assert {ticks[x]: y for x, y in zip(line.get_xdata(), line.get_ydata())} == {
                r: w for r, w in max_weight.items() if r in figures.sublayer_routes(max_weight)}

    points = ["n_layer=4", "n_layer=8"]  # the same routing at both values: what matters is one line per setting
    runs = {f"{pt}/{name}": dict(routing=dict(summary, deep_max_weight=0.5)) for pt in points
            for name, summary in summaries.items()}
    figures.plot_sweep_max_weight(dict(points=points, runs=runs), tmp_path / "sweep_max_weight.png")
    grey = {line.get_label(): list(line.get_ydata()) for line in drawn[1].axes[0].lines if line.get_color() == "grey"}
    deepest = summaries["attnres/res_blocks=0"]["deepest"]
    assert grey == {f"uniform 1/m ({g})": [1 / len(summaries[n]["weights"][deepest])] * 2
                    for n, g in zip(settings, counts)}
    kinds = {line.get_label(): list(line.get_ydata()) for line in drawn[1].axes[0].lines if line.get_color() != "grey"}
    assert kinds == {name: [0.5, 0.5] for name in settings}  # each kind's deepest route's max weight at both values
    for fig in drawn:
        figures.plt.close(fig)


def test_sweep_draws_each_reference_of_a_kind_apart(tmp_path, monkeypatch):
    """rd_fixedv is compared with rd and with attnres: one colour, so its second comparison is drawn with
    hollow markers, another line and dotted error bars, not as a copy of the first; other kinds keep theirs."""
    names = [f"{pt}/{kind}" for pt in ("n_layer=2", "n_layer=4")
             for kind in ("standard", "attnres/res_blocks=0", "rd/res_blocks=0", "rd_fixedv/res_blocks=0")]
    finals = {"standard": [2.00, 2.10], "attnres/res_blocks=0": [1.98, 2.06], "rd/res_blocks=0": [1.96, 2.03],
              "rd_fixedv/res_blocks=0": [1.97, 2.05]}
    records = {name: {seed: dict(val_loss=v, elapsed_s=None, commit=None, curve=[], routing=None, scores={})
                      for seed, v in enumerate(finals[compare.split_point(name)[1]])} for name in names}
    results = dict(points=["n_layer=2", "n_layer=4"], runs=compare.aggregate(records, names))
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    figures.plot_sweep(results, tmp_path / "sweep_val_loss.png")
    series = {c.get_label(): c for c in drawn[0].axes[1].containers}  # the papers' comparisons
    first, second = (series[f"rd_fixedv/res_blocks=0 − {ref}/res_blocks=0"] for ref in ("rd", "attnres"))
    style = lambda c: (c.lines[0].get_linestyle(), c.lines[0].get_markerfacecolor(), c.lines[2][0].get_linestyle()[0])
    assert first.lines[0].get_color() == second.lines[0].get_color() == "tab:olive"
    assert style(first) != style(second)
    assert second.lines[0].get_linestyle() == ":" and second.lines[0].get_markerfacecolor() == "white"
    rd = series["rd/res_blocks=0 − attnres/res_blocks=0"].lines[0]
    assert (rd.get_linestyle(), rd.get_markerfacecolor()) == ("-", "tab:green")  # its only comparison: as ever
    assert len(drawn[0].axes[1].containers) == 3
    figures.plt.close(drawn[0])  # save, which closes it, did not run


def test_width_deltas_are_read_from_results_and_train_args(grids):
    """Each run's Δ to standard at the asked depth, its width and heads read from its train_args.json (the
    config file's 128 where no argument sets n_embd); a kind at one width is kept but not drawn."""
    depth, width = grids
    deltas = figures.deltas_by_width([depth, width], 4)
    assert {kind: sorted(d) for kind, d in deltas.items()} == {
        "rd/res_blocks=0": [128, 256], "delta/res_blocks=0": [128], "attnres/res_blocks=4": [256]}
    rd = deltas["rd/res_blocks=0"]
    assert rd[128]["diff_nats"] == pytest.approx([-0.05, -0.02, -0.04])
    assert rd[128]["diff_nats_mean"] == pytest.approx(statistics.fmean([-0.05, -0.02, -0.04]))
    assert rd[256]["diff_nats_mean"] == pytest.approx(-0.07) and rd[256]["diff_nats_std"] == pytest.approx(0.04243, abs=1e-5)
    assert (rd[128]["n_head"], rd[256]["n_head"], rd[256]["n"], rd[256]["grid"]) == (4, 8, 2, str(width))
    block = deltas["attnres/res_blocks=4"][256]
    assert block["diff_nats_mean"] == pytest.approx(-0.02) and block["diff_nats_std"] is None  # one seed: no std
    assert set(figures.deltas_by_width([depth], 2)) == {"rd/res_blocks=0"}


def test_width_errors_name_the_folder(grids, tmp_path):
    """A folder without results.json, a depth a grid lacks, or one run in two grids: a one-line reason."""
    depth, width = grids
    with pytest.raises(ValueError, match=r"^nowhere has no results.json"):
        figures.deltas_by_width([depth, "nowhere"], 4)
    with pytest.raises(ValueError, match=rf"^{depth} has no runs at n_layer=3 \(its runs have n_layer=2,4\)$"):
        figures.deltas_by_width([depth, width], 3)
    with pytest.raises(ValueError, match=rf"^{width} has no runs at n_layer=2 \(its runs have n_layer=4\)$"):
        figures.deltas_by_width([depth, width], 2)
    with pytest.raises(ValueError, match="rd/res_blocks=0 at n_embd=128, n_layer=4 is in both"):
        figures.deltas_by_width([depth, depth], 4)
    with pytest.raises(ValueError, match="no run kind was measured at two widths"):
        figures.plot_width(figures.deltas_by_width([depth], 4), 4, tmp_path / "x.png")


def test_width_command_writes_the_png_and_prints_its_numbers(grids, tmp_path):
    """`python figures.py width ...` writes the PNG (its folder made) and prints the drawn numbers; an error is one line."""
    depth, width = grids
    out = tmp_path / "figs" / "delta_vs_width.png"
    run = subprocess.run([sys.executable, str(ROOT / "figures.py"), "width", str(depth), str(width), "--n_layer=4",
                          f"--out={out}"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"| rd/res_blocks=0 | 128 | 4 | -0.0367 ± 0.0153 | 3/3 | {depth} |" in run.stdout
    assert f"| rd/res_blocks=0 | 256 | 8 | -0.0700 ± 0.0424 | 2/2 | {width} |" in run.stdout
    assert "at one width only, not drawn: delta/res_blocks=0 (n_embd=128); attnres/res_blocks=4 (n_embd=256)" in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "figures.py"), "width", str(depth), "--n_layer=3", f"--out={out}"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr == f"error: {depth} has no runs at n_layer=3 (its runs have n_layer=2,4)\n"


def test_depth_deltas_keep_every_width_and_depth(grids, tmp_path):
    """deltas_by_depth: each kind's Δ to standard by width, then depth, from all the grids; --runs keeps the
    kinds it names, in its order, and a kind no grid has is a one-line error."""
    depth, width = grids
    deltas = figures.deltas_by_depth([depth, width])
    assert {kind: {w: sorted(d) for w, d in by_width.items()} for kind, by_width in deltas.items()} == {
        "rd/res_blocks=0": {128: [2, 4], 256: [4]}, "delta/res_blocks=0": {128: [4]}, "attnres/res_blocks=4": {256: [4]}}
    assert deltas["rd/res_blocks=0"][128][2]["diff_nats"] == pytest.approx([-0.10, -0.10, -0.05])
    assert deltas["rd/res_blocks=0"][256][4]["grid"] == str(width)
    assert list(figures.only_runs(deltas, ["attnres/res_blocks=4", "rd/res_blocks=0"])) == ["attnres/res_blocks=4", "rd/res_blocks=0"]
    with pytest.raises(ValueError, match=r"^no grid has rd/res_blocks=4 \(they have rd/res_blocks=0, "):
        figures.only_runs(deltas, ["rd/res_blocks=4"])
    with pytest.raises(ValueError, match="rd/res_blocks=0 at n_embd=128, n_layer=2 is in both"):
        figures.deltas_by_depth([depth, width, depth])
    with pytest.raises(ValueError, match="no run kind was measured at two depths"):
        figures.plot_depth(figures.deltas_by_depth([width]), tmp_path / "x.png")


def test_depth_command_writes_the_png_and_prints_its_numbers(grids, tmp_path):
    """`python figures.py depth ...` draws a panel per width and prints every point it draws; --runs narrows it;
    the width figure without --n_layer is an error that says so."""
    depth, width = grids
    out = tmp_path / "figs" / "delta_vs_depth.png"
    run = subprocess.run([sys.executable, str(ROOT / "figures.py"), "depth", str(depth), str(width),
                          "--runs=rd/res_blocks=0", f"--out={out}"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in run.stdout.splitlines() if line.startswith("| rd/")]
    assert rows == [f"| rd/res_blocks=0 | 128 | 2 | 4 | -0.0833 ± 0.0289 | 3/3 | {depth} |",
                    f"| rd/res_blocks=0 | 128 | 4 | 4 | -0.0367 ± 0.0153 | 3/3 | {depth} |",
                    f"| rd/res_blocks=0 | 256 | 4 | 8 | -0.0700 ± 0.0424 | 2/2 | {width} |"]
    assert "delta/" not in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "figures.py"), "width", str(depth)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert bad.returncode == 2 and "give --n_layer" in bad.stderr


def test_a_results_json_that_is_not_compare_pys_is_named(grids):
    """A grid's results.json that is damaged, or JSON of another shape, is a one-line error naming the file and
    what to do; so is a damaged train_args.json (they were a JSON error naming no file, or a KeyError)."""
    depth, _ = grids
    path = depth / "results.json"
    for text in ("{bad", "{}", "[]", '{"runs": {"standard": {"paired": {"standard": {"n": 1}}}}}'):
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"^{path} is not compare.py's results \(.+\): write it again with the grid's "
                                             r"compare.py command and --report=True \(it trains nothing\)$"):
            figures.deltas_by_depth([depth])
    write_grid(depth.parent / "again", [], {"standard": [2.0], "rd/res_blocks=0": [1.9]})
    args = depth.parent / "again" / "runs" / "rd" / "res_blocks=0" / "seed0" / "train_args.json"
    args.write_text('["--n_lay')
    with pytest.raises(ValueError, match=rf"^{args} is damaged \(.+\): copy it again from the run's folder"):
        figures.deltas_by_depth([depth.parent / "again"])


def test_a_plotted_number_that_is_not_one_is_named(grids):
    """A comparison over seeds (n > 0) whose numbers are not compare.py's (a null Δ, a std missing over several
    seeds, counts that are no counts) is the one-line error of a damaged results.json, naming the run and its
    reference: a null was a TypeError from matplotlib. A comparison over no seed (n=0, its Δ null) is drawn
    by no figure, and stays allowed."""
    depth, width = grids
    path = depth / "results.json"
    good = json.loads(path.read_text())
    run, ref = "n_layer=4/rd/res_blocks=0", "n_layer=4/standard"
    for key, value, problem in [("diff_nats_mean", None, "diff_nats_mean=null, not a number"),
                                ("diff_nats_mean", "-0.03", 'diff_nats_mean="-0.03", not a number'),
                                ("diff_nats_std", None, "diff_nats_std=null over n=3 seeds, not a number (one seed has none: null)"),
                                ("wins", None, "wins=null, not a number of seeds out of n=3"),
                                ("wins", 4, "wins=4, not a number of seeds out of n=3"),
                                ("n", 2.5, "n=2.5, not a number of seeds"),
                                ("n", None, "n=null, not a number of seeds")]:
        results = json.loads(json.dumps(good))
        results["runs"][run]["paired"][ref][key] = value
        path.write_text(json.dumps(results))
        with pytest.raises(ValueError) as e:
            figures.deltas_by_depth([depth, width])
        assert str(e.value) == (f"{path} is not compare.py's results (run {run} vs {ref}: {problem}): write it again "
                                "with the grid's compare.py command and --report=True (it trains nothing)")
    results = json.loads(json.dumps(good))
    results["runs"][run]["paired"][ref] = dict(good["runs"][run]["paired"][ref], seeds=[], n=0, diff_nats=[],
                                               diff_nats_mean=None, diff_nats_std=None, wins=0)
    path.write_text(json.dumps(results))
    assert sorted(figures.deltas_by_depth([depth])["rd/res_blocks=0"][128]) == [2]  # n_layer=4's is gone, not an error

    results["runs"][run]["paired"][ref] = dict(good["runs"][run]["paired"][ref], diff_nats_mean=None)
    path.write_text(json.dumps(results))
    bad = subprocess.run([sys.executable, str(ROOT / "figures.py"), "depth", str(depth), str(width)], capture_output=True,
                         text=True, cwd=depth.parent)
    assert bad.returncode == 1 and bad.stderr == (f"error: {path} is not compare.py's results (run {run} vs {ref}: "
                                                  "diff_nats_mean=null, not a number): write it again with the grid's "
                                                  "compare.py command and --report=True (it trains nothing)\n")


def test_train_args_that_train_py_does_not_take_are_named(grids, capsys):
    """A run's train_args.json with a key train.py does not have, or a config file this checkout does not
    have, is a one-line error that names that train_args.json (it named neither file nor run) and says what
    to do; configure's own line is not printed too."""
    depth, _ = grids
    args = depth / "runs" / "n_layer=2" / "rd" / "res_blocks=0" / "seed0" / "train_args.json"
    written = json.loads(args.read_text())
    remedy = ("copy it again from the run's folder in the grid's out_dir, where compare.py wrote it, or draw the "
              "figure in the checkout that trained the grid")
    for changed, problem in [([a.replace("--n_layer=", "--n_lyer=") for a in written], "unknown config key 'n_lyer'"),
                             ([a.replace(CONFIG, "config/nonexistent.py") for a in written],
                              f"cannot read config file {ROOT / 'config' / 'nonexistent.py'} (No such file or directory)")]:
        assert changed != written
        args.write_text(json.dumps(changed))
        with pytest.raises(ValueError) as e:
            figures.deltas_by_depth([depth])
        assert str(e.value) == f"{args} holds arguments train.py does not take here ({problem}): {remedy}"
        assert capsys.readouterr().err == ""


def test_an_out_path_that_cannot_be_written_is_one_line(grids, tmp_path):
    """--out where no file can be written (under a file, which stops root too; onto a folder) is a one-line
    error naming the path, not a traceback from matplotlib."""
    depth, width = grids
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "d.png"
    with pytest.raises(ValueError, match=rf"^cannot write --out={out} \({tmp_path / 'file'} is a file, not a folder\): "
                                         "give a path in a folder you can write$"):
        figures.main(["depth", str(depth), str(width), f"--out={out}"])
    (tmp_path / "taken.png").mkdir()
    with pytest.raises(ValueError, match=rf"^--out={tmp_path / 'taken.png'} is a folder: give the file to write"):
        figures.main(["depth", str(depth), str(width), f"--out={tmp_path / 'taken.png'}"])


def test_an_out_folder_is_refused_not_written_beside(grids, tmp_path):
    """--out=FOLDER, a folder that exists, is a one-line error: it was written as FOLDER.png, beside it, without a word."""
    depth, width = grids
    folder = tmp_path / "figs"
    folder.mkdir()
    with pytest.raises(ValueError, match=rf"^--out={folder} is a folder: give the file to write, e.g. --out={folder / 'NAME.png'}$"):
        figures.main(["depth", str(depth), str(width), f"--out={folder}"])
    assert not (tmp_path / "figs.png").exists() and not any(folder.iterdir())


def test_an_out_format_matplotlib_cannot_write_is_refused_before_the_grids_are_read(tmp_path, monkeypatch):
    """--out=d.xyz is one line naming the formats there are, before any grid is read (it was matplotlib's
    error once the figure was drawn)."""
    monkeypatch.setattr(figures, "deltas_by_depth", lambda folders: pytest.fail("read the grids before checking --out"))
    with pytest.raises(ValueError, match=rf"^--out={tmp_path / 'd.xyz'}: matplotlib cannot write .xyz files; end the "
                                         r"name in one of \..*\.png"):
        figures.main(["depth", str(tmp_path / "no_grid"), f"--out={tmp_path / 'd.xyz'}"])


def test_an_out_path_without_an_extension_is_written_and_named_as_a_png(grids, tmp_path, capsys):
    """matplotlib writes --out=NAME as NAME.png: that file is the one checked and the one the last line names."""
    depth, width = grids
    figures.main(["depth", str(depth), str(width), f"--out={tmp_path / 'd'}"])
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'd.png'}\n")


def test_val_loss_panels_show_seed_means_and_the_paired_difference(tmp_path, monkeypatch):
    """Left: each run's val loss, the mean over all its seeds. Right: run − reference, averaged over the
    seeds both have (a seed the reference lacks is no pair), one line per run other than the reference."""
    curves = {"standard": [[4.0, 2.0, 1.8], [4.1, 2.1, 1.9], [4.2, 2.6, 2.0]],
              "rd/res_blocks=0": [[4.0, 1.9, 1.7], [4.1, 2.0, 1.85], [4.2, 2.3, 1.9], [4.3, 1.0, 1.0]]}  # seed 3: no pair
    records = {name: {seed: dict(curve=list(zip((0, 100, 200), c))) for seed, c in enumerate(cs)}
               for name, cs in curves.items()}
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    assert figures.plot_val_loss(records, list(curves), tmp_path / "val_loss.png")
    ax, dax = drawn[0].axes
    assert {line.get_label(): list(line.get_ydata()) for line in ax.lines} == {
        "standard (3 seeds)": pytest.approx([4.1, 6.7 / 3, 1.9]),
        "rd/res_blocks=0 (4 seeds)": pytest.approx([4.15, 1.8, 1.6125])}
    *diffs, zero = dax.lines  # the reference's own zero line comes last
    assert len(diffs) == 1 and list(zero.get_ydata()) == [0, 0]
    assert list(diffs[0].get_xdata()) == [0, 100, 200]
    assert list(diffs[0].get_ydata()) == pytest.approx([0.0, -0.5 / 3, -0.25 / 3])
    figures.plt.close(drawn[0])


def test_a_seed_only_the_reference_has_is_no_pair_either(tmp_path, monkeypatch):
    """The paired-difference panel averages run − reference over the seeds both have, the reference's extra seed left out."""
    curves = {"standard": [[4.0, 2.0], [4.0, 2.2], [4.0, 3.0]],  # seed 2: the reference's alone
              "rd/res_blocks=0": [[4.0, 1.9], [4.0, 2.0]]}
    records = {name: {seed: dict(curve=list(zip((0, 100), c))) for seed, c in enumerate(cs)} for name, cs in curves.items()}
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    assert figures.plot_val_loss(records, list(curves), tmp_path / "val_loss.png")
    diff = drawn[0].axes[1].lines[0]
    # at 100: ((1.9 - 2.0) + (2.0 - 2.2)) / 2 = -0.15; with seed 2 in the reference's mean it would be 1.95 - 2.4 = -0.45
    assert list(diff.get_ydata()) == pytest.approx([0.0, -0.15])
    figures.plt.close(drawn[0])


def test_routing_heatmap_puts_each_weight_at_its_route_and_source(tmp_path, monkeypatch):
    """A cell (route, source) shows that route's mean weight on that source: routes in depth order with each
    rd value route under its attention route and 'out' last, sources from the embedding on, a source the
    route does not have left empty; sources are sublayers, or blocks numbered from 1 for block routing."""
    weights = {"L0.attn": [1.0], "L0.mlp": [0.4, 0.6], "L1.attn": [0.2, 0.3, 0.5], "L1.mlp": [0.1, 0.2, 0.3, 0.4],
               "L0.attn.v": [1.0], "L1.attn.v": [0.5, 0.25, 0.25], "out": [0.1, 0.1, 0.2, 0.2, 0.4]}
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    figures.plot_routing("rd/res_blocks=0", dict(weights=weights), tmp_path / "routing.png")
    ax = drawn[0].axes[0]
    rows = ["L0.attn", "L0.attn.v", "L0.mlp", "L1.attn", "L1.attn.v", "L1.mlp", "out"]
    assert [t.get_text() for t in ax.get_yticklabels()] == rows
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", "L0.attn", "L0.mlp", "L1.attn", "L1.mlp"]
    grid = ax.images[0].get_array().filled(float("nan"))
    expected = [weights[r] + [float("nan")] * (5 - len(weights[r])) for r in rows]
    np.testing.assert_array_equal(grid, expected)  # NaN where the route has no such source

    blocks = {"L0.attn": [1.0], "L0.mlp": [0.4, 0.6], "L1.attn": [0.3, 0.7], "L1.mlp": [0.2, 0.3, 0.5],
              "L0.attn.v": [1.0], "L1.attn.v": [0.5, 0.5], "out": [0.2, 0.3, 0.5]}
    figures.plot_routing("n_layer=2/rd/res_blocks=2", dict(weights=blocks), tmp_path / "routing_blocks.png")
    assert [t.get_text() for t in drawn[1].axes[0].get_xticklabels()] == ["emb", "block 1", "block 2"]
    for fig in drawn:
        figures.plt.close(fig)


def test_sweep_points_sit_at_their_value_with_the_paired_mean_and_std(tmp_path, monkeypatch):
    """Each point of the sweep's Δ figure is at its own swept value (a kind missing at a value leaves it
    out, not shifts the rest), at the paired Δ mean in nats with the paired std as its bar; a run with no
    seed in common with the reference has no comparison to draw."""
    finals = {"n_layer=2/standard": {0: 2.0, 1: 2.1, 2: 2.2}, "n_layer=4/standard": {0: 1.9, 1: 2.0, 2: 2.1},
              "n_layer=2/rd/res_blocks=0": {5: 1.0},  # no seed of its reference's: n=0
              "n_layer=4/rd/res_blocks=0": {0: 1.85, 1: 1.99, 2: 2.04}}
    records = {name: {seed: dict(val_loss=v, elapsed_s=None, commit=None, curve=[], routing=None, scores={})
                      for seed, v in by_seed.items()} for name, by_seed in finals.items()}
    results = dict(points=["n_layer=2", "n_layer=4"], runs=compare.aggregate(records, list(finals)))
    assert set(figures.comparisons(results)) == {("rd/res_blocks=0", "standard")}
    assert list(figures.comparisons(results)[("rd/res_blocks=0", "standard")]) == ["n_layer=4"]
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    figures.plot_sweep(results, tmp_path / "sweep_val_loss.png")
    (bars,) = drawn[0].axes[0].containers
    diffs = [-0.05, -0.01, -0.06]
    assert list(bars.lines[0].get_xdata()) == [1.0]  # n_layer=4's place on the axis
    assert list(bars.lines[0].get_ydata()) == pytest.approx([statistics.fmean(diffs)])
    (low, high), = bars.lines[2][0].get_segments()
    assert (high[1] - low[1]) / 2 == pytest.approx(statistics.stdev(diffs))
    figures.plt.close(drawn[0])


def test_width_figure_draws_the_paired_mean_and_std_at_each_width(grids, tmp_path, monkeypatch):
    """The width figure draws what its table prints: each width's paired Δ mean with the std as its bar,
    widths in order whatever the order of the folders, and the seed counts in the legend."""
    depth, width = grids
    deltas = figures.deltas_by_width([width, depth], 4)  # the wider grid first
    deltas["rd/res_blocks=0"][128]["wins"] = 2  # (rd won on every seed: seeds and wins would read alike)
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    assert figures.plot_width(deltas, 4, tmp_path / "w.png") == ["rd/res_blocks=0"]
    (bars,) = drawn[0].axes[0].containers
    assert bars.get_label() == "rd/res_blocks=0 (seeds: 3, 2)"
    diffs = {128: [-0.05, -0.02, -0.04], 256: [-0.10, -0.04]}
    assert list(bars.lines[0].get_xdata()) == [128, 256]  # one kind: no side-by-side shift
    assert list(bars.lines[0].get_ydata()) == pytest.approx([statistics.fmean(diffs[128]), statistics.fmean(diffs[256])])
    half = [(high[1] - low[1]) / 2 for low, high in bars.lines[2][0].get_segments()]
    assert half == pytest.approx([statistics.stdev(diffs[128]), statistics.stdev(diffs[256])])
    figures.plt.close(drawn[0])


def test_only_comparisons_with_standard_are_drawn_against_width(tmp_path):
    """rd is compared with standard and with its parent attnres: the width and depth figures take its Δ to
    standard only, not the one to attnres as a second point at the same size."""
    grid = write_grid(tmp_path / "parents", [], {"standard": [2.0, 2.1], "attnres/res_blocks=0": [1.95, 2.08],
                                                 "rd/res_blocks=0": [1.9, 2.0]})
    deltas = figures.deltas_by_width([grid], 4)
    assert {kind: sorted(d) for kind, d in deltas.items()} == {"attnres/res_blocks=0": [128], "rd/res_blocks=0": [128]}
    assert deltas["rd/res_blocks=0"][128]["diff_nats"] == pytest.approx([-0.10, -0.10])


def test_table_cells_give_the_std_unless_there_is_none_and_wins_over_seeds():
    """A table cell: Δ with its sign, ± std wherever there is one (also a std of 0 over several seeds; only
    one seed has none), then wins out of seeds."""
    p = dict(n_head=4, diff_nats_mean=0.0123, diff_nats_std=0.0, wins=1, n=3, grid="g")
    assert figures.paired_cells(p) == "4 | +0.0123 ± 0.0000 | 1/3 | g |"
    assert figures.paired_cells(dict(p, diff_nats_mean=-0.02, diff_nats_std=None, wins=0, n=1)) == "4 | -0.0200 | 0/1 | g |"
