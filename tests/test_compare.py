"""
compare.py: the paired statistics on synthetic logs, the paired protocol (same init, same batches
for every mode), resuming a grid, and a tiny end-to-end grid through train.py.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import compare
from common import device_name
from helpers import folder_locked_by_another_process, randomise_queries, takes_ctrl_c, tiny_config
from model import GPT

ROOT = Path(__file__).resolve().parents[1]


def routing_of(residual, res_blocks=0, seed=0, n_layer=2):
    """A real model.last_routing of a routed mode, with random (so non-uniform) pseudo-queries."""
    torch.manual_seed(seed)
    model = randomise_queries(GPT(tiny_config(residual=residual, res_blocks=res_blocks, n_layer=n_layer)), seed, scale=3.0)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 16)), collect_routing=True)
    return model.last_routing


def write_log(run_dir, val_losses, routing=None, done=True, elapsed_s=10.0, commit="c0ffee", device_name=None, config=None):
    """A log.jsonl as train.py writes it: the start event, evals at iters 0, 10, 20, ... with the given val losses."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = [{"event": "start", "iter": 0, "commit": commit, "dirty": False, "torch": "2.13.0", "config": config or {}}]
    if device_name:
        events[0].update(device="cpu", device_name=device_name)
    for i, v in enumerate(val_losses):
        events.append({"event": "train", "iter": 10 * i, "loss": v + 0.1, "lr": 1e-3, "ms_per_iter": 5.0})
        ev = {"event": "eval", "iter": 10 * i, "train_loss": v - 0.05, "val_loss": v}
        if routing is not None:
            ev["routing"] = routing
        events.append(ev)
    if done:
        events.append({"event": "done", "iter": 10 * (len(val_losses) - 1), "val_loss": val_losses[-1],
                       "best_val_loss": min(val_losses), "ckpt": str(run_dir / "ckpt.pt"), "elapsed_s": elapsed_s})
    (run_dir / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


# -----------------------------------------------------------------------------
# run names

def test_run_names_round_trip():
    for name in compare.GRIDS["all"]:
        assert compare.run_name(compare.run_settings(name)) == name
    assert compare.run_settings("dlr/rank=32") == dict(residual="standard", lowrank_rank=32, dlr=True)
    assert compare.run_settings("delta/res_blocks=4") == dict(residual="delta", res_blocks=4, lowrank_rank=0, dlr=False)
    assert compare.select_runs("attnres,delta/res_blocks=2") == ["standard", "attnres/res_blocks=0", "delta/res_blocks=2"]
    for bad in ("resnet", "lowrank", "attnres/res_blocks=x", "standard/res_blocks=4", "delta/depth=3"):
        with pytest.raises(ValueError):
            compare.run_settings(bad)
    with pytest.raises(ValueError, match=r"^--runs=residual,lowrank: a grid \(residual, lowrank\) goes alone"):
        compare.select_runs("residual,lowrank")  # grids do not combine: not "run 'residual' must start with ..."


def test_sweep_names_and_pairing_per_value():
    """A sweep runs the grid at every value, the reference included; a name with a value runs there only;
    each run is paired with the standard run and its papers' parent at its own value."""
    sweep = ("n_layer", ["1", "2"])
    names = compare.select_runs("rd,delta/res_blocks=0,n_layer=2/rd_fixedv", sweep)
    assert names == ["n_layer=1/standard", "n_layer=1/rd/res_blocks=0", "n_layer=1/delta/res_blocks=0",
                     "n_layer=2/standard", "n_layer=2/rd/res_blocks=0", "n_layer=2/delta/res_blocks=0",
                     "n_layer=2/rd_fixedv/res_blocks=0"]
    assert compare.run_settings("n_layer=2/rd_fixedv/res_blocks=0") == dict(
        n_layer=2, residual="rd", res_blocks=0, fixed_value_route=True, lowrank_rank=0, dlr=False)
    assert compare.run_name(compare.run_settings("rd_fixedv/res_blocks=4")) == "rd_fixedv/res_blocks=4"
    assert compare.references("n_layer=2/rd_fixedv/res_blocks=0", names) == ["n_layer=2/standard", "n_layer=2/rd/res_blocks=0"]
    assert compare.references("n_layer=1/delta/res_blocks=0", names) == ["n_layer=1/standard"]  # no attnres in this grid
    full = compare.select_runs("depth", ("n_layer", ["4", "8", "16"]))
    assert compare.references("n_layer=16/rd/res_blocks=4", full) == ["n_layer=16/standard", "n_layer=16/attnres/res_blocks=4"]
    assert compare.references("n_layer=8/delta/res_blocks=0", full) == ["n_layer=8/standard", "n_layer=8/attnres/res_blocks=0"]
    assert len(full) == 17 and compare.slug("n_layer=8/rd/res_blocks=0") == "n_layer8_rd_res_blocks0"
    assert "n_layer=16/rd_fixedv/res_blocks=0" in full and "n_layer=4/rd_fixedv/res_blocks=0" not in full
    width = compare.select_runs("width", ("n_embd", ["256"]))
    assert width == ["n_embd=256/standard", "n_embd=256/attnres/res_blocks=0", "n_embd=256/rd/res_blocks=0",
                     "n_embd=256/rd_fixedv/res_blocks=0", "n_embd=256/attnres/res_blocks=4"]
    assert compare.references("n_embd=256/rd_fixedv/res_blocks=0", width) == [
        "n_embd=256/standard", "n_embd=256/rd/res_blocks=0", "n_embd=256/attnres/res_blocks=0"]
    with pytest.raises(ValueError, match="--sweep"):
        compare.select_runs("n_layer=2/rd")  # a value without a sweep
    with pytest.raises(ValueError, match="does not have"):
        compare.select_runs("n_layer=3/rd", sweep)
    with pytest.raises(ValueError, match="cannot be swept"):
        compare.parse_args(["--sweep=residual=attnres,delta"])
    with pytest.raises(ValueError, match="is swept"):
        compare.parse_args(["--sweep=n_layer=2,4", "--n_layer=3"])
    with pytest.raises(ValueError, match="not a train.py key"):
        compare.parse_args(["--sweep=n_layers=2,4"])


def test_eta_and_threads_with_jobs(monkeypatch):
    """The ETA schedules the queue on the free slots; several jobs run on one torch thread each unless told."""
    assert compare.finish_time([], [10, 10, 10, 10], 2) == 20
    assert compare.finish_time([5], [10, 10], 2) == 15  # 5 -> 15 on one slot, 0 -> 10 on the other
    assert compare.finish_time([], [10, 20, 30], 1) == 60
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert compare.run_env(2)["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in compare.run_env(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert compare.run_env(2)["OMP_NUM_THREADS"] == "3"


def test_each_job_slot_trains_on_its_own_gpu(monkeypatch):
    """With several GPUs, job slot k sees only GPU k modulo their number (rather than every run on GPU 0);
    CUDA_VISIBLE_DEVICES, where set, names the GPUs to share; one GPU or none changes nothing."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    env = {"PATH": "/bin"}
    gpus = compare.visible_gpus(env)
    assert gpus == ["0", "1"]
    assert [compare.slot_env(env, slot, gpus)["CUDA_VISIBLE_DEVICES"] for slot in range(3)] == ["0", "1", "0"]
    assert compare.slot_env(env, 0, gpus)["PATH"] == "/bin" and "CUDA_VISIBLE_DEVICES" not in env
    listed = {"CUDA_VISIBLE_DEVICES": "3, 5"}
    assert [compare.slot_env(listed, slot, compare.visible_gpus(listed))["CUDA_VISIBLE_DEVICES"]
            for slot in range(2)] == ["3", "5"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert compare.slot_env(env, 1, compare.visible_gpus(env)) is env


def test_command_line_is_read_as_train_py_reads_its_own(capsys):
    """compare.py's keys and train.py's are parsed by the configurator: run settings are refused, a wrong
    train.py key or value stops the grid before anything runs, a config file is executed as train.py would."""
    with pytest.raises(ValueError, match="--runs"):
        compare.parse_args(["--residual=delta"])
    config_file = str(ROOT / "config" / "train_shakespeare_char.py")
    config, options, rest = compare.parse_args([config_file, "--seeds=2", "--runs=lowrank", "--max_iters=5", "--jobs=2"])
    assert (config, options["seeds"], options["runs"], options["jobs"], rest) == (config_file, 2, "lowrank", 2, ["--max_iters=5"])
    assert compare.train_settings(config, rest)["n_embd"] == 128 and compare.train_settings(config, rest)["max_iters"] == 5
    for bad in (["--max_iter=5"], ["--max_iters=five"], ["--seeds=two"], ["--sweep=n_layer=4,eight"]):
        with pytest.raises(SystemExit) as exit_:
            compare.parse_args(bad)
        assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1  # one line
    assert set(compare.TRAIN_DEFAULTS) >= {"n_layer", "max_iters", "out_dir", "residual", "fixed_value_route"}
    help_keys = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True).stdout
    assert [line.split("=")[0].strip() for line in help_keys.splitlines() if line.startswith("  ")] == list(compare.TRAIN_DEFAULTS)

def test_grid_options_that_would_mix_or_lose_runs_are_refused(capsys):
    """What would make every seed the same run, drop a config file, or train nothing is refused before
    anything runs: --seed (the runs use seeds 0..N-1), a second config file, --seeds or --jobs below 1,
    a sweep without values or of seed or out_dir, a sweep value given twice (its runs would train twice, with
    --jobs at once in one folder), however spelled, or a path (it would split the runs' names)."""
    config = str(ROOT / "config" / "train_shakespeare_char.py")
    refused = {"--seed: use --seeds=N": ["--seed=3"],
               "one config file only": [config, str(ROOT / "config" / "train_gpt2_fineweb.py")],
               "--seeds=0: use a positive integer": ["--seeds=0"],
               "--jobs=0: use a positive integer": ["--jobs=0"],
               "--sweep=n_layer=: use --sweep=key=value": ["--sweep=n_layer="],
               "--sweep: seed cannot be swept": ["--sweep=seed=1,2"],
               "--sweep: out_dir cannot be swept": ["--sweep=out_dir=a,b"],
               "--sweep=n_layer=2,4,2: 2 and 2 are the same value": ["--sweep=n_layer=2,4,2"],
               "--sweep=learning_rate=1e-3,0.001: 1e-3 and 0.001 are the same value": ["--sweep=learning_rate=1e-3,0.001"],
               "--sweep=dataset=data/a,b: a value with a '/'": ["--sweep=dataset=data/a,b"],
               "--eval_tasks=, names no task: give one or more": ["--eval_tasks=,"],
               "--eval_limit says how --eval_tasks scores the runs: add --eval_tasks=T,U or drop it": ["--eval_limit=5"],
               "--eval_include_path says how --eval_tasks scores": ["--eval_include_path=tasks"]}
    for message, argv in refused.items():
        with pytest.raises(ValueError, match=f"^{message}"):
            compare.parse_args(argv)
    assert compare.parse_args([config, "--seeds=1", "--jobs=1"])[:2] == (config, dict(compare.OPTIONS, seeds=1))


def test_settings_that_would_not_train_the_runs_are_refused(tmp_path):
    """eval_only=True and init_from=resume, from the command line, a config file or a sweep, are refused
    before anything runs: compare.py trains each run itself and resumes an unfinished one on a rerun (passed
    on, eval_only ended the grid in a traceback after its first run, and resume in an error naming the timing
    probe's temporary folder). Their other values go to train.py as any setting does."""
    config = tmp_path / "resume.py"
    config.write_text('init_from = "resume"\n')
    trains_itself = "compare.py trains each run itself, and resumes an unfinished one from its checkpoint"
    refused = {f"--eval_only=True: {trains_itself} when the same command runs again: drop it": ["--eval_only=True"],
               f"--init_from=resume: {trains_itself}": ["--max_iters=5", "--init_from=resume"],
               f"init_from='resume' in {config}: {trains_itself}": [str(config)],
               f"--sweep=eval_only=False,True has eval_only=True, but {trains_itself}": ["--sweep=eval_only=False,True"],
               f"--sweep=init_from=scratch,resume has init_from=resume, but {trains_itself}": ["--sweep=init_from=scratch,resume"]}
    for message, argv in refused.items():
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            compare.parse_args(argv)
    assert compare.parse_args(["--eval_only=False", "--init_from=gpt2"])[2] == ["--eval_only=False", "--init_from=gpt2"]
    assert compare.parse_args([str(config), "--init_from=scratch"])[2] == ["--init_from=scratch"]


# -----------------------------------------------------------------------------
# aggregation on synthetic logs

def test_paired_differences_wins_and_std():
    ref = {0: 2.00, 1: 1.90, 2: 1.95}
    run = {0: 1.90, 1: 1.95, 2: 1.85, 3: 1.00}  # seed 3 has no reference: left out of the pairing
    p = compare.paired(run, ref)
    assert p["seeds"] == [0, 1, 2] and p["n"] == 3
    assert p["diff_nats"] == pytest.approx([-0.10, 0.05, -0.10], abs=1e-12)
    assert p["diff_nats_mean"] == pytest.approx(-0.05, abs=1e-12)
    assert p["diff_nats_std"] == pytest.approx(math.sqrt((0.05**2 + 0.1**2 + 0.05**2) / 2), abs=1e-12)  # ddof=1
    assert p["ppl_pct"] == pytest.approx([100 * (math.exp(d) - 1) for d in (-0.10, 0.05, -0.10)], abs=1e-12)
    assert p["ppl_pct_mean"] == pytest.approx(np.mean(p["ppl_pct"]), abs=1e-12)
    assert p["wins"] == 2
    assert compare.paired({0: 1.0}, {0: 1.0})["wins"] == 0  # a tie is no win
    assert compare.paired({0: 1.0}, {0: 1.5})["diff_nats_std"] is None  # one seed: no std


def test_pairs_are_matched_by_seed_not_by_position():
    """Each run's seed is paired with the reference's same seed, whatever else either finished or its order."""
    ref = {2: 1.80, 0: 2.00, 1: 1.90}  # seed 0 only the reference finished; not in seed order
    run = {1: 1.85, 2: 1.90}
    p = compare.paired(run, ref)
    # seed 1: 1.85 - 1.90 = -0.05; seed 2: 1.90 - 1.80 = +0.10 (paired by position: 1.85 - 1.80, 1.90 - 2.00)
    assert p["seeds"] == [1, 2] and p["diff_nats"] == pytest.approx([-0.05, 0.10], abs=1e-12)
    assert p["diff_nats_mean"] == pytest.approx(0.025, abs=1e-12) and p["wins"] == 1
    assert p["diff_nats_std"] == pytest.approx(math.sqrt(2 * 0.075**2), abs=1e-12)  # ddof=1 about the mean 0.025


def test_aggregate_synthetic_grid(tmp_path):
    runs = tmp_path / "compare" / "runs"
    names = ["standard", "delta/res_blocks=0", "rd/res_blocks=0", "lowrank/rank=32", "dlr/rank=32"]
    finals = {"standard": [1.90, 1.92, 1.88], "delta/res_blocks=0": [1.85, 1.93, 1.86],
              "rd/res_blocks=0": [1.89, 1.91, 1.90], "lowrank/rank=32": [2.10, 2.12, 2.08],
              "dlr/rank=32": [2.00, 2.05, 2.09]}
    routings = {"delta/res_blocks=0": [routing_of("delta", seed=s) for s in range(3)],
                "rd/res_blocks=0": [routing_of("rd", seed=s) for s in range(3)]}
    for name in names:
        for seed in range(3):
            routing = routings[name][seed] if name in routings else None
            write_log(runs / name / f"seed{seed}", [4.0, 2.5, finals[name][seed]], routing, elapsed_s=10.0 + seed)
    write_log(runs / "delta/res_blocks=0" / "seed3", [4.0, 1.0], done=False)  # unfinished: ignored

    records = compare.load_records(runs, names, range(4))
    results = compare.write_results(tmp_path / "compare", records, names, range(3),
                                    dict(command="python compare.py test", machine="test", max_iters=20),
                                    publish=tmp_path / "docs" / "compare")
    r = results["runs"]
    assert r["standard"]["val_loss_mean"] == pytest.approx(1.90) and r["standard"]["paired"] == {}
    assert r["standard"]["val_loss_std"] == pytest.approx(0.02)
    assert r["delta/res_blocks=0"]["paired"]["standard"]["diff_nats"] == pytest.approx([-0.05, 0.01, -0.02])
    assert r["delta/res_blocks=0"]["paired"]["standard"]["wins"] == 2
    assert r["delta/res_blocks=0"]["elapsed_s_mean"] == pytest.approx(11.0)
    # DLR rows are compared with dense standard and with their plain low-rank twin
    assert set(r["dlr/rank=32"]["paired"]) == {"standard", "lowrank/rank=32"}
    assert r["dlr/rank=32"]["paired"]["lowrank/rank=32"]["diff_nats"] == pytest.approx([-0.10, -0.07, 0.01])
    assert r["dlr/rank=32"]["paired"]["lowrank/rank=32"]["wins"] == 2
    # routing: per-seed statistics of the deepest sublayer, averaged over seeds; weights averaged per source
    delta = r["delta/res_blocks=0"]["routing"]
    assert delta["deepest"] == "L1.mlp"
    assert delta["deep_max_weight"] == pytest.approx(np.mean([x["L1.mlp"]["max_weight"] for x in routings["delta/res_blocks=0"]]))
    assert delta["weights"]["L1.mlp"] == pytest.approx(np.mean([x["L1.mlp"]["weights"] for x in routings["delta/res_blocks=0"]], axis=0))
    assert delta["mean_js"] is None
    rd = r["rd/res_blocks=0"]["routing"]
    assert rd["mean_js"] == pytest.approx(np.mean([np.mean([v["js_qk_v"] for v in x.values() if "js_qk_v" in v])
                                                   for x in routings["rd/res_blocks=0"]]))
    # files: the table and the pictures, and a published copy whose links work where it lies (next to it)
    out = tmp_path / "compare"
    for f in ("results.md", "results.json", "val_loss.png", "max_weight_by_depth.png",
              "routing_delta_res_blocks0.png", "routing_rd_res_blocks0.png"):
        assert (out / f).stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "| delta/res_blocks=0 | standard | 1.8800 ± 0.0436 | -0.0200 ± 0.0300 |" in md
    assert "| dlr/rank=32 | lowrank/rank=32 |  | -0.0533 ± 0.0569 |" in md
    assert "](val_loss.png)" in md and '<img src="routing_rd_res_blocks0.png"' in md
    assert (tmp_path / "docs" / "compare" / "results.md").read_text() == md
    assert (tmp_path / "docs" / "compare" / "routing_rd_res_blocks0.png").exists()


def test_results_name_the_machine_of_every_run(tmp_path):
    """results.md names the machine the runs trained on as their logs record it, not the one writing it
    (meta's); this machine in full only when this command trained every run; runs kept from an earlier
    command on another computer: it says which runs trained where, so their s/run are not read as one
    machine's; a run whose log names no machine is placed here only if this command trained it."""
    runs = tmp_path / "compare" / "runs"
    names = ["standard", "rd/res_blocks=0"]
    for seed in range(2):
        write_log(runs / "standard" / f"seed{seed}", [3.0, 2.0], device_name="CPU A", elapsed_s=100.0)
        write_log(runs / "rd/res_blocks=0" / f"seed{seed}", [3.0, 1.9], routing_of("rd"), device_name="CPU A")
    meta = dict(command="python compare.py test", machine="CPU B (2 cores, torch on 1 thread)", max_iters=20)
    every_run = [(name, seed) for name in names for seed in range(2)]
    out = lambda folder: (tmp_path / folder / "results.md").read_text()
    results = compare.write_results(tmp_path / "one", compare.load_records(runs, names, range(2)), names, range(2), meta)
    assert results["runs"]["standard"]["machines"] == ["CPU A, torch 2.13.0"]
    assert results["machine"] == "CPU A, torch 2.13.0"  # kept runs: where they trained, not where this runs
    assert out("one").splitlines()[0].endswith("seeds 0, 1, on CPU A, torch 2.13.0.")
    assert "CPU B" not in out("one") and "Not every run" not in out("one")

    # all trained by this command: this machine in full (cores, threads), which the logs do not record
    results = compare.write_results(tmp_path / "now", compare.load_records(runs, names, range(2)), names, range(2),
                                    meta, trained=every_run)
    assert results["machine"] == meta["machine"] and "Not every run" not in out("now")

    write_log(runs / "rd/res_blocks=0" / "seed1", [3.0, 1.9], routing_of("rd"), device_name="CPU B")
    results = compare.write_results(tmp_path / "two", compare.load_records(runs, names, range(2)), names, range(2), meta)
    assert results["runs"]["rd/res_blocks=0"]["machines"] == ["CPU A, torch 2.13.0", "CPU B, torch 2.13.0"]
    assert results["machine"] == "2 machines: CPU A, torch 2.13.0; CPU B, torch 2.13.0"
    assert ("standard, rd/res_blocks=0 on CPU A, torch 2.13.0; rd/res_blocks=0 on CPU B, torch 2.13.0. "
            "Compare s/run only") in out("two")

    # logs that name no machine: this one if this command trained the run, else none is guessed
    write_log(runs / "rd/res_blocks=0" / "seed1", [3.0, 1.9], routing_of("rd"))
    results = compare.write_results(tmp_path / "three", compare.load_records(runs, names, range(2)), names, range(2),
                                    meta, trained=[("rd/res_blocks=0", 1)])
    assert results["runs"]["rd/res_blocks=0"]["machines"] == ["CPU A, torch 2.13.0", meta["machine"]]
    results = compare.write_results(tmp_path / "four", compare.load_records(runs, names, range(2)), names, range(2), meta)
    assert results["runs"]["rd/res_blocks=0"]["machines"] == ["CPU A, torch 2.13.0", compare.UNNAMED]
    assert f"rd/res_blocks=0 on {compare.UNNAMED}." in out("four") and "CPU B" not in out("four")


def test_report_on_another_machine_keeps_where_the_runs_trained(tmp_path, capsys, monkeypatch):
    """--report=True on another computer (the published grids are re-reported anywhere) writes the
    machine the runs' logs name, not the one it runs on."""
    runs = tmp_path / "compare" / "runs"
    for name in ("standard", "delta/res_blocks=0"):
        for seed in range(2):
            write_log(runs / name / f"seed{seed}", [3.0, 2.0 - 0.1 * (name != "standard")],
                      routing_of("delta") if name != "standard" else None, device_name="AMD EPYC")
    monkeypatch.setattr(compare, "machine", lambda env, jobs: "Intel(R) Xeon(R) Processor (2 cores), torch 2.13.0")
    results = compare.main([f"--out_dir={tmp_path}", "--seeds=2", "--runs=delta", "--report=True"])
    assert results["machine"] == "AMD EPYC, torch 2.13.0"
    md = (tmp_path / "compare" / "results.md").read_text()
    assert md.splitlines()[0].endswith("seeds 0, 1, on AMD EPYC, torch 2.13.0.") and "Intel" not in md
    assert json.loads((tmp_path / "compare" / "results.json").read_text())["machine"] == "AMD EPYC, torch 2.13.0"


def test_report_without_finished_runs_says_what_to_do(tmp_path):
    """--report=True before any run finished (or with the wrong --out_dir): a one-line error, no traceback."""
    argv = [f"--out_dir={tmp_path / 'nothing'}", "--seeds=1", "--runs=delta", "--report=True"]
    with pytest.raises(ValueError, match="no finished run in .* to report: train the grid first"):
        compare.main(argv)
    run = subprocess.run([sys.executable, str(ROOT / "compare.py"), *argv], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and run.stderr.startswith("error: no finished run")
    assert "--out_dir" in run.stderr and not (tmp_path / "nothing" / "compare" / "results.md").exists()


def test_publish_brings_every_finished_run(tmp_path, capsys):
    """--publish copies every finished run of the grid, not only those this command trains: runs an
    earlier command finished (the standard runs another grid trained in the same out_dir) go in with
    their train_args.json and scores; a run published before keeps its log, its changed scores are copied."""
    runs, published = tmp_path / "compare" / "runs", tmp_path / "published"
    plan = [(name, seed) for name in ("standard", "delta/res_blocks=0") for seed in range(2)]
    for name, seed in plan:
        run_dir = runs / name / f"seed{seed}"
        write_log(run_dir, [3.0, 2.0 - 0.1 * (name != "standard")], routing_of("delta") if name != "standard" else None)
        (run_dir / "train_args.json").write_text(json.dumps(compare.train_args(None, run_dir, seed, name, [])) + "\n")
    write_scores(runs / "standard" / "seed1", {"tiny_choice/acc": 0.3})
    compare.publish_run(runs / "delta/res_blocks=0" / "seed0", published / "runs" / "delta/res_blocks=0" / "seed0")
    first = published / "runs" / "delta/res_blocks=0" / "seed0" / "log.jsonl"
    first.write_text(first.read_text() + "\n")  # marks this copy: it must be kept, not published again
    argv = [f"--out_dir={tmp_path}", "--seeds=2", "--runs=delta", f"--publish={published}"]
    compare.main(argv + ["--report=True"])
    for name, seed in plan:
        run_dir, copy = runs / name / f"seed{seed}", published / "runs" / name / f"seed{seed}"
        assert compare.finished(compare.read_log(copy)), (name, seed)
        assert '"event": "train"' not in (copy / "log.jsonl").read_text()
        assert (copy / "train_args.json").read_text() == (run_dir / "train_args.json").read_text()
    assert first.read_text().endswith("\n\n")
    scores = published / "runs" / "standard" / "seed1" / "ckpt.eval.json"
    assert scores.read_text() == (runs / "standard" / "seed1" / "ckpt.eval.json").read_text()
    assert compare.read_scores(scores.parent) == {"tiny_choice/acc": (0.3, True)}
    assert "| standard |" in (published / "results.md").read_text()

    write_scores(runs / "standard" / "seed1", {"tiny_choice/acc": 0.4})  # scored again, e.g. on more examples
    compare.main(argv)  # every run finished: nothing trains, the scores are published again
    assert "0 to train" in capsys.readouterr().out
    assert compare.read_scores(scores.parent) == {"tiny_choice/acc": (0.4, True)}


def test_publish_takes_a_finished_run_but_never_deletes_an_unfinished_local_checkpoint(tmp_path):
    """--publish takes a run finished elsewhere in place of one unfinished here, unless the local one holds a
    checkpoint: that is a one-line error, raised before anything is replaced, and the checkpoint is kept (here
    the published run also finished with other settings, which used to be found only after the checkpoint was
    gone). Without its checkpoint, the local run is replaced by the published one, once the grid's settings are
    the published run's (before, the other settings were found only after the copy)."""
    local, publish = tmp_path / "compare" / "runs" / "standard" / "seed0", tmp_path / "published"
    published = publish / "runs" / "standard" / "seed0"
    write_log(local, [3.0], done=False)
    (local / "ckpt.pt").write_bytes(b"hours of training")
    args = compare.train_args(None, local, 0, "standard", [f"--wandb_group={tmp_path.name}", "--max_iters=50000"])
    (local / "train_args.json").write_text(json.dumps(args))
    (local / "code.sha256").write_text(compare.code_digest(None) + "\n")
    write_log(published, [3.0, 2.0])
    (published / "train_args.json").write_text(json.dumps(compare.train_args(None, published, 0, "standard",
                                                                             ["--max_iters=40000"])))
    argv = [f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1", f"--publish={publish}", "--max_iters=50000",
            "--report=True"]
    log = (local / "log.jsonl").read_text()
    with pytest.raises(ValueError, match="holds an unfinished run, and") as error:
        compare.main(argv)
    assert "\n" not in str(error.value) and f"delete {local}" in str(error.value)
    assert (local / "ckpt.pt").read_bytes() == b"hours of training" and (local / "log.jsonl").read_text() == log

    (local / "ckpt.pt").unlink()  # the user's choice: take the published run
    with pytest.raises(ValueError, match="finished with other train.py arguments") as error:  # the published run's
        compare.main(argv)
    assert f"{published} finished" in str(error.value) and f"delete {published} to retrain" in str(error.value)
    assert (local / "log.jsonl").read_text() == log  # one the grid refuses is not copied in
    compare.main(argv[:-2] + ["--max_iters=40000", "--report=True"])  # the grid the published run belongs to
    assert (tmp_path / "compare" / "results.md").exists()


@pytest.mark.skipif(os.name == "nt", reason="the run folders' locks are Unix flocks")
def test_a_run_that_still_trains_is_never_deleted_or_trained_twice(tmp_path, monkeypatch):
    """A train.py that a compare.py killed outright left running holds its run's folder (its lock): the grid,
    run again, stops before anything runs, in one line, and never deletes the folder to start the run over,
    nor, with --publish, to take a published copy in its place."""
    run_dir, publish = tmp_path / "compare" / "runs" / "standard" / "seed0", tmp_path / "published"
    write_log(run_dir, [3.0], done=False)  # begun, no checkpoint yet: the grid would start it over
    write_log(publish / "runs" / "standard" / "seed0", [3.0, 2.0])
    log = (run_dir / "log.jsonl").read_text()
    monkeypatch.setattr(compare, "launch", lambda *a, **k: pytest.fail("a run was launched"))
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: 1.0)
    with folder_locked_by_another_process(run_dir):
        grid = [f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1"]
        with pytest.raises(ValueError, match="a train.py is still running in") as error:
            compare.main(grid)
        assert str(run_dir) in str(error.value) and "\n" not in str(error.value)
        with pytest.raises(ValueError, match=r"holds an unfinished run, and .* stop it if it runs"):
            compare.main([*grid, f"--publish={publish}"])
    assert (run_dir / "log.jsonl").read_text() == log


def test_papers_comparisons_on_a_synthetic_sweep(tmp_path):
    """rd and delta are paired with attnres at the same res_blocks and value, rd_fixedv with rd and attnres;
    the sweep table and pictures come from those pairs; each run's settings record its value; commits."""
    runs = tmp_path / "compare" / "runs"
    sweep = ("n_layer", ["2", "4"])
    names = compare.select_runs("attnres,delta,rd,n_layer=4/rd_fixedv", sweep)
    finals = {"standard": [2.00, 2.10, 2.05], "attnres/res_blocks=0": [1.98, 2.06, 2.04],
              "delta/res_blocks=0": [1.95, 2.05, 2.00], "rd/res_blocks=0": [1.96, 2.03, 2.01],
              "rd_fixedv/res_blocks=0": [1.97, 2.05, 2.02]}
    for name in names:
        point, kind = compare.split_point(name)
        n_layer = int(point.split("=")[1])
        shift = 0.1 * (n_layer == 4)  # the deeper grid has other losses: pairs must stay within a value
        for seed in range(3):
            mode = compare.run_settings(name)["residual"]
            routing = routing_of(mode, seed=seed, n_layer=n_layer) if mode != "standard" else None
            write_log(runs / name / f"seed{seed}", [4.0, finals[kind][seed] - shift], routing,
                      commit="abc" if seed else "def")
    results = compare.write_results(tmp_path / "compare", compare.load_records(runs, names, range(3)), names, range(3),
                                    dict(command="python compare.py test", machine="test", max_iters=10))
    r = results["runs"]
    diff = lambda run, ref: [a - b for a, b in zip(finals[run], finals[ref])]
    for point in ("n_layer=2", "n_layer=4"):
        rd, delta = r[f"{point}/rd/res_blocks=0"]["paired"], r[f"{point}/delta/res_blocks=0"]["paired"]
        assert set(rd) == {f"{point}/standard", f"{point}/attnres/res_blocks=0"}
        assert rd[f"{point}/attnres/res_blocks=0"]["diff_nats"] == pytest.approx(diff("rd/res_blocks=0", "attnres/res_blocks=0"))
        assert rd[f"{point}/attnres/res_blocks=0"]["wins"] == 3
        assert delta[f"{point}/attnres/res_blocks=0"]["diff_nats"] == pytest.approx(diff("delta/res_blocks=0", "attnres/res_blocks=0"))
        assert delta[f"{point}/standard"]["diff_nats"] == pytest.approx(diff("delta/res_blocks=0", "standard"))
    fixed = r["n_layer=4/rd_fixedv/res_blocks=0"]
    assert fixed["settings"]["n_layer"] == 4 and fixed["settings"]["fixed_value_route"] is True
    assert fixed["paired"]["n_layer=4/rd/res_blocks=0"]["diff_nats"] == pytest.approx(diff("rd_fixedv/res_blocks=0", "rd/res_blocks=0"))
    assert fixed["paired"]["n_layer=4/rd/res_blocks=0"]["wins"] == 0
    assert list(fixed["paired"]) == ["n_layer=4/standard", "n_layer=4/rd/res_blocks=0", "n_layer=4/attnres/res_blocks=0"]
    assert r["n_layer=2/standard"]["settings"]["n_layer"] == 2 and results["points"] == ["n_layer=2", "n_layer=4"]
    assert results["commits"] == ["abc", "def"] and r["n_layer=2/standard"]["commits"] == ["abc", "def"]
    assert results["deepest"] == {"n_layer=2": "L1.mlp", "n_layer=4": "L3.mlp"}
    md = (tmp_path / "compare" / "results.md").read_text()
    p = lambda run, ref: compare.paired(dict(enumerate(finals[run])), dict(enumerate(finals[ref])))
    cell = lambda q: f"{q['diff_nats_mean']:+.3f} ± {q['diff_nats_std']:.3f} ({q['wins']}/3)"
    row = p("rd/res_blocks=0", "attnres/res_blocks=0")
    assert f"| rd/res_blocks=0 | attnres/res_blocks=0 | {cell(row)} | {cell(row)} |" in md
    row = p("rd_fixedv/res_blocks=0", "rd/res_blocks=0")
    assert f"| rd_fixedv/res_blocks=0 | rd/res_blocks=0 |  | {cell(row)} |" in md
    for f in ("sweep_val_loss.png", "sweep_max_weight.png", "val_loss_n_layer2.png", "val_loss_n_layer4.png",
              "max_weight_by_depth_n_layer4.png", "routing_n_layer4_rd_fixedv_res_blocks0.png"):
        assert (tmp_path / "compare" / f).stat().st_size > 0, f


def test_partial_grid_reports_what_exists(tmp_path):
    runs = tmp_path / "runs"
    write_log(runs / "standard" / "seed0", [3.0, 2.0])
    write_log(runs / "standard" / "seed1", [3.0, 2.2])
    write_log(runs / "attnres/res_blocks=0" / "seed0", [3.0, 1.9], routing_of("attnres"))
    names = ["standard", "attnres/res_blocks=0"]
    r = compare.aggregate(compare.load_records(runs, names, [0, 1]), names)
    assert r["attnres/res_blocks=0"]["paired"]["standard"]["seeds"] == [0]
    assert r["attnres/res_blocks=0"]["paired"]["standard"]["diff_nats_std"] is None


def write_scores(run_dir, scores, tasks=("tiny_choice",), limit=None):
    """ckpt.eval.json as eval.py writes it: the harness's results dict, {"task/metric": value} given."""
    results, better = {}, {}
    for name, value in scores.items():
        task, metric = name.split("/")
        results.setdefault(task, {"alias": task})[f"{metric},none"] = value
        results[task][f"{metric}_stderr,none"] = 0.01
        better.setdefault(task, {})[metric] = metric != "word_perplexity"
    record = dict(tasks=list(tasks), limit=limit, harness=dict(results=results, higher_is_better=better))
    (run_dir / "ckpt.eval.json").write_text(json.dumps(record))


def test_task_scores_are_paired_like_val_loss(tmp_path):
    """Each run's eval.py scores become columns: mean ± std over seeds, and per reference the paired
    difference and the wins, a win being a higher accuracy but a lower perplexity."""
    runs = tmp_path / "compare" / "runs"
    names = ["standard", "rd/res_blocks=0"]
    acc = {"standard": [0.25, 0.30, 0.28], "rd/res_blocks=0": [0.27, 0.29, 0.31]}
    ppl = {"standard": [50.0, 40.0, 45.0], "rd/res_blocks=0": [48.0, 41.0, 44.0]}
    for name in names:
        for seed in range(3):
            write_log(runs / name / f"seed{seed}", [3.0, 2.0])
            write_scores(runs / name / f"seed{seed}", {"tiny_choice/acc": acc[name][seed],
                                                       "tiny_rolling/word_perplexity": ppl[name][seed]})
    results = compare.write_results(tmp_path / "compare", compare.load_records(runs, names, range(3)), names, range(3),
                                    dict(command="python compare.py test", machine="test", max_iters=10))
    rd = results["runs"]["rd/res_blocks=0"]["scores"]
    assert rd["tiny_choice/acc"]["mean"] == pytest.approx(0.29) and rd["tiny_choice/acc"]["higher_is_better"]
    p = rd["tiny_choice/acc"]["paired"]["standard"]
    assert p["diff"] == pytest.approx([0.02, -0.01, 0.03]) and p["wins"] == 2
    q = rd["tiny_rolling/word_perplexity"]["paired"]["standard"]
    assert q["diff"] == pytest.approx([-2.0, 1.0, -1.0]) and q["wins"] == 2
    assert results["runs"]["standard"]["scores"]["tiny_choice/acc"]["paired"] == {}
    md = (tmp_path / "compare" / "results.md").read_text()
    assert "| run | vs | tiny_choice/acc ↑ | Δ (wins) | tiny_rolling/word_perplexity ↓ | Δ (wins) |" in md
    assert "| rd/res_blocks=0 | standard | 0.2900 ± 0.0200 | +0.0133 ± 0.0208 (2/3) | 44.3333 ± 3.5119 | -0.6667 ± 1.5275 (2/3) |" in md

def test_a_tied_score_is_no_win_and_a_seed_without_a_metric_is_left_out():
    """Downstream wins count seeds where the run scores better, a tie being none (as for val loss); a
    seed scored on fewer tasks (before the task list grew, reported with --report=True) is left out of
    that metric's mean and pairing, not an error."""
    acc = {"standard": [0.5, 0.5, 0.8], "rd/res_blocks=0": [0.5, 0.6, 0.7]}
    records = {name: {seed: {"scores": {"tiny_choice/acc": (acc[name][seed], True),
                                        **({"tiny_rolling/word_perplexity": (40.0 + seed + (name == "standard"), False)}
                                           if seed < 2 else {})}}
                      for seed in range(3)} for name in acc}
    scores = compare.aggregate_scores(records, "rd/res_blocks=0", ["standard"])
    p = scores["tiny_choice/acc"]["paired"]["standard"]
    assert p["diff"] == pytest.approx([0.0, 0.1, -0.1]) and p["wins"] == 1
    ppl = scores["tiny_rolling/word_perplexity"]
    assert ppl["value"] == {0: 40.0, 1: 41.0} and ppl["mean"] == 40.5 and ppl["std"] == pytest.approx(math.sqrt(0.5))
    assert ppl["paired"]["standard"]["seeds"] == [0, 1] and ppl["paired"]["standard"]["wins"] == 2


def test_routing_is_the_final_evals_averaged_over_seeds():
    """A run's routing is its last eval's (not an earlier one's), and every route's max weight, like its
    depth weights, is the mean over seeds (the max-weight-by-depth picture draws it)."""
    early, final, other = routing_of("delta", seed=0), routing_of("delta", seed=1), routing_of("delta", seed=2)
    events = [{"event": "start", "iter": 0, "config": {}},
              {"event": "eval", "iter": 0, "val_loss": 3.0, "routing": early},
              {"event": "eval", "iter": 10, "val_loss": 2.0, "routing": final},
              {"event": "done", "iter": 10, "val_loss": 2.0, "elapsed_s": 5.0}]
    assert compare.run_record(events)["routing"] == final
    mean = compare.mean_routing([final, other])
    assert set(mean["max_weight"]) == {route for route in final if "max_weight" in final[route]} == {"L0.mlp", "L1.attn", "L1.mlp"}
    for route in mean["max_weight"]:  # (L0.attn has one source, the embedding: no max weight)
        assert mean["max_weight"][route] == pytest.approx((final[route]["max_weight"] + other[route]["max_weight"]) / 2)
    for route in final:
        assert mean["weights"][route] == pytest.approx(np.mean([final[route]["weights"], other[route]["weights"]], axis=0))
    assert final["L1.mlp"]["max_weight"] != pytest.approx(other["L1.mlp"]["max_weight"])  # (the seeds differ)


def test_routing_summary_numbers_are_means_over_seeds():
    """results.md's deep max weight, deep entropy and JS(QK, V) of a run are each the mean of its seeds' values."""
    seeds = [routing_of("rd", seed=s) for s in range(3)]
    mean = compare.mean_routing(seeds)
    # n_layer=2: the deepest sublayer route is L1.mlp; JS is each seed's mean over the routes that have one
    assert mean["deepest"] == "L1.mlp"
    for key, per_seed in (("deep_max_weight", [r["L1.mlp"]["max_weight"] for r in seeds]),
                          ("deep_entropy", [r["L1.mlp"]["entropy"] for r in seeds]),
                          ("mean_js", [np.mean([v["js_qk_v"] for v in r.values() if "js_qk_v" in v]) for r in seeds])):
        assert len(set(per_seed)) == 3  # (the seeds differ: no single seed's value is the mean)
        assert mean[key] == pytest.approx(sum(per_seed) / 3, abs=1e-12), key


def test_a_run_missing_seeds_says_so_and_its_time_is_the_mean(tmp_path):
    """results.md marks a mean over fewer seeds than the grid has ("1 of 3 seeds"), so that it is not read
    as the grid's; s/run is the mean of the runs' times."""
    runs = tmp_path / "runs"
    for seed, (val, seconds) in enumerate([(2.0, 10.0), (2.1, 20.0), (2.2, 60.0)]):
        write_log(runs / "standard" / f"seed{seed}", [3.0, val], elapsed_s=seconds)
    write_log(runs / "delta/res_blocks=0" / "seed0", [3.0, 1.9], elapsed_s=12.0)
    write_log(runs / "delta/res_blocks=0" / "seed1", [3.0], done=False)
    names = ["standard", "delta/res_blocks=0"]
    r = compare.aggregate(compare.load_records(runs, names, range(3)), names)
    assert r["standard"]["elapsed_s_mean"] == 30.0
    assert compare.table(dict(runs=r, seeds=[0, 1, 2])).splitlines()[2:] == [
        "| standard |  | 2.1000 ± 0.1000 |  |  |  | 30 |",
        "| delta/res_blocks=0 | standard | 1.9000 (1 of 3 seeds) | -0.1000 | -9.52% | 1/1 | 12 |"]


def test_runs_trained_here_that_logs_place_on_two_machines_are_not_relabelled():
    """Even when this command trained every run, logs that name two machines (a run begun elsewhere and
    continued here keeps its first machine) are reported as two, not as this machine."""
    runs = {"standard": {"machines": ["CPU A"]}, "rd/res_blocks=0": {"machines": ["CPU A", "CPU B"]}}
    assert compare.trained_on(runs, True, "CPU B (2 cores)") == "2 machines: CPU A; CPU B"
    assert compare.trained_on({"standard": {"machines": ["CPU B"]}}, True, "CPU B (2 cores)") == "CPU B (2 cores)"
    assert compare.trained_on({"standard": {"machines": ["CPU A"]}}, False, "CPU B (2 cores)") == "CPU A"


# -----------------------------------------------------------------------------
# the paired protocol: same seed, same backbone, same batches

@pytest.mark.parametrize("res_blocks", [0, 2])
def test_same_seed_same_backbone(res_blocks):
    """Every mode, built as train.py builds it (torch.manual_seed(seed); GPT(config)), starts from the
    standard model's weights: the pseudo-queries are zeros and take no random numbers."""
    def build(**kw):
        torch.manual_seed(7)
        return GPT(tiny_config(**kw)).state_dict()
    ref = build()
    for kw in (dict(residual="attnres"), dict(residual="delta"), dict(residual="rd")):
        state = build(res_blocks=res_blocks, **kw)
        backbone = {k: v for k, v in state.items() if "res_query" not in k}
        assert backbone.keys() == ref.keys()
        for k in ref:
            assert torch.equal(backbone[k], ref[k]), k
        assert all(torch.all(v == 0) for k, v in state.items() if "res_query" in k)
    lowrank = [build(lowrank_rank=8, dlr=dlr) for dlr in (False, True)]  # DLR has no parameters of its own
    assert lowrank[0].keys() == lowrank[1].keys()
    assert all(torch.equal(lowrank[0][k], lowrank[1][k]) for k in lowrank[0])


# -----------------------------------------------------------------------------
# resuming a grid

def test_finished_runs_are_not_rerun(tmp_path, capsys):
    """A grid whose runs all have a `done` event trains nothing (train.py is not even started) and
    only aggregates; a run that finished with other train.py arguments is an error, not a silent mix."""
    runs = tmp_path / "compare" / "runs"
    for name, seed in [("standard", 0), ("standard", 1), ("delta/res_blocks=0", 0), ("delta/res_blocks=0", 1)]:
        write_log(runs / name / f"seed{seed}", [3.0, 2.0 - 0.1 * (name != "standard")],
                  routing_of("delta") if name != "standard" else None)
    before = {p: p.read_text() for p in runs.rglob("log.jsonl")}
    results = compare.main([f"--out_dir={tmp_path}", "--seeds=2", "--runs=delta"])
    assert "0 to train" in capsys.readouterr().out
    assert {p: p.read_text() for p in runs.rglob("log.jsonl")} == before
    assert not list(runs.rglob("train.log"))
    assert results["runs"]["delta/res_blocks=0"]["paired"]["standard"]["wins"] == 2

    (runs / "standard" / "seed0" / "train_args.json").write_text(json.dumps(["--max_iters=1"]) + "\n")
    with pytest.raises(ValueError, match="finished with other train.py arguments"):
        compare.main([f"--out_dir={tmp_path}", "--seeds=2", "--runs=delta"])


def test_a_finished_run_whose_config_file_changed_is_refused(tmp_path, capsys):
    """train_args.json names the config file, not what it says: a finished run whose log records another
    value of a setting the file now gives is refused (it would be mixed with runs of the new value), with
    advice that works under --publish too (the published copy would come back); device, dtype and
    vocab_size=0 are recorded resolved (auto -> cpu, 0 -> the data's), so they are not compared."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text("learning_rate = 1e-3\nbeta1 = 0.9\ndevice = 'auto'\nvocab_size = 0\n")
    runs, publish = tmp_path / "compare" / "runs", tmp_path / "published"
    for seed in (0, 1):  # vocab_size 0 is "from the data": a run started from a checkpoint records the model's
        write_log(runs / "standard" / f"seed{seed}", [3.0, 2.0],
                  config=dict(learning_rate=1e-3, beta1=0.9, device="cpu", vocab_size=64))
    command = [str(cfg), f"--out_dir={tmp_path}", "--seeds=2", "--runs=standard", f"--publish={publish}"]
    compare.main(command)
    assert "2 done, 0 to train" in capsys.readouterr().out
    cfg.write_text("learning_rate = 3e-2\nbeta1 = 0.9\ndevice = 'auto'\nvocab_size = 0\n")
    with pytest.raises(ValueError) as e:
        compare.main(command)
    seed0 = runs / "standard" / "seed0"
    assert str(e.value) == (f"{seed0} finished with learning_rate=0.001, but {cfg} now gives learning_rate=0.03: use another "
                            f"--out_dir and --publish folder, or delete {seed0} and {publish / 'runs' / 'standard' / 'seed0'} "
                            "to retrain it")


def test_a_run_continues_only_with_its_checkpoint_arguments_and_code(tmp_path):
    """What makes an unfinished run continue rather than start over: a checkpoint, the same train.py
    settings (in any order) and the same code (the repository's .py files and the config file, committed
    or not). A checkpoint the grid cannot continue is a one-line error that says what differs and what
    to do; compare.py never deletes it."""
    config = tmp_path / "config.py"
    config.write_text("n_layer = 2\n")
    run_dir, code = tmp_path / "run", compare.code_digest(config)
    args = [str(config), "--seed=0", "--residual=rd", "--max_iters=40000", "--eval_interval=500"]
    run_dir.mkdir()
    (run_dir / "train_args.json").write_text(json.dumps(args))
    (run_dir / "code.sha256").write_text(code + "\n")
    assert not compare.resumable(run_dir, args, code)  # no checkpoint yet: nothing to lose by starting over
    (run_dir / "ckpt.pt").write_bytes(b"work")
    assert compare.resumable(run_dir, args, code)
    assert compare.resumable(run_dir, [str(config), "--seed=0", "--residual=rd", "--eval_interval=500", "--max_iters=40000"], code)
    assert compare.resumable(run_dir, [*args, "--n_layer=2"], code)  # what the config file says anyway
    other = [str(config), "--seed=1", "--residual=rd", "--eval_interval=500", "--max_iters=50000"]
    with pytest.raises(ValueError, match=rf"^{run_dir} holds a checkpoint of a run begun with other train.py settings: "
                                         r"max_iters=40000 \(now 50000\); seed=0 \(now 1\)\. To continue it, run the grid "
                                         rf"with its settings again; to train it anew, delete or move {run_dir} yourself"):
        compare.resumable(run_dir, other, code)
    with pytest.raises(ValueError, match=rf"settings: config file {config} \(now none\)\."):
        compare.resumable(run_dir, args[1:], code)
    config.write_text("n_layer = 3\n")
    assert compare.code_digest(config) != code
    with pytest.raises(ValueError, match="holds a checkpoint that cannot continue under this code"):
        compare.resumable(run_dir, args, compare.code_digest(config))
    (run_dir / "train_args.json").write_text('["--seed=0", "--resi')  # damaged: the error names the file
    with pytest.raises(ValueError, match=rf"^{run_dir / 'train_args.json'} is damaged \("):
        compare.resumable(run_dir, args, code)
    assert (run_dir / "ckpt.pt").read_bytes() == b"work"


def test_a_checkpoint_is_continued_whatever_the_order_of_the_flags(tmp_path, capsys, monkeypatch):
    """The same grid command with its flags in another order continues an interrupted run from its
    checkpoint (it used to delete it and start again from 0); one with other settings stops before
    anything trains, saying what differs, and keeps the run's checkpoint and log."""
    runs = tmp_path / "compare" / "runs"
    write_log(runs / "standard" / "seed0", [3.0, 2.0])  # finished: its time is the estimate, no timing probe
    stopped = runs / "standard" / "seed1"
    write_log(stopped, [3.0], done=False)
    (stopped / "ckpt.pt").write_bytes(b"work")
    grid = [f"--out_dir={tmp_path}", "--runs=standard", "--seeds=2"]
    began = compare.train_args(None, stopped, 1, "standard", ["--max_iters=40000", "--eval_interval=500"])
    (stopped / "train_args.json").write_text(json.dumps(began))
    (stopped / "code.sha256").write_text(compare.code_digest(None) + "\n")
    launched = []

    def train_py(cmd, run_dir, env, append=False):  # train.py, finishing the run at once
        launched.append(cmd)
        with open(run_dir / "log.jsonl", "a") as log:
            log.write(json.dumps({"event": "done", "iter": 10, "val_loss": 1.9, "elapsed_s": 20.0}) + "\n")
        return SimpleNamespace(poll=lambda: 0, returncode=0)
    monkeypatch.setattr(compare, "launch", train_py)
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))

    log = (stopped / "log.jsonl").read_text()
    with pytest.raises(ValueError, match=r"begun with other train.py settings: max_iters=40000 \(now 50000\)\."):
        compare.main([*grid, "--eval_interval=500", "--max_iters=50000"])
    assert not launched and (stopped / "ckpt.pt").read_bytes() == b"work" and (stopped / "log.jsonl").read_text() == log

    results = compare.main([*grid, "--eval_interval=500", "--max_iters=40000"])
    assert [cmd[-1] for cmd in launched] == ["--init_from=resume"] and (stopped / "ckpt.pt").read_bytes() == b"work"
    assert (stopped / "log.jsonl").read_text().startswith(log) and results["runs"]["standard"]["val_loss"] == {0: 2.0, 1: 1.9}
    assert "1 done, 1 to train" in capsys.readouterr().out
    compare.main([*grid, "--eval_interval=500", "--max_iters=40000", "--report=True"])  # finished, in any order
    assert "2 done, 0 to train" in capsys.readouterr().out


def test_a_finished_run_is_checked_against_every_setting_the_grid_gives(tmp_path, capsys):
    """A finished run without train_args.json (trained before compare.py wrote one) is checked against
    its log's start line: the command line's settings and the run's own as well as the config file's, so
    a run trained with other ones is refused, not reported under this command's settings. A damaged
    train_args.json is named, with what to do."""
    run_dir = tmp_path / "compare" / "runs" / "standard" / "seed0"
    recorded = dict(compare.TRAIN_DEFAULTS, device="cpu", dtype="float32", vocab_size=64)  # train.py's start line
    write_log(run_dir, [3.0, 2.0], config=dict(recorded, n_embd=32, max_iters=10, seed=0, residual="standard"))
    grid = [f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1", "--report=True"]
    with pytest.raises(ValueError) as e:
        compare.main([*grid, "--max_iters=500", "--n_embd=64"])
    assert str(e.value) == (f"{run_dir} finished with max_iters=10, but the command line now gives max_iters=500: use "
                            f"another --out_dir, or delete {run_dir} to retrain it")
    compare.main([*grid, "--n_embd=32", "--max_iters=10"])  # its own settings, in any order
    assert "1 done, 0 to train" in capsys.readouterr().out
    write_log(run_dir, [3.0, 2.0], config=dict(recorded, max_iters=10, seed=0, residual="delta"))
    with pytest.raises(ValueError, match="finished with residual='delta', but the run standard seed0 now gives residual='standard'"):
        compare.main([*grid, "--max_iters=10"])

    write_log(run_dir, [3.0, 2.0], config=dict(recorded, max_iters=10, eval_iters=5, seed=0, residual="standard"))
    (run_dir / "train_args.json").write_text("[bad\n")
    with pytest.raises(ValueError, match=rf"^{run_dir / 'train_args.json'} is damaged \(Expecting value.*\): delete it to "
                                         "have the run checked against its log, or use another --out_dir"):
        compare.main([*grid, "--max_iters=10"])
    args = compare.train_args(None, run_dir, 0, "standard", ["--max_iters=10", "--eval_iters=5"])
    (run_dir / "train_args.json").write_text(json.dumps(args) + "\n")
    compare.main([*grid, "--eval_iters=5", "--max_iters=10"])  # the same arguments in another order
    with pytest.raises(ValueError, match=r"^\S+ finished with other train.py arguments \(eval_iters=5 \(now 20\)\): use"):
        compare.main([*grid, "--max_iters=10"])

def test_a_checkpoint_without_its_arguments_or_code_record_is_kept_not_started_over(tmp_path, monkeypatch):
    """A checkpoint whose train_args.json or code.sha256 is missing cannot be checked, so it is an error that
    names the file, never "no checkpoint to continue": the grid would start the run over and delete it."""
    run_dir, code = tmp_path / "run", compare.code_digest(None)
    args = compare.train_args(None, run_dir, 0, "standard", [])
    run_dir.mkdir()
    (run_dir / "ckpt.pt").write_bytes(b"work")
    (run_dir / "code.sha256").write_text(code + "\n")
    with pytest.raises(ValueError, match=rf"^cannot read {run_dir / 'train_args.json'} \(No such file or directory\), so "
                                         "what the run trains is unknown: to train it anew, delete or move"):
        compare.resumable(run_dir, args, code)
    (run_dir / "train_args.json").write_text(json.dumps(args))
    (run_dir / "code.sha256").unlink()
    with pytest.raises(ValueError, match=rf"{run_dir / 'code.sha256'} is missing: the code it began with is unknown"):
        compare.resumable(run_dir, args, code)

    stopped = tmp_path / "compare" / "runs" / "standard" / "seed0"  # the same through the grid: nothing trains
    shutil.copytree(run_dir, stopped)
    monkeypatch.setattr(compare, "launch", lambda *a, **k: pytest.fail("a run was launched"))
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: 1.0)
    with pytest.raises(ValueError, match="code.sha256 is missing"):
        compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1"])
    assert (stopped / "ckpt.pt").read_bytes() == b"work"


def test_runs_begun_with_a_key_or_value_train_py_no_longer_takes_differ_from_the_grid():
    """train_args.json may hold a key train.py has since dropped, or a value it now refuses: kept as written,
    it differs from what the grid gives now (so such a checkpoint is not continued as if it were the same run)."""
    assert compare.differing_args(["--seed=0", "--old_key=1"], ["--seed=0"]) == ["old_key='1' (now unset)"]
    assert compare.differing_args(["--seed=0"], ["--seed=0", "--old_key=1"]) == ["old_key=unset (now '1')"]
    assert compare.differing_args(["--max_iters=forty"], []) == ["max_iters='forty' (now 2000)"]
    assert compare.differing_args(["--max_iters=40", "--seed=0"], ["--seed=0", "--max_iters=40"]) == []


def test_a_config_file_is_one_file_however_its_path_is_spelled():
    """config/x.py and ./config/x.py name one file: a run begun with one is the grid's run under the other."""
    config = "config/train_shakespeare_char.py"
    assert compare.differing_args([config, "--seed=0"], [f"./{config}", "--seed=0"]) == []
    assert compare.differing_args([config], ["config/train_gpt2_fineweb.py"]) == [
        f"config file {config} (now config/train_gpt2_fineweb.py)"]


def test_a_finished_run_is_not_refused_for_the_dtype_it_resolved(tmp_path):
    """dtype=auto is recorded resolved (float32 on a CPU): a finished run is not refused for it, while an
    explicit other dtype is a change."""
    run_dir = tmp_path / "standard" / "seed0"
    write_log(run_dir, [3.0, 2.0], config=dict(compare.TRAIN_DEFAULTS, device="cpu", dtype="float32", vocab_size=64,
                                               seed=0, residual="standard"))
    assert compare.changed_setting(None, run_dir, 0, "standard", ["--dtype=auto", "--device=auto"], "retrain") is None
    assert compare.changed_setting(None, run_dir, 0, "standard", ["--dtype=bfloat16"], "retrain") == (
        "dtype", "float32", "bfloat16", "the command line")


class FakeTrain:
    """compare.launch's stand-in: train.py that finishes (or fails, for the seeds in `fail`) after `polls`
    polls, appending a `done` line to the run's log; `launched` lists the (run, seed) it started."""
    def __init__(self, fail=(), polls=1):
        self.fail, self.polls, self.launched = set(fail), polls, []

    def __call__(self, cmd, run_dir, env, append=False):
        seed = int(run_dir.name.removeprefix("seed"))
        self.launched.append((run_dir.parent.name, seed))
        left = [self.polls]

        def poll():
            left[0] -= 1
            if left[0] > 0:
                return None
            if seed in self.fail:
                (run_dir / "train.log").write_text("error: the loss is nan\n")
                proc.returncode = 1
            else:
                with open(run_dir / "log.jsonl", "a") as log:
                    log.write(json.dumps({"event": "done", "iter": 10, "val_loss": 2.0, "elapsed_s": 1.0}) + "\n")
                proc.returncode = 0
            return proc.returncode
        proc = SimpleNamespace(poll=poll, returncode=None, send_signal=lambda sig: None, wait=lambda: None)
        return proc


def test_a_checkpoint_the_grid_cannot_continue_stops_it_before_any_run(tmp_path, monkeypatch):
    """Every unfinished run's checkpoint is checked before the first run starts: one begun with other
    settings stops the grid before it trains anything, not after the runs queued before it."""
    runs = tmp_path / "compare" / "runs"
    stopped = runs / "standard" / "seed1"
    write_log(stopped, [3.0], done=False)
    (stopped / "ckpt.pt").write_bytes(b"work")
    (stopped / "train_args.json").write_text(json.dumps(compare.train_args(None, stopped, 1, "standard", ["--max_iters=7"])))
    (stopped / "code.sha256").write_text(compare.code_digest(None) + "\n")
    train_py = FakeTrain()
    monkeypatch.setattr(compare, "launch", train_py)
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: 1.0)
    with pytest.raises(ValueError, match=rf"^{stopped} holds a checkpoint of a run begun with other train.py settings: "
                                         r"max_iters=7 \(now 2000\)"):
        compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=2"])
    assert train_py.launched == [] and (stopped / "ckpt.pt").read_bytes() == b"work"


def test_after_a_failed_run_the_running_ones_finish_and_no_queued_run_starts(tmp_path, monkeypatch, capsys):
    """--jobs=2: when one run fails, the one running beside it finishes, the queued ones never start (a
    slot freed after the failure takes no new run), and the grid ends with the failure."""
    train_py = FakeTrain(fail={0}, polls=1)
    slow = FakeTrain(polls=4)  # seed 1: still running when seed 0 fails
    monkeypatch.setattr(compare, "launch", lambda cmd, run_dir, env, append=False:
                        (slow if run_dir.name == "seed1" else train_py)(cmd, run_dir, env, append))
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: 1.0)
    with pytest.raises(RuntimeError, match=r"^train.py failed \(exit code 1\); the end of .*seed0/train.log:\n  error: the loss is nan"):
        compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=3", "--jobs=2"])
    assert train_py.launched + slow.launched == [("standard", 0), ("standard", 1)]
    runs = tmp_path / "compare" / "runs" / "standard"
    assert compare.finished(compare.read_log(runs / "seed1")) and not (runs / "seed2").exists()
    assert "[1/3] standard seed1" in capsys.readouterr().out



def test_a_stopped_grid_stops_its_timing_probe(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM while a timing probe runs: the probe's train.py is ended with the grid, not left
    training in its temporary folder."""
    class Probe:
        killed = False
        def wait(self):
            if not self.killed:
                raise KeyboardInterrupt
        def kill(self):
            self.killed = True
    probe = Probe()
    monkeypatch.setattr(compare, "launch", lambda *a, **k: probe)
    with pytest.raises(KeyboardInterrupt):
        compare.estimate_run_s(None, "standard", [f"--out_dir={tmp_path}"], {})
    assert probe.killed

def test_an_output_folder_that_cannot_be_written_stops_the_grid_at_once(tmp_path, monkeypatch):
    """--out_dir or --publish where no folder can be made (here under a file, which stops root too) is a
    one-line error before anything runs: no timing probe first, no traceback after the runs."""
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=rf"^cannot write {tmp_path}/file/out/compare \(--out_dir\): {tmp_path}/file is a "
                                         "file, not a folder; give --out_dir a folder you can write$"):
        compare.main([f"--out_dir={tmp_path / 'file' / 'out'}", "--runs=standard", "--seeds=1"])
    write_log(tmp_path / "compare" / "runs" / "standard" / "seed0", [3.0, 2.0])
    with pytest.raises(ValueError, match=rf"^cannot write {tmp_path}/file/pub \(--publish\): {tmp_path}/file is a file"):
        compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1", f"--publish={tmp_path / 'file' / 'pub'}"])
    assert not (tmp_path / "compare" / "results.md").exists()


def test_publish_into_the_grids_own_folder_is_refused_before_any_run(tmp_path, monkeypatch):
    """--publish in <out_dir>/compare, where the runs and results it would copy lie, is a one-line error before
    anything runs, however the path is spelled (relative, through a symlink): it used to train the grid, then
    fail copying each file onto itself, and again at every rerun."""
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "compare", target_is_directory=True)
    for publish in (tmp_path / "compare", "compare", "./compare/../compare/pub", tmp_path / "link" / "runs"):
        with pytest.raises(ValueError, match=f"^--publish={re.escape(str(publish))} is in the grid's own folder "
                                             f"{re.escape(str(tmp_path / 'compare'))}, .*: publish them elsewhere"):
            compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1", f"--publish={publish}"])
    assert not (tmp_path / "compare" / "runs").exists()


def test_a_write_that_fails_mid_grid_is_one_line(tmp_path):
    """A file compare.py cannot write once it has begun (a full disk; here results.md taken by a folder)
    ends it with one line naming the file, not a traceback."""
    write_log(tmp_path / "compare" / "runs" / "standard" / "seed0", [3.0, 2.0])
    (tmp_path / "compare" / "results.md").mkdir()
    run = subprocess.run([sys.executable, str(ROOT / "compare.py"), f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1"],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **ONE_THREAD})
    assert run.returncode == 1 and run.stderr == (f"error: Is a directory: {tmp_path / 'compare' / 'results.md'}: fix that, "
                                                  "then run the same command again to resume the grid\n"), run.stderr


def test_eval_tasks_score_every_finished_run(tmp_path, capsys, monkeypatch):
    """--eval_tasks runs eval.py on each finished run's checkpoint (here with a local task), its scores
    become the runs' columns and are published beside their logs; a rerun scores nothing again."""
    pytest.importorskip("lm_eval", reason="--eval_tasks runs lm-evaluation-harness: pip install lm-eval")
    from checkpoint import model_args, save_checkpoint
    from helpers import write_tasks
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    runs = tmp_path / "compare" / "runs"
    for name, residual in (("standard", "standard"), ("delta/res_blocks=0", "delta")):
        torch.manual_seed(0)
        model = randomise_queries(GPT(tiny_config(residual=residual, vocab_size=256, block_size=32)))
        write_log(runs / name / "seed0", [3.0, 2.0])
        save_checkpoint({"model": model.state_dict(), "model_args": model_args(model), "config": {},
                         "dataset_meta": {"tokenizer": "bytes"}}, runs / name / "seed0" / "ckpt.pt")
    argv = [f"--out_dir={tmp_path}", "--seeds=1", "--runs=delta", "--eval_tasks=tiny_choice", "--eval_limit=3",
            f"--eval_include_path={write_tasks(tmp_path)}", f"--publish={tmp_path / 'published'}"]
    results = compare.main(argv)
    out = capsys.readouterr().out
    assert "scoring 2 runs on tiny_choice" in out and "[eval 2/2] delta/res_blocks=0 seed0: tiny_choice/acc" in out
    for name in ("standard", "delta/res_blocks=0"):
        record = json.loads((runs / name / "seed0" / "ckpt.eval.json").read_text())
        assert record["limit"] == 3 and record["harness"]["n-samples"]["tiny_choice"]["effective"] == 3
        assert results["runs"][name]["scores"]["tiny_choice/acc"]["value"] == {0: record["scores"]["tiny_choice/acc"]}
        assert (tmp_path / "published" / "runs" / name / "seed0" / "ckpt.eval.json").exists()
    p = results["runs"]["delta/res_blocks=0"]["scores"]["tiny_choice/acc_norm"]["paired"]["standard"]
    assert p["n"] == 1 and "tiny_choice/acc_norm ↑" in (tmp_path / "compare" / "results.md").read_text()
    logs = {p: p.stat().st_mtime_ns for p in runs.rglob("eval.log")}
    compare.main(argv)
    assert "scoring" not in capsys.readouterr().out and {p: p.stat().st_mtime_ns for p in logs} == logs


def test_eval_tasks_and_include_path_are_checked_before_any_run(tmp_path, monkeypatch):
    """A task eval.py does not know, or an --eval_include_path that is no folder, is eval.py's one-line error
    (with compare.py's option name) before anything runs: it used to come after the whole grid had trained."""
    pytest.importorskip("lm_eval", reason="--eval_tasks runs lm-evaluation-harness: pip install lm-eval")
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))
    argv = [f"--out_dir={tmp_path}", "--runs=standard", "--seeds=1"]
    with pytest.raises(ValueError, match=r"^unknown task 'hellaswagg' \(did you mean hellaswag, .*\): `lm-eval ls tasks` "
                                         "lists the harness's tasks; --eval_include_path=DIR adds task YAMLs of your own$"):
        compare.main(argv + ["--eval_tasks=hellaswagg"])
    run = subprocess.run([sys.executable, str(ROOT / "compare.py"), *argv, "--eval_tasks=tiny_choice",
                          "--eval_include_path=nowhere"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, **ONE_THREAD})
    assert run.returncode == 1 and run.stderr == "error: --eval_include_path=nowhere: no such folder\n", run.stderr
    assert not (tmp_path / "compare" / "runs").exists()


def test_the_tasks_are_looked_up_only_where_a_run_is_left_to_score(tmp_path, monkeypatch):
    """lm-eval's task index takes 10-20 s: a rerun whose every run has finished and is scored on these tasks and
    limit (nothing to train or score) does not check the task names; a run left to train, or one scored with
    another limit, has them checked before anything runs."""
    pytest.importorskip("lm_eval", reason="--eval_tasks runs lm-evaluation-harness: pip install lm-eval")
    run_dir = tmp_path / "compare" / "runs" / "standard" / "seed0"
    write_log(run_dir, [3.0, 2.0])
    write_scores(run_dir, {"tiny_choice/acc": 0.3}, tasks=("tiny_choice",), limit=None)

    def check_tasks(tasks, include_path):
        raise ValueError(f"checked {','.join(tasks)}")
    monkeypatch.setattr(compare, "check_tasks", check_tasks)
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))
    argv = [f"--out_dir={tmp_path}", "--runs=standard", "--eval_tasks=tiny_choice"]
    results = compare.main(argv + ["--seeds=1"])
    assert results["runs"]["standard"]["scores"]["tiny_choice/acc"]["mean"] == 0.3
    for more in (["--seeds=2"], ["--seeds=1", "--eval_limit=3"]):
        with pytest.raises(ValueError, match="^checked tiny_choice$"):
            compare.main(argv + more)


def test_a_run_is_scored_again_only_for_other_tasks_or_another_limit(tmp_path):
    """eval.py's scores are kept when they are for the same tasks and limit (--eval_limit=0: all examples,
    recorded as no limit); other tasks or another limit score the run again (here: no checkpoint to score)."""
    runs = tmp_path / "runs"
    write_log(runs / "standard" / "seed0", [3.0, 2.0])
    write_scores(runs / "standard" / "seed0", {"tiny_choice/acc": 0.3}, tasks=("tiny_choice",), limit=None)
    assert compare.evaluated(runs / "standard" / "seed0", ["tiny_choice"], None)
    assert not compare.evaluated(runs / "standard" / "seed0", ["tiny_choice"], 3)
    assert not compare.evaluated(runs / "standard" / "seed0", ["tiny_choice", "tiny_rolling"], None)
    scores = (runs / "standard" / "seed0" / "ckpt.eval.json").read_text()
    for damaged in ('{"tasks": ["tiny_choice"], "limit": null, "harness": {"results": "x"}}', "[]"):
        (runs / "standard" / "seed0" / "ckpt.eval.json").write_text(damaged)  # not eval.py's: scored again
        assert not compare.evaluated(runs / "standard" / "seed0", ["tiny_choice"], None)
    (runs / "standard" / "seed0" / "ckpt.eval.json").write_text(scores)
    options = dict(compare.OPTIONS, eval_tasks="tiny_choice", eval_limit=0)
    compare.evaluate_runs([("standard", 0)], runs, options, {}, None)  # scored: nothing to run
    for other in (dict(eval_limit=3), dict(eval_tasks="tiny_choice,tiny_rolling")):
        with pytest.raises(RuntimeError, match="has no ckpt.pt to score"):
            compare.evaluate_runs([("standard", 0)], runs, dict(options, **other), {}, None)


def test_report_publishes_only_the_finished_runs(tmp_path, capsys):
    """--report=True --publish on a grid still training publishes the runs finished so far, not the
    unfinished ones (a published log is whole: its `done` line means finished)."""
    runs, published = tmp_path / "compare" / "runs", tmp_path / "published"
    write_log(runs / "standard" / "seed0", [3.0, 2.0])
    write_log(runs / "standard" / "seed1", [3.0], done=False)
    compare.main([f"--out_dir={tmp_path}", "--runs=standard", "--seeds=3", f"--publish={published}", "--report=True"])
    assert "1 done, 2 to train" in capsys.readouterr().out
    assert sorted(p.name for p in (published / "runs" / "standard").iterdir()) == ["seed0"]
    assert compare.finished(compare.read_log(published / "runs" / "standard" / "seed0"))


def test_a_damaged_log_or_scores_file_is_one_line_naming_it(tmp_path, monkeypatch):
    """A finished run's log.jsonl or ckpt.eval.json that the tables cannot read (edited or damaged by hand),
    or whose start event's settings the grid cannot check the run against, is one line that names the file
    and says what to do, with --report=True and on a rerun alike, and before any run trains: not a traceback
    (KeyError, TypeError, AttributeError) from the statistics, nor a run refused for training with '0' where
    the grid gives 0."""
    monkeypatch.setattr(compare, "estimate_run_s", lambda *a: pytest.fail("a timing probe ran"))
    monkeypatch.setattr(compare, "launch", lambda *a, **k: pytest.fail("a run trained"))
    routings = [routing_of("delta", seed=s) for s in range(2)]

    def grid(case):
        """A finished delta grid of two seeds in its own out_dir."""
        out = tmp_path / case
        for name in ("standard", "delta/res_blocks=0"):
            for seed in range(2):
                write_log(out / "compare" / "runs" / name / f"seed{seed}", [3.0, 2.0 - 0.1 * (name != "standard")],
                          routings[seed] if name != "standard" else None)
        return out, out / "compare" / "runs" / "delta/res_blocks=0" / "seed0"

    def edit(run_dir, change, event="done"):
        """change(event) on the run's last event of that kind, in its log."""
        events = compare.read_log(run_dir)
        change(next(e for e in reversed(events) if e["event"] == event))
        (run_dir / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    def refused(out, message, extra=(), reported=None):
        """The grid in out refused with message (reported: the one under --report=True, where it differs):
        reported, rerun, and rerun with a third seed to train (which the damage stops before its timing probe)."""
        for args in (["--seeds=2", "--report=True"], ["--seeds=2"], ["--seeds=3"]):
            with pytest.raises(ValueError, match=reported if reported and "--report=True" in args else message):
                compare.main([f"--out_dir={out}", "--runs=delta", *args, *extra])
        assert not (out / "compare" / "results.md").exists()

    logs = {"no val_loss": (lambda e: e.pop("val_loss"), "done", "its done event has val_loss=None, not a number"),
            "null val_loss": (lambda e: e.update(val_loss=None), "done", "its done event has val_loss=None, not a number"),
            "text val_loss": (lambda e: e.update(val_loss="2.0"), "done", "its done event has val_loss='2.0', not a number"),
            "text elapsed_s": (lambda e: e.update(elapsed_s="10"), "done", "its done event has elapsed_s='10', not a number"),
            "eval without val_loss": (lambda e: e.pop("val_loss"), "eval", "an eval event lacks a number for its iter or val_loss"),
            "empty route": (lambda e: e["routing"].update({"L1.mlp": {}}), "eval", "its last eval's routing has no weights for L1.mlp"),
            "text max_weight": (lambda e: e["routing"]["L1.mlp"].update(max_weight="high"), "eval",
                                "its last eval's routing of L1.mlp lacks a number for its max_weight or entropy"),
            "routing list": (lambda e: e.update(routing=[1, 2]), "eval", "its last eval's routing is not one entry per route"),
            # the start event's settings, which every finished run is checked against (changed_setting)
            "no config": (lambda e: e.pop("config"), "start", "its start event has no config"),
            "null config": (lambda e: e.update(config=None), "start", "its start event has no config"),
            "config list": (lambda e: e.update(config=[1]), "start", "its start event has config=[1], not train.py's settings"),
            "text seed": (lambda e: e["config"].update(seed="0"), "start", "its start event's config has seed='0', not an integer")}
    for case, (change, event, problem) in logs.items():
        out, run_dir = grid(case)
        edit(run_dir, change, event)
        refused(out, f"^{re.escape(str(run_dir / 'log.jsonl'))} is damaged \\({re.escape(problem)}\\): delete "
                     f"{re.escape(str(run_dir))} and run the grid's command again to retrain the run$")

    out, run_dir = grid("other routes")  # each log readable, but the seeds of one run route over other sources
    edit(run_dir.parent / "seed1", lambda e: e["routing"].pop("L0.attn"), "eval")
    refused(out, f"^{re.escape(str(run_dir / 'log.jsonl'))} and {re.escape(str(run_dir.parent / 'seed1' / 'log.jsonl'))} "
                 "hold routings of other routes or sources")

    out, run_dir = grid("published")  # a run published before: its copy goes too
    published = out / "pub" / "runs" / "delta/res_blocks=0" / "seed0"
    compare.publish_run(run_dir, published)
    edit(run_dir, lambda e: e.update(val_loss=None))
    refused(out, f"delete {re.escape(str(run_dir))} and {re.escape(str(published))} and run", [f"--publish={out / 'pub'}"])

    for i, (damaged, why) in enumerate((('{"harness": {"results": "x"}}', "no harness results in it"),
                                        ("[]", "no harness results in it"), ("{", "not JSON: "))):
        out, run_dir = grid(f"scores{i}")
        compare.eval_file(run_dir).write_text(damaged)
        named = f"^{re.escape(str(compare.eval_file(run_dir)))} is not eval.py's scores \\({re.escape(why)}.*\\): "
        refused(out, named + "delete it and run the grid's command again \\(with --eval_tasks, eval.py scores the run again\\)$",
                reported=named + "delete it and run the command again to report the run without scores; the grid's "
                                 "command with --eval_tasks and without --report=True scores it again$")  # (a report scores nothing)

    out, run_dir = grid("not an object")  # a line of another JSON value is skipped, as a cut one is
    (run_dir / "log.jsonl").write_text((run_dir / "log.jsonl").read_text() + "3\n")
    results = compare.main([f"--out_dir={out}", "--runs=delta", "--seeds=2", "--report=True"])
    assert set(results["runs"]["delta/res_blocks=0"]["val_loss"]) == {0, 1}

    out, run_dir = grid("one line")
    edit(run_dir, lambda e: e.pop("val_loss"))
    run = subprocess.run([sys.executable, str(ROOT / "compare.py"), f"--out_dir={out}", "--runs=delta", "--seeds=2",
                          "--report=True"], capture_output=True, text=True, env={**os.environ, **ONE_THREAD})
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and run.stderr.startswith(f"error: {run_dir / 'log.jsonl'} is damaged")


# -----------------------------------------------------------------------------
# through train.py

# one torch thread: a model this small gains nothing from two, and on a busy machine two threads that
# wait for each other make every step many times slower (docs/speed.md, "Measurements behind the code")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# (and MFU against a given peak: measuring one costs every train.py start, the timing probes' too, ~0.25 s)
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--device=cpu",
        "--log_interval=1", "--always_save_checkpoint=False", "--warmup_iters=2", "--peak_tflops=1.0"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny token dataset as prepare.py writes one: a train and a val shard of random tokens, and meta.json."""
    from shards import write_meta, write_shard
    data_dir = tmp_path_factory.mktemp("data") / "tiny"
    rng = np.random.default_rng(0)
    tokens = {"train": rng.integers(0, 64, 5000), "val": rng.integers(0, 64, 1000)}
    for split, t in tokens.items():
        write_shard(data_dir / f"tiny_{split}_000000.bin", t)
    write_meta(data_dir, dict(tokenizer="bytes", vocab_size=64, train_tokens=5000, val_tokens=1000))
    return data_dir


def train_losses(tmp_path, dataset, *args):
    out = tmp_path / "_".join(a.strip("-").replace("/", "") for a in args)
    subprocess.run([sys.executable, str(ROOT / "train.py"), f"--dataset={dataset}", f"--out_dir={out}", *TINY, *args],
                   check=True, capture_output=True, env={**os.environ, **ONE_THREAD})
    return [e["loss"] for e in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if e["event"] == "train"]


def test_same_seed_same_batches(tmp_path, dataset):
    """train.py draws its training windows from the seed alone. With the learning rate at zero the model
    never changes, so the logged train losses fingerprint the batches: attnres and rd (with zero pseudo-
    queries rd computes attnres's function, README "Exact equivalences" 3, but it has other parameters and optimizer groups)
    log the same loss at every iteration, while the loss changes from batch to batch."""
    frozen = ["--seed=3", "--learning_rate=0.0", "--min_lr=0.0", "--max_iters=4", "--eval_interval=100", "--eval_iters=1"]
    a = train_losses(tmp_path, dataset, "--residual=attnres", *frozen)
    b = train_losses(tmp_path, dataset, "--residual=rd", *frozen)
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, abs=1e-6)
    assert min(abs(x - y) for i, x in enumerate(a) for y in a[i + 1:]) > 2e-5  # each batch has a loss of its own


def test_settings_train_py_refuses_are_one_line_naming_the_run(tmp_path, dataset, monkeypatch):
    """A run whose settings train.py refuses (a res_blocks that does not divide 2 x 2 sublayers) ends the grid at
    its timing probe with train.py's own line and the run's name, not the end of a log in a deleted folder."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(ValueError) as err:
        compare.main([f"--out_dir={tmp_path}", "--runs=delta/res_blocks=3", "--seeds=1", f"--dataset={dataset}", *TINY,
                      "--max_iters=4"])
    assert str(err.value) == ("run delta/res_blocks=3: GPTConfig.res_blocks=3 is not allowed: use 0 (per sublayer) or "
                              "a divisor of 2 * n_layer = 4")
    assert not (tmp_path / "compare" / "runs").exists() or not any((tmp_path / "compare" / "runs").rglob("ckpt.pt"))


def test_tiny_grid_end_to_end(tmp_path, dataset, capsys, monkeypatch):
    """Two modes x two seeds through train.py: progress, results, pictures; then a rerun that retrains
    only the one run left unfinished."""
    for k, v in ONE_THREAD.items():
        monkeypatch.setenv(k, v)  # inherited by the train.py processes
    argv = [f"--out_dir={tmp_path}", "--runs=delta", "--seeds=2", f"--dataset={dataset}", *TINY,
            "--max_iters=4", "--eval_interval=2", "--eval_iters=1"]
    results = compare.main(argv)
    out = capsys.readouterr().out
    assert "expected time: ~" in out and "[4/4] delta/res_blocks=0 seed1: val loss" in out
    r = results["runs"]
    assert list(r) == ["standard", "delta/res_blocks=0"]
    for name in r:
        assert sorted(r[name]["val_loss"]) == [0, 1]
    p = r["delta/res_blocks=0"]["paired"]["standard"]
    assert p["diff_nats"] == pytest.approx([r["delta/res_blocks=0"]["val_loss"][s] - r["standard"]["val_loss"][s] for s in (0, 1)])
    assert r["delta/res_blocks=0"]["routing"]["deepest"] == "L1.mlp"
    compare_dir = tmp_path / "compare"
    for f in ("results.md", "results.json", "val_loss.png", "max_weight_by_depth.png", "routing_delta_res_blocks0.png"):
        assert (compare_dir / f).exists(), f
    runs = compare_dir / "runs"
    assert json.loads((runs / "standard" / "seed1" / "train_args.json").read_text())[:2] == ["--seed=1", "--residual=standard"]
    # with wandb_log=True the grid is one wandb group, each run named by what it is (wandb_* is no train arg)
    start = json.loads((runs / "delta/res_blocks=0" / "seed1" / "log.jsonl").read_text().splitlines()[0])["config"]
    assert start["wandb_group"] == tmp_path.name and start["wandb_run_name"] == "delta/res_blocks=0/seed1"
    assert not any("wandb" in a for a in json.loads((runs / "standard" / "seed1" / "train_args.json").read_text()))

    # resume: seed 1 of delta lost its `done` line (as if killed); only it is trained again
    log = runs / "delta/res_blocks=0" / "seed1" / "log.jsonl"
    log.write_text("".join(l + "\n" for l in log.read_text().splitlines() if '"done"' not in l))
    kept = {p: p.stat().st_mtime_ns for p in runs.rglob("log.jsonl") if p != log}
    results2 = compare.main(argv)
    out = capsys.readouterr().out
    assert "3 done, 1 to train" in out and "[1/1] delta/res_blocks=0 seed1" in out and "timing probe" not in out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert results2["runs"]["delta/res_blocks=0"]["val_loss"] == pytest.approx(r["delta/res_blocks=0"]["val_loss"])
    # where they trained: this machine in full when this command trained them all, else as the logs name it
    assert results["machine"] == compare.machine(dict(os.environ), 1)
    assert results2["machine"] == f"{device_name('cpu')}, torch {torch.__version__}"


def grid_running(out_dir, grid, preexec_fn):
    """compare.py started on `grid` in out_dir (one thread a run), returned once its first run, standard
    seed 0, has logged iteration 20: (the process, that run's log.jsonl)."""
    process = subprocess.Popen([sys.executable, str(ROOT / "compare.py"), f"--out_dir={out_dir}", *grid],
                               cwd=out_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1"}, preexec_fn=preexec_fn)
    log = out_dir / "compare" / "runs" / "standard" / "seed0" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and '"iter": 20,' in log.read_text()):
        time.sleep(0.02)
    return process, log


def test_ctrl_c_stops_a_grid_and_the_rerun_continues_its_runs_exactly(tmp_path, dataset, capsys, monkeypatch):
    """Ctrl-C in compare.py mid-run: the running train.py stops with a checkpoint; the same command again
    continues that run from it, its log's lines up to there kept, not trained again, and trains the rest
    (that a stopped run resumes to the uninterrupted run's losses, bit for bit, test_train.py checks)."""
    for k, v in ONE_THREAD.items():
        monkeypatch.setenv(k, v)
    # 400 iterations: the stop at iteration ~20 leaves the run hundreds to go, and the rerun trains ~800 (not ~2000)
    grid = ["--runs=delta", "--seeds=1", f"--dataset={dataset}", *TINY, "--always_save_checkpoint=True",
            "--max_iters=400", "--lr_decay_iters=400", "--eval_interval=500", "--eval_iters=1"]
    stopped = tmp_path / "stopped"
    process, log = grid_running(stopped, grid, takes_ctrl_c)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "running ones stop with a checkpoint" in output, output
    assert compare.read_log(log.parent)[-1]["event"] == "stopped" and (log.parent / "ckpt.pt").exists()
    at = compare.read_log(log.parent)[-1]["iter"]
    before = [line for line in log.read_text().splitlines() if '"event": "train"' in line]
    results = compare.main([f"--out_dir={stopped}", *grid])
    events = compare.read_log(log.parent)
    assert [e["event"] for e in events].count("start") == 1 and [e["iter"] for e in events if e["event"] == "resume"] == [at]
    assert [line for line in log.read_text().splitlines() if '"event": "train"' in line][:at] == before[:at]
    assert all(sorted(results["runs"][name]["val_loss"]) == [0] for name in ("standard", "delta/res_blocks=0"))


def test_sigterm_stops_a_background_grid_and_its_runs_with_a_checkpoint(tmp_path, dataset):
    """`kill` (SIGTERM) to a grid started in the background, where SIGINT is ignored (nohup ... &): compare.py
    stops its running train.py with a checkpoint, as on Ctrl-C, rather than dying and leaving it training."""
    grid = ["--runs=standard", "--seeds=1", f"--dataset={dataset}", *TINY, "--always_save_checkpoint=True",
            "--max_iters=1000", "--lr_decay_iters=1000", "--eval_interval=500", "--eval_iters=1"]
    process, log = grid_running(tmp_path / "grid", grid, lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "running ones stop with a checkpoint" in output, output
    assert compare.read_log(log.parent)[-1]["event"] == "stopped" and (log.parent / "ckpt.pt").exists()


def test_a_failed_run_ends_the_grid(tmp_path, dataset):
    """A run that fails (a loss that diverges) ends the grid with its error once the running ones finish, and
    the queued ones never start (with --jobs=1 the grid used to wait for them forever)."""
    result = subprocess.run([sys.executable, str(ROOT / "compare.py"), f"--out_dir={tmp_path}", "--runs=delta", "--seeds=1",
                             f"--dataset={dataset}", *TINY, "--max_iters=60", "--eval_interval=60", "--eval_iters=1",
                             "--learning_rate=30", "--grad_clip=0"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **ONE_THREAD})
    assert result.returncode == 1 and "error: train.py failed" in result.stderr and "the loss is" in result.stderr
    assert not (tmp_path / "compare" / "runs" / "delta").exists()


def test_sweep_jobs_and_published_runs_end_to_end(tmp_path, dataset, capsys, monkeypatch):
    """A sweep through train.py: --jobs=2 gives the very val losses of --jobs=1 (one thread each: the same
    arithmetic); its published logs let a fresh out_dir finish the grid without training anything; the
    fixed value route trains as a uniform route."""
    for k, v in ONE_THREAD.items():
        monkeypatch.setenv(k, v)
    grid = ["--runs=rd_fixedv", "--sweep=n_layer=1,2", "--seeds=1", f"--dataset={dataset}",
            *[a for a in TINY if not a.startswith("--n_layer")], "--max_iters=4", "--eval_interval=2", "--eval_iters=1"]
    published = tmp_path / "published"
    two = compare.main([f"--out_dir={tmp_path / 'two'}", "--jobs=2", f"--publish={published}", *grid])
    assert "4 to train, 2 at a time" in capsys.readouterr().out
    with monkeypatch.context() as m:  # the grid above ran these runs' timing probes (the ETA's, in folders of their
        m.setattr(compare, "estimate_run_s", lambda *args: 1.0)  # own): not again for this one, the losses' reference
        one = compare.main([f"--out_dir={tmp_path / 'one'}", *grid])
    names = ["n_layer=1/standard", "n_layer=1/rd_fixedv/res_blocks=0", "n_layer=2/standard", "n_layer=2/rd_fixedv/res_blocks=0"]
    assert list(two["runs"]) == list(one["runs"]) == names
    for name in names:
        assert two["runs"][name]["val_loss"] == one["runs"][name]["val_loss"]  # bit for bit
    args = json.loads((tmp_path / "two/compare/runs/n_layer=2/rd_fixedv/res_blocks=0/seed0/train_args.json").read_text())
    assert "--n_layer=2" in args and "--fixed_value_route=True" in args
    weights = two["runs"]["n_layer=2/rd_fixedv/res_blocks=0"]["routing"]["weights"]
    assert weights["L1.attn.v"] == pytest.approx([1 / 3] * 3, abs=1e-6)  # emb, L0.attn, L0.mlp: uniform
    assert weights["L1.attn"] != pytest.approx([1 / 3] * 3, abs=1e-6)

    # the published logs: no per-iteration lines, the start event with its commit; a fresh out_dir takes them
    log = (published / "runs" / names[3] / "seed0" / "log.jsonl").read_text()
    assert '"event": "train"' not in log and '"event": "start"' in log and '"event": "done"' in log
    capsys.readouterr()
    fresh = compare.main([f"--out_dir={tmp_path / 'fresh'}", "--jobs=2", f"--publish={published}", *grid])
    assert "4 done, 0 to train" in capsys.readouterr().out
    assert not list((tmp_path / "fresh").rglob("train.log"))
    assert {n: r["val_loss"] for n, r in fresh["runs"].items()} == {n: r["val_loss"] for n, r in two["runs"].items()}
    assert (published / "sweep_val_loss.png").exists() and "n_layer=2" in (published / "results.md").read_text()
