"""
train.py's promises, as tests: every mode learns, resume is exact, two ranks equal one process,
conversion keeps the function, bad inputs are one-line errors.

Everything runs train.py as a command (that is its interface) on tiny models and synthetic shards,
on the CPU with one thread per process.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import configurator
from checkpoint import load_checkpoint, load_model, save_checkpoint
from helpers import folder_locked_by_another_process, takes_ctrl_c
from model import GPT, GPTConfig
from shards import read_shard, write_meta, write_shard

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8", "--eval_iters=2",
        "--log_interval=1", "--device=cpu", "--dtype=float32", "--warmup_iters=2", "--learning_rate=1e-2",
        "--min_lr=1e-3", "--lr_decay_iters=8", "--seed=7", "--peak_tflops=1.0"]
# (MFU against a given peak: measuring one costs every run that trains ~0.25 s; test_every_mode_lowers_the_loss
# trains with the measured one, MEASURED_PEAK)
MEASURED_PEAK = [a for a in TINY if not a.startswith("--peak_tflops=")]
VOCAB = 64


def make_dataset(data_dir, tokenizer="bytes", vocab=VOCAB):
    """A random walk mod vocab (steps of 1, 2 or 3): the next token is one of three, easy to learn."""
    rng = np.random.default_rng(0)
    walk = lambda n: np.cumsum(rng.integers(1, 4, size=n)) % vocab
    write_shard(data_dir / "syn_train_000000.bin", walk(20_000))
    write_shard(data_dir / "syn_val_000000.bin", walk(4_000))
    write_meta(data_dir, dict(tokenizer=tokenizer, vocab_size=vocab, train_tokens=20_000, val_tokens=4_000,
                              source="synthetic"))
    return data_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("syn"))


def train(*args, cwd, command=(sys.executable, str(TRAIN)), ok=True, env=None):
    result = subprocess.run([*command, *map(str, args)], cwd=cwd, env={**ENV, **(env or {})}, capture_output=True,
                            text=True, timeout=300)
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def events(out_dir, kind):
    lines = (Path(out_dir) / "log.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def losses(out_dir):
    """{iter: training loss} from log.jsonl."""
    return {e["iter"]: e["loss"] for e in events(out_dir, "train")}


def standard_checkpoint(path, data_dir):
    """A standard-mode checkpoint whose residual stream is as large as GPT-2's (std ~1, not a fresh
    init's 0.02), so that LayerNorm's eps is negligible and converting it is exact (README,
    "Exact equivalences" 1). Only the position embedding is scaled: the token embedding is the head."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=32, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config)
    with torch.no_grad():
        model.transformer.wpe.weight.mul_(50)
    save_checkpoint(dict(model=model.state_dict(), model_args=asdict(config), iter_num=0, best_val_loss=0.0,
                         dataset_meta=json.loads((data_dir / "meta.json").read_text())), path)
    return path


# -----------------------------------------------------------------------------

@pytest.mark.parametrize("residual", ["standard", "attnres", "delta", "rd"])
@pytest.mark.parametrize("linears", ["dense", "dlr"])
def test_every_mode_lowers_the_loss(residual, linears, data, tmp_path):
    extra = ["--lowrank_rank=16", "--dlr=True", "--res_blocks=2"] if linears == "dlr" else []
    train(*MEASURED_PEAK, *extra, f"--dataset={data}", f"--out_dir={tmp_path}", f"--residual={residual}",
          "--max_iters=6", "--eval_interval=6", cwd=tmp_path)
    evals = events(tmp_path, "eval")
    assert [e["iter"] for e in evals] == [0, 6]
    assert evals[1]["val_loss"] < evals[0]["val_loss"] - 0.1
    train_line = events(tmp_path, "train")[0]
    assert set(train_line) == {"event", "iter", "loss", "lr", "ms_per_iter", "tokens_per_s", "mfu"}
    if residual == "standard":
        assert "routing" not in evals[0]
    else:
        assert {"deep_max_weight", "mean_entropy"} <= set(evals[1]["routing_summary"])
        assert all("weights" in r for r in evals[1]["routing"].values())
        assert ("mean_js" in evals[1]["routing_summary"]) == (residual == "rd")
    done = events(tmp_path, "done")[0]
    assert done["ckpt"] == str(tmp_path / "ckpt.pt") and done["iter"] == 6
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 6 and ckpt["model_args"]["residual"] == residual
    assert ckpt["dataset_meta"]["tokenizer"] == "bytes" and ckpt["config"]["batch_size"] == 8


def test_same_seed_same_backbone_and_batches_in_every_mode(data, tmp_path):
    """The paired protocol: a seed fixes the backbone's initial weights and the training windows,
    whatever the residual mode. With learning_rate=0 the iter-1 checkpoint holds the initial weights."""
    ckpts = {}
    for residual in ("standard", "rd"):
        out = tmp_path / residual
        train(*TINY, f"--dataset={data}", f"--out_dir={out}", f"--residual={residual}", "--max_iters=1",
              "--eval_interval=1", "--learning_rate=0", "--min_lr=0", cwd=tmp_path)
        ckpts[residual] = torch.load(out / "ckpt.pt", weights_only=True)
    standard, rd = ckpts["standard"], ckpts["rd"]
    assert all(torch.equal(v, rd["model"][k]) for k, v in standard["model"].items())
    assert set(rd["model"]) - set(standard["model"]) == {k for k in rd["model"] if "res_query" in k}
    assert standard["data_rng"] == rd["data_rng"]


def seed_window_losses(model, data, iters, micro_steps, seed=7):
    """{iteration: the mean loss of model, as it is, over the micro-batches of the training windows train.py draws
    for that iteration with seed (TINY's 7): np.random.default_rng(seed), one (micro_steps, batch_size) draw of
    window starts in the data fixture's one train shard per iteration}."""
    tokens = np.asarray(read_shard(data / "syn_train_000000.bin")).astype(np.int64)
    rng = np.random.default_rng(seed)
    expected = {}
    for it in range(iters):
        windows = rng.integers(0, len(tokens) - 32, size=(micro_steps, 8))  # block_size 32: a window is 33 tokens
        micro = []
        for w in windows:
            xy = torch.from_numpy(np.stack([tokens[i:i + 33] for i in w]))
            with torch.no_grad():
                micro.append(model(xy[:, :-1].contiguous(), xy[:, 1:].contiguous())[1].item())
        expected[it] = sum(micro) / micro_steps
    return expected


def test_each_iterations_loss_is_the_mean_over_its_micro_batches_of_the_seeds_windows(data, tmp_path):
    """The logged training loss of an iteration is the mean loss of its gradient_accumulation_steps micro-batches,
    whose windows np.random.default_rng(seed) draws uniformly from all of the split's windows, one (micro_steps,
    batch_size) draw per iteration. With learning_rate=0 the weights stay the initial ones, so this test computes
    each iteration's loss itself from those windows. Tolerance: the same float32 forward in another process,
    equal or a few ulps apart."""
    out = tmp_path / "out"
    train(*TINY, f"--dataset={data}", f"--out_dir={out}", "--max_iters=3", "--eval_interval=3", "--learning_rate=0",
          "--min_lr=0", "--gradient_accumulation_steps=2", cwd=tmp_path)
    torch.manual_seed(7)  # TINY's seed: train.py builds the model right after seeding, as here
    model = GPT(GPTConfig.from_dict(load_checkpoint(out / "ckpt.pt")["model_args"]))
    assert losses(out) == pytest.approx(seed_window_losses(model, data, iters=3, micro_steps=2), abs=1e-6)


@pytest.mark.parametrize("residual", ["standard", "delta"])
def test_dropout_is_on_in_every_training_iteration_after_an_evaluation(data, tmp_path, residual):
    """Evaluating (and, in a routed mode, reading the routing) puts the model in eval mode; training goes on in
    training mode: with dropout=0.5 and learning_rate=0, each iteration's loss, each right after an evaluation,
    is not the loss without dropout on its windows. (standard_checkpoint's model, as delta converted exactly.
    Measured: 4e-3 to 7e-3 apart; in eval mode it would be the same forward, equal to ~1e-6 as the test above
    finds: hence 1e-4.)"""
    source = standard_checkpoint(tmp_path / "source.pt", data)
    out = tmp_path / "out"
    train(*TINY, f"--dataset={data}", f"--out_dir={out}", f"--init_from={source}", f"--residual={residual}",
          "--dropout=0.5", "--learning_rate=0", "--min_lr=0", "--max_iters=3", "--eval_interval=1", cwd=tmp_path)
    model = load_model(source)[0].eval()
    without_dropout = seed_window_losses(model, data, iters=3, micro_steps=1)
    trained = losses(out)
    assert all(abs(trained[it] - without_dropout[it]) > 1e-4 for it in range(3)), (trained, without_dropout)


def test_compiled_sublayers_train_as_the_eager_model(data, tmp_path):
    """--compile --compile_sublayers (Inductor on the CPU: each layer's two sublayers compiled, the routes
    eager) trains, evaluates and saves like the eager run, in one process and on two torchrun ranks (DDP
    around the compiled sublayers): the same losses to float32 rounding, which Inductor's fused kernels
    reorder (4 steps at learning rate 1e-2 keep it under 1e-4; two ranks add ~1e-7, see the test below).
    The ranks compile the graphs the one process compiled: Inductor's cache on disk serves them."""
    compiled = ["--compile=True", "--compile_sublayers=True"]
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    runs = {}
    for name, extra, command in (("eager", [], None), ("compiled", compiled, None), ("compiled_ddp", compiled, torchrun)):
        train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / name}", "--residual=rd", "--max_iters=4",
              "--eval_interval=2", "--gradient_accumulation_steps=2", *extra, cwd=tmp_path,
              **({"command": command} if command else {}))
        runs[name] = losses(tmp_path / name), [e["val_loss"] for e in events(tmp_path / name, "eval")]
    eager_train, eager_val = runs["eager"]
    for name in ("compiled", "compiled_ddp"):
        compiled_train, compiled_val = runs[name]
        assert eager_train.keys() == compiled_train.keys() and len(eager_val) == len(compiled_val) == 3, name
        assert all(abs(eager_train[i] - compiled_train[i]) < 1e-4 for i in eager_train), name
        assert all(abs(a - b) < 1e-4 for a, b in zip(eager_val, compiled_val)), name


def test_resume_is_exact(data, tmp_path):
    """8 iterations straight == 4 + resume + 4, bit for bit (dropout on, so the RNG state counts too)."""
    common = [*TINY, f"--dataset={data}", "--dropout=0.1", "--residual=delta", "--eval_interval=4"]
    train(*common, f"--out_dir={tmp_path / 'straight'}", "--max_iters=8", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=4", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=8", "--init_from=resume", cwd=tmp_path)
    straight, halves = losses(tmp_path / "straight"), losses(tmp_path / "halves")
    assert list(halves) == list(range(8))  # the resumed log continues the first half's, without repeats
    assert halves == straight  # exactly equal floats
    assert [e["val_loss"] for e in events(tmp_path / "halves", "eval")] == \
           [e["val_loss"] for e in events(tmp_path / "straight", "eval")]
    assert len(events(tmp_path / "halves", "done")) == 1
    assert [e["iter"] for e in events(tmp_path / "halves", "start") + events(tmp_path / "halves", "resume")] == [0, 4]
    # the schedule TINY sets (warmup 2, 1e-2 down to 1e-3 at 8), on both sides of the resume
    warmup = [1e-2 * (it + 1) / 3 for it in range(2)]
    cosine = [1e-3 + 0.5 * (1 + math.cos(math.pi * (it - 2) / 6)) * 9e-3 for it in range(2, 8)]
    for run in ("straight", "halves"):
        assert [e["lr"] for e in events(tmp_path / run, "train")] == pytest.approx(warmup + cosine, rel=1e-12)


def test_float16_trains_and_resumes_exactly_with_its_gradient_scaler(data, tmp_path):
    """dtype=float16 runs on a CPU too (torch's gradient scaler does), so its path is tested here: 8
    iterations straight == 4 + resume + 4, bit for bit, and the scaler's state is saved and resumed (its
    growth tracker counts the steps since the last overflow: 8 in both, where a fresh scaler would count 4)."""
    common = [*TINY, f"--dataset={data}", "--residual=rd", "--eval_interval=4", "--dtype=float16"]
    result = train(*common, f"--out_dir={tmp_path / 'straight'}", "--max_iters=8", cwd=tmp_path)
    assert "float16 on a CPU" in result.stdout
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=4", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=8", "--init_from=resume", cwd=tmp_path)
    assert losses(tmp_path / "halves") == losses(tmp_path / "straight")
    evals = [e["val_loss"] for e in events(tmp_path / "straight", "eval")]
    assert [e["val_loss"] for e in events(tmp_path / "halves", "eval")] == evals and evals[-1] < evals[0] - 0.3
    scalers = [load_checkpoint(tmp_path / run / "ckpt.pt")["scaler"] for run in ("straight", "halves")]
    assert scalers[0] == scalers[1] and scalers[0]["_growth_tracker"] == 8 and scalers[0]["scale"] == 2.0 ** 16


def test_float16_clips_the_unscaled_gradient(data, tmp_path):
    """With float16's gradient scaler the gradient is unscaled before it is clipped: grad_clip bounds the true
    norm, not the one 2^16 times larger that the scaler backpropagates. So a grad_clip far above the true norm
    (1e3) changes nothing: after one iteration the weights equal grad_clip=0's, bit for bit."""
    states = {}
    for clip in ("1e3", "0"):
        out = tmp_path / f"clip{clip}"
        train(*TINY, f"--dataset={data}", f"--out_dir={out}", "--max_iters=1", "--eval_interval=1", "--dtype=float16",
              f"--grad_clip={clip}", cwd=tmp_path)
        states[clip] = load_checkpoint(out / "ckpt.pt")["model"]
    assert all(torch.equal(v, states["0"][k]) for k, v in states["1e3"].items())


def test_pseudo_queries_train_at_res_query_lr_mult_times_the_rate(data, tmp_path):
    """AdamW's first step moves each weight by lr times g / (|g| + eps), i.e. by lr wherever the gradient is
    not tiny: after one iteration the pseudo-queries, which start at zero, are at most lr x res_query_lr_mult
    away from it (0 with res_query_lr_mult=0), and every other weight took the same step either way."""
    lr = 1e-2 / 3  # TINY's first iteration, in warmup
    states = {}
    for mult in (0, 3):
        out = tmp_path / f"mult{mult}"
        train(*TINY, f"--dataset={data}", f"--out_dir={out}", "--residual=rd", "--max_iters=1", "--eval_interval=1",
              f"--res_query_lr_mult={mult}", cwd=tmp_path)
        states[mult] = load_checkpoint(out / "ckpt.pt")["model"]
        queries = torch.stack([v for k, v in states[mult].items() if "res_query" in k])
        assert queries.abs().max().item() == pytest.approx(lr * mult, rel=1e-4)
    assert all(torch.equal(v, states[3][k]) for k, v in states[0].items() if "res_query" not in k)


def test_the_learning_rate_stays_at_min_lr_after_lr_decay_iters_and_is_constant_without_decay(data, tmp_path):
    """A run longer than lr_decay_iters trains its last iterations at min_lr (the cosine does not rise
    again after its end), and decay_lr=False trains at learning_rate from the first iteration on (its min_lr and
    warmup_iters unused, whatever they are). warmup_iters = lr_decay_iters is a decay of no length: the warmup
    reaches learning_rate, then the rate is min_lr."""
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'long'}", "--max_iters=11", "--eval_interval=100",
          cwd=tmp_path)
    warmup = [1e-2 * (it + 1) / 3 for it in range(2)]
    cosine = [1e-3 + 0.5 * (1 + math.cos(math.pi * (it - 2) / 6)) * 9e-3 for it in range(2, 9)]
    assert [e["lr"] for e in events(tmp_path / "long", "train")] == pytest.approx(warmup + cosine + [1e-3] * 2,
                                                                                   rel=1e-12)
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'constant'}", "--max_iters=3", "--eval_interval=100",
          "--decay_lr=False", "--min_lr=0.1", "--warmup_iters=9", cwd=tmp_path)
    assert [e["lr"] for e in events(tmp_path / "constant", "train")] == [1e-2] * 3
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'step'}", "--max_iters=4", "--eval_interval=100",
          "--lr_decay_iters=2", cwd=tmp_path)
    assert [e["lr"] for e in events(tmp_path / "step", "train")] == pytest.approx(warmup + [1e-2, 1e-3], rel=1e-12)


def test_grad_clip_bounds_the_gradient_norm_and_0_turns_it_off(data, tmp_path):
    """grad_clip scales the gradient down to that total norm before AdamW's step. AdamW's first step moves
    a weight by lr x g / (|g| + eps), eps = 1e-8 (no weight decay here): clipped to a norm of 1e-12, no weight
    moves by more than lr x 1e-4 from its initial value; with grad_clip=0 (off) the largest step is lr."""
    lr = 1e-2 / 3  # TINY's first iteration, in warmup
    moved = {}
    for clip in ("1e-12", "0"):
        out = tmp_path / f"clip{clip}"
        train(*TINY, f"--dataset={data}", f"--out_dir={out}", "--max_iters=1", "--eval_interval=1",
              f"--grad_clip={clip}", "--weight_decay=0", cwd=tmp_path)
        ckpt = load_checkpoint(out / "ckpt.pt")
        torch.manual_seed(7)  # TINY's seed: train.py builds the model right after seeding, as here
        initial = GPT(GPTConfig.from_dict(ckpt["model_args"])).state_dict()
        moved[clip] = max((ckpt["model"][k] - v).abs().max().item() for k, v in initial.items())
    assert 0 < moved["1e-12"] <= lr * 1e-4 * 1.01
    assert moved["0"] == pytest.approx(lr, rel=1e-3)


def test_resume_takes_the_runs_own_settings(data, tmp_path):
    """`--init_from=resume --out_dir=DIR` alone continues a run trained with other settings than train.py's
    defaults (here given on the command line, as a config file would): its batches, optimizer, schedule and
    dtype (bfloat16, where a CPU's auto would choose float32) come from the checkpoint, so the losses equal a
    straight run's. A changed length or schedule set again
    is taken and printed; the eval at the checkpoint (here not on an eval multiple) is made again."""
    common = [*TINY, f"--dataset={data}", "--residual=rd", "--eval_interval=4", "--beta1=0.8", "--beta2=0.9",
              "--weight_decay=0.3", "--dtype=bfloat16"]
    train(*common, f"--out_dir={tmp_path / 'straight'}", "--max_iters=9", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=5", cwd=tmp_path)
    result = train("--init_from=resume", f"--out_dir={tmp_path / 'halves'}", "--max_iters=9", "--device=cpu",
                   cwd=tmp_path)
    assert "resuming" in result.stdout and "max_iters 5 -> 9" in result.stdout
    assert losses(tmp_path / "halves") == losses(tmp_path / "straight")
    assert [e["iter"] for e in events(tmp_path / "halves", "eval")] == [0, 4, 5, 8, 9]
    assert "at iter 5)" in result.stdout  # the summary's first val loss is the resumed iteration's own
    ckpt = load_checkpoint(tmp_path / "halves" / "ckpt.pt")
    config = ckpt["config"]
    assert config["beta2"] == 0.9 and config["log_interval"] == 1 and config["n_layer"] == 2  # the run's, not the defaults
    assert config["dtype"] == "bfloat16" and "training on cpu in bfloat16" in result.stdout
    # and AdamW trained with them: its groups (matrices, vectors, pseudo-queries) hold the run's betas and decay
    groups = ckpt["optimizer"]["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.8, 0.9)] * 3 and [g["weight_decay"] for g in groups] == [0.3, 0, 0]


def test_dropout_set_again_on_resume_is_the_one_trained_with(data, tmp_path):
    """dropout is the model setting a resume may change: set again, it is printed and the resumed model is built
    with it, as the model_args of its checkpoint record (not the checkpoint's own 0.1)."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", "--dropout=0.1", cwd=tmp_path)
    result = train(*common, "--max_iters=4", "--init_from=resume", "--dropout=0.0", cwd=tmp_path)
    assert "dropout 0.1 -> 0.0" in result.stdout
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == 4 and ckpt["model_args"]["dropout"] == 0.0


def test_a_run_resumes_with_the_schedule_it_trained_with(data, tmp_path):
    """A run trained before train.py refused a warmup past lr_decay_iters (here written into its checkpoint) resumes
    with its schedule as it was; setting part of the schedule again is this command's choice, and checked."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    ckpt["config"]["warmup_iters"] = 10  # past TINY's lr_decay_iters=8
    torch.save(ckpt, tmp_path / "ckpt.pt")
    train("--init_from=resume", f"--out_dir={tmp_path}", "--max_iters=3", "--device=cpu", cwd=tmp_path)
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 3
    result = train("--init_from=resume", f"--out_dir={tmp_path}", "--max_iters=4", "--lr_decay_iters=9", "--device=cpu",
                   cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.startswith("error: warmup_iters=10 is more than lr_decay_iters=9")


@pytest.fixture(scope="module")
def two_iterations(data, tmp_path_factory):
    """A run trained 2 iterations, which the refused resumes below only read (each checks it is kept whole):
    (its out_dir, the arguments it was trained with, less max_iters)."""
    out = tmp_path_factory.mktemp("two_iterations")
    common = [*TINY, f"--dataset={data}", f"--out_dir={out}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=out)
    return out, common


@pytest.mark.parametrize("changed", ["--batch_size=4", "--beta2=0.95", "--seed=8"])
def test_resume_refuses_what_it_cannot_change(two_iterations, tmp_path, changed):
    """Batches, the seed and what AdamW keeps in its state cannot change on resume: one line, the run kept."""
    out, common = two_iterations
    before = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()
    result = train(*common, "--max_iters=4", "--init_from=resume", changed, cwd=tmp_path, ok=False)
    key = changed[2:].split("=")[0]
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"init_from=resume continues the run in {out} as it was, but {key}=" in result.stderr
    assert result.stderr.endswith(f"start a new run from it with --init_from={out / 'ckpt.pt'} and another out_dir\n")
    assert ((out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()) == before


def test_resume_refuses_every_setting_that_decides_batches_or_adamws_state(data, two_iterations, tmp_path):
    """The rest of RESUMED_AS_TRAINED (test_resume_refuses_what_it_cannot_change has batch_size, beta2, seed):
    the dataset, gradient_accumulation_steps, weight_decay, beta1 and res_query_lr_mult set to another value
    stop a resume with one line, the run kept."""
    out, common = two_iterations
    before = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()
    copy = shutil.copytree(data, tmp_path / "copy")  # the same data under another name: still another setting
    for changed in (f"--dataset={copy}", "--gradient_accumulation_steps=2", "--weight_decay=0.2", "--beta1=0.8",
                    "--res_query_lr_mult=2.0"):
        result = train(*common, "--max_iters=4", "--init_from=resume", changed, cwd=tmp_path, ok=False)
        key = changed[2:].split("=")[0]
        assert result.returncode == 1 and result.stderr.count("\n") == 1, (changed, result.stderr)
        assert f"as it was, but {key}=" in result.stderr, (changed, result.stderr)
    assert ((out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()) == before
    # the run copied, to spoil its checkpoint here (the shared one stays whole), resumed from its new out_dir
    shutil.copytree(out, tmp_path / "out")
    common = [a for a in common if not a.startswith("--out_dir=")] + [f"--out_dir={tmp_path / 'out'}"]
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")  # an optimizer state that does not fit: said, and what to do
    ckpt["optimizer"]["param_groups"] = ckpt["optimizer"]["param_groups"][:-1]
    save_checkpoint(ckpt, tmp_path / "out" / "ckpt.pt")
    result = train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: the optimizer state in {tmp_path / 'out' / 'ckpt.pt'} does not fit the model")
    assert result.stderr.endswith(f"start a new run from it with --init_from={tmp_path / 'out' / 'ckpt.pt'} and another "
                                  "out_dir\n")


def test_resume_reads_a_checkpoint_from_before_a_model_setting(data, tmp_path):
    """A checkpoint whose model_args lack a GPTConfig field added since (here dlr_alpha) resumes with the field's
    default; the field set again on the command line is compared with that default, not a KeyError. One that lacks
    a field of the model's shape (here n_head, which no weight's shape shows) has no default to take: one line."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    del ckpt["model_args"]["dlr_alpha"]
    save_checkpoint(ckpt, tmp_path / "ckpt.pt")
    train(*common, "--max_iters=3", "--init_from=resume", "--dlr_alpha=1.0", cwd=tmp_path)
    result = train(*common, "--max_iters=4", "--init_from=resume", "--dlr_alpha=2.0", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "dlr_alpha=2.0 differs from its 1.0" in result.stderr
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    del ckpt["model_args"]["n_head"]
    save_checkpoint(ckpt, tmp_path / "ckpt.pt")
    result = train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr == (
        f"error: {tmp_path / 'ckpt.pt'} has no n_head in its model_args: the model's shape, which no default can stand "
        "for; use a checkpoint written by train.py, fold.py or nanoGPT (or add the value to its model_args)\n")


def test_data_changed_under_a_run_is_refused(tmp_path):
    """Shards that meta.json does not count (an interrupted prepare left one), or data that changed since the
    run's checkpoint, in its token counts or, at the same counts, in its tokens (its batches would differ on
    resume): one line each, nothing trained."""
    data = make_dataset(tmp_path / "syn")
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    write_shard(data / "syn_train_000001.bin", np.arange(100) % VOCAB)
    result = train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"the train shards of {data} hold 20,100 tokens, its meta.json counts 20,000" in result.stderr
    write_meta(data, dict(tokenizer="bytes", vocab_size=VOCAB, train_tokens=20_100, val_tokens=4_000))  # prepared again
    result = train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"{data} holds 20,100 train tokens, 20,000 when the run in {tmp_path / 'out'} was trained" in result.stderr
    # other data of the same size (the same counts): refused by its fingerprint; the data trained on resumes
    (data / "syn_train_000001.bin").unlink()
    original = (data / "syn_train_000000.bin").read_bytes()
    write_shard(data / "syn_train_000000.bin", np.arange(20_000) * 5 % VOCAB)
    write_meta(data, dict(tokenizer="bytes", vocab_size=VOCAB, train_tokens=20_000, val_tokens=4_000))
    result = train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert (f"the train shards of {data} hold as many tokens as when the run in {tmp_path / 'out'} was trained, but "
            "not the same ones") in result.stderr
    (data / "syn_train_000000.bin").write_bytes(original)
    train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path)


@pytest.mark.skipif(os.name == "nt", reason="the out_dir lock is a Unix flock")
def test_one_train_py_at_a_time_writes_an_out_dir(data, tmp_path):
    """While a train.py holds out_dir (here another process holds its lock), another one there stops at once in one line,
    the run's files untouched, whether it would resume or start anew; eval_only, which writes nothing, still reads
    the checkpoint. Once the lock is released (however its holder ended), the run continues, and deletes what a
    save cut short by a kill left: no other train.py can be writing it."""
    out = tmp_path / "out"
    common = [*TINY, f"--dataset={data}", f"--out_dir={out}", "--eval_interval=2"]
    train(*common, "--max_iters=4", cwd=tmp_path)
    before = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()
    with folder_locked_by_another_process(out):
        for init_from in ("resume", "scratch"):
            result = train(*common, "--max_iters=6", f"--init_from={init_from}", cwd=tmp_path, ok=False)
            assert result.returncode == 1 and result.stderr.count("\n") == 1
            assert f"another train.py is running in {out}" in result.stderr
        assert ((out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()) == before
        assert "val loss" in train(*common, "--init_from=resume", "--eval_only=True", cwd=tmp_path).stdout
    (out / ".ckpt.pt.tmp12345").write_bytes(b"a save cut short by kill -9")
    train(*common, "--max_iters=6", "--init_from=resume", cwd=tmp_path)
    assert max(losses(out)) == 5
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "log.jsonl"]  # the lock holder cleared the leftover


def test_a_new_run_never_replaces_an_earlier_ones_checkpoint(data, tmp_path):
    """A scratch run into an out_dir holding a checkpoint stops at once, the earlier run untouched, and so does
    eval_only there (it would score a fresh model beside the checkpoint); eval_only with resume measures
    without touching the run's log."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2", "--always_save_checkpoint=False"]
    train(*common, "--max_iters=4", cwd=tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes(), (tmp_path / "log.jsonl").read_bytes()
    result = train(*common, "--max_iters=4", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"{tmp_path / 'ckpt.pt'} holds an earlier run: continue it with --init_from=resume" in result.stderr
    result = train(*common, "--eval_only=True", cwd=tmp_path, ok=False)  # it would score a fresh model, not the run's
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"{tmp_path / 'ckpt.pt'} holds an earlier run: evaluate it with --init_from=resume" in result.stderr
    result = train(*common, "--init_from=resume", "--eval_only=True", cwd=tmp_path)
    assert "val loss" in result.stdout
    shutil.copyfile(tmp_path / "ckpt.pt", tmp_path / "other.pt")  # another checkpoint, evaluated beside it
    result = train(*common, f"--init_from={tmp_path / 'other.pt'}", "--eval_only=True", cwd=tmp_path)
    assert "val loss" in result.stdout and "done: 0 iterations" in result.stdout  # evaluated, not trained (max_iters=4)
    assert "evaluating on cpu" in result.stdout and "training on" not in result.stdout and "note:" not in result.stdout
    assert "MFU" not in result.stdout  # (nothing trains: no peak measured)
    other_data = make_dataset(tmp_path / "other_data")  # the same tokens: only the note differs
    result = train(*common, f"--init_from={tmp_path / 'other.pt'}", "--eval_only=True", f"--dataset={other_data}",
                   cwd=tmp_path)
    assert f"note: {tmp_path / 'other.pt'} was trained on {data}; this evaluates it on {other_data} " \
           f"(--dataset={data} for its own)" in result.stdout
    # and the run's own, by its path: eval_only writes nothing, so it cannot overwrite what it reads
    assert "val loss" in train(*common, f"--init_from={tmp_path / 'ckpt.pt'}", "--eval_only=True", cwd=tmp_path).stdout
    assert ((tmp_path / "ckpt.pt").read_bytes(), (tmp_path / "log.jsonl").read_bytes()) == before


def test_the_best_val_loss_is_the_runs_across_a_resume(data, tmp_path):
    """best_val_loss (the done line's, and the bar always_save_checkpoint=False saves against) is the best of
    the whole run, resumes included: here resumed at learning_rate=3 after its best, iteration 2's, the val loss
    rises far above it by iteration 4; resumed from there again, the run still reports iteration 2's as its best."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    train(*common, "--max_iters=4", "--init_from=resume", "--learning_rate=3", cwd=tmp_path)
    train(*common, "--max_iters=4", "--init_from=resume", cwd=tmp_path)  # evaluates iteration 4 again, and ends
    val = {e["iter"]: e["val_loss"] for e in events(tmp_path, "eval")}
    assert list(val) == [0, 2, 4] and val[4] > val[2] + 10
    (done,) = events(tmp_path, "done")
    assert done["best_val_loss"] == val[2] and done["val_loss"] == val[4]


def test_always_save_checkpoint_false_keeps_the_best_checkpoint_when_the_val_loss_rises(data, tmp_path):
    """always_save_checkpoint=False saves at an evaluation only when the val loss improves on the run's best: a
    resume at learning_rate=3 whose val loss at iteration 4 is far worse than iteration 2's leaves iteration 2's
    checkpoint in place, byte for byte."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2", "--always_save_checkpoint=False"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes()
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 2  # iteration 2 improved on iteration 0: saved
    train(*common, "--max_iters=4", "--init_from=resume", "--learning_rate=3", cwd=tmp_path)
    val = {e["iter"]: e["val_loss"] for e in events(tmp_path, "eval")}
    assert list(val) == [0, 2, 4] and val[4] > val[2] + 10
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_a_resumed_runs_elapsed_time_counts_from_its_start(data, tmp_path):
    """elapsed_s (the done line's and the checkpoint's; compare.py tabulates it per run) of a resumed run adds the
    time up to its checkpoint, spent in the earlier process, to this process's own: so it is at least the
    checkpoint's elapsed_s plus the iterations trained since (ms_per_iter each at log_interval=1: disjoint
    stretches of this process's time). This process alone, with 2 of the run's 12 iterations, is far below."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=10"]
    train(*common, "--max_iters=10", cwd=tmp_path)
    before = load_checkpoint(tmp_path / "ckpt.pt")["elapsed_s"]
    train(*common, "--max_iters=12", "--init_from=resume", cwd=tmp_path)
    since = sum(e["ms_per_iter"] / 1000 for e in events(tmp_path, "train") if e["iter"] >= 10)
    assert events(tmp_path, "done")[0]["elapsed_s"] >= before + since
    assert load_checkpoint(tmp_path / "ckpt.pt")["elapsed_s"] >= before + since


def start_and_signal(args, out_dir, sig, after_iter, command=(sys.executable, str(TRAIN)), cwd=None):
    """Start train.py, send it sig once its log shows iteration after_iter, wait for it to end: (its
    return code, stdout)."""
    process = subprocess.Popen([*command, *map(str, args)], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, preexec_fn=takes_ctrl_c)
    log, deadline = Path(out_dir) / "log.jsonl", time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if log.exists() and any(e["event"] == "train" and e["iter"] >= after_iter
                                for e in map(json.loads, log.read_text().splitlines()[:-1])):  # (the last may be partial)
            break
        time.sleep(0.05)
    process.send_signal(sig)
    process.send_signal(sig)  # at once again, as a terminal and torchrun both signal a worker: one request
    out, _ = process.communicate(timeout=120)
    return process.returncode, out


def test_a_signal_stops_at_a_log_line_with_a_checkpoint_that_resumes_exactly(data, tmp_path, sig=signal.SIGTERM):
    """A scheduler's SIGTERM (or Ctrl-C's SIGINT: test_compare.py) mid-run: the run stops at its next log line,
    saves the state after its last step (no work lost since the last eval), logs `stopped` (not `done`: it
    did not finish) and exits with the shell's code for that signal. Resumed, it trains the straight run's losses."""
    common = [*TINY, f"--dataset={data}", "--dropout=0.1", "--residual=rd", "--eval_interval=1000",
              "--lr_decay_iters=2000", "--log_interval=2"]
    code, out = start_and_signal([*common, f"--out_dir={tmp_path / 'stopped'}", "--max_iters=2000"],
                                 tmp_path / "stopped", sig, after_iter=4, cwd=tmp_path)
    assert code == 128 + sig.value, out
    stopped = events(tmp_path / "stopped", "stopped")
    assert len(stopped) == 1 and not events(tmp_path / "stopped", "done") and stopped[0]["signal"] == sig.name
    at = stopped[0]["iter"]
    assert at % 2 == 1 and at < 2000  # the iteration after a log line (log_interval=2 logs the even ones)
    assert load_checkpoint(tmp_path / "stopped" / "ckpt.pt")["iter_num"] == at
    assert f"{sig.name}: stopped at iter {at}; {tmp_path / 'stopped' / 'ckpt.pt'} at iter {at}" in out
    train(*common, f"--out_dir={tmp_path / 'stopped'}", f"--max_iters={at + 4}", "--init_from=resume", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'straight'}", f"--max_iters={at + 4}", cwd=tmp_path)
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")
    assert not events(tmp_path / "stopped", "stopped")  # cut from the log with what followed the checkpoint


@pytest.mark.skipif(os.name == "nt", reason="a closed pipe is SIGPIPE's case, a Unix one")
@pytest.mark.parametrize("stderr_to", ["its own pipe", "the same pipe"])
def test_a_closed_stdout_stops_at_a_log_line_with_a_checkpoint(data, tmp_path, stderr_to):
    """`python train.py | head` (or `2>&1 | head`, stderr in the same pipe): once the reader is gone, the run does
    not die at its next print (a BrokenPipeError, its work since the last checkpoint lost) but stops at its next
    log line with a checkpoint, as on SIGTERM, says so on stderr where stderr has a reader, and exits 141
    (128 + SIGPIPE); resumed, it trains on."""
    args = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--max_iters=100000", "--lr_decay_iters=100000",
            "--eval_interval=100000", "--log_interval=2"]
    process = subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE if stderr_to == "its own pipe" else subprocess.STDOUT, text=True)
    for line in process.stdout:
        if line.startswith("iter 4:"):
            break
    process.stdout.close()  # as `head` exits
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 141, stderr
    stopped = events(tmp_path, "stopped")
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGPIPE" and 4 < stopped[0]["iter"] < 100000
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == stopped[0]["iter"]
    if stderr_to == "its own pipe":
        assert ("stdout was closed (its reader stopped): training stops at its next log line, where it saves its "
                "work\n") in stderr and "Traceback" not in stderr
        assert f"SIGPIPE: stopped at iter {stopped[0]['iter']}; {tmp_path / 'ckpt.pt'}" in stderr
    train(*args[:-4], f"--max_iters={stopped[0]['iter'] + 2}", "--init_from=resume", cwd=tmp_path)


@pytest.mark.skipif(os.name == "nt", reason="a closed file descriptor 1 is a Unix case")
def test_a_run_started_without_stdout_trains(data, tmp_path):
    """`python train.py >&-` (no stdout at all: Python's sys.stdout is None) trains to its end, as print does
    nothing there."""
    result = subprocess.run([sys.executable, str(TRAIN), *TINY, f"--dataset={data}", f"--out_dir={tmp_path}",
                             "--max_iters=2", "--eval_interval=2"], cwd=tmp_path, env=ENV, stdout=None,
                            stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=lambda: os.close(1))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert events(tmp_path, "done") and (tmp_path / "ckpt.pt").exists()


def test_a_second_signal_later_stops_at_once(data, tmp_path):
    """A run between log lines (log_interval=10^6) gets Ctrl-C, then Ctrl-C again 3 s later: it stops at once,
    without a checkpoint or a `stopped` line, as Python stops on a KeyboardInterrupt."""
    args = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--max_iters=1000000", "--lr_decay_iters=1000000",
            "--log_interval=1000000", "--eval_interval=1000000"]
    process = subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, preexec_fn=takes_ctrl_c)
    log, deadline = tmp_path / "log.jsonl", time.time() + 120
    while time.time() < deadline and not (log.exists() and '"event": "train"' in log.read_text()):
        time.sleep(0.05)  # iteration 0's log line: the next is 10^6 iterations away
    process.send_signal(signal.SIGINT)
    time.sleep(3)
    assert process.poll() is None  # still training towards its next log line
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0 and "KeyboardInterrupt" in output
    assert not events(tmp_path, "stopped") and not (tmp_path / "ckpt.pt").exists()


def test_an_ignored_ctrl_c_stays_ignored(data, tmp_path):
    """A run started with SIGINT ignored (a shell's background job, `train.py &` in a script) is not stopped by it."""
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
    process = subprocess.Popen([sys.executable, str(TRAIN), *TINY, f"--dataset={data}", f"--out_dir={tmp_path}",
                                "--max_iters=300", "--lr_decay_iters=300", "--eval_interval=300"], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)
    log, deadline = tmp_path / "log.jsonl", time.time() + 120
    while time.time() < deadline and process.poll() is None and not (log.exists() and '"iter": 20,' in log.read_text()):
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0 and len(events(tmp_path, "done")) == 1 and not events(tmp_path, "stopped"), output


def test_a_signal_stops_every_torchrun_rank_together(data, tmp_path):
    """Under torchrun the ranks get a signal at different iterations (here only one worker gets it): they agree
    at the next log line and stop together, with one checkpoint."""
    out = tmp_path / "two"
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    process = subprocess.Popen([*torchrun, *TINY, f"--dataset={data}", f"--out_dir={out}", "--max_iters=2000",
                                "--lr_decay_iters=2000", "--eval_interval=1000", "--gradient_accumulation_steps=2"],
                               cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, deadline = out / "log.jsonl", time.time() + 120
    while time.time() < deadline and not (log.exists() and '"iter": 3,' in log.read_text()):
        time.sleep(0.05)
    ranks = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    assert len(ranks) == 2, ranks
    os.kill(int(max(ranks, key=int)), signal.SIGTERM)  # one worker only (likely rank 1: rank 0 alone writes the log)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0 and "stopped at iter" in output, output  # stopped, not finished
    stopped = events(out, "stopped")
    assert len(stopped) == 1 and not events(out, "done"), output
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == stopped[0]["iter"]


def test_the_log_starts_with_the_code_machine_and_settings(data, tmp_path):
    """Provenance: log.jsonl's first line names the commit (and whether tracked files differed from it),
    torch, the device and every setting, so a published number traces back to what made it."""
    (tmp_path / "log.jsonl").write_text('{"event": "eval", "iter": 9}\n')  # a run's that stopped before its first save
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--max_iters=1", "--eval_interval=1", "--seed=5", cwd=tmp_path)
    first = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert first["event"] == "start" and first["torch"] == torch.__version__ and first["device"] == "cpu"
    assert first["config"]["seed"] == 5 and first["config"]["n_layer"] == 2 and first["config"]["dataset"] == str(data)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=TRAIN.parent, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (CI's is one); an unpacked copy logs None
        assert first["commit"] == head.stdout.strip() and isinstance(first["dirty"], bool)


def test_torchrun_two_ranks_match_one_process(data, tmp_path):
    """gradient_accumulation_steps counts micro-batches over all ranks (nanoGPT's convention), and
    every iteration's windows come from one generator, rank r taking micro-batches r, r+2, ...: so
    2 ranks x 2 micro-steps see exactly the batches of 1 process x 4 micro-steps. Only the order of
    the float32 sums differs (gloo's all-reduce, the per-rank loss scaling), a relative 1e-7 per
    step; Adam carries it over a few steps to ~1e-6. Tolerance: 1e-5 relative. Both count an iteration's tokens
    over all ranks (tokens_per_s) and its FLOPs against the peak of all ranks (mfu), so the two report the same
    throughput for the same pace."""
    common = [*TINY, f"--dataset={data}", "--residual=delta", "--max_iters=5", "--eval_interval=5",
              "--gradient_accumulation_steps=4"]
    train(*common, f"--out_dir={tmp_path / 'one'}", cwd=tmp_path)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    train(*common, f"--out_dir={tmp_path / 'two'}", command=torchrun, cwd=tmp_path)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == list(two) == list(range(5))
    for it in one:  # observed: equal, or 7e-8 apart
        assert two[it] == pytest.approx(one[it], rel=1e-5)
    val = [events(tmp_path / d, "eval")[-1]["val_loss"] for d in ("one", "two")]
    assert val[1] == pytest.approx(val[0], rel=1e-5)
    flops_per_token = GPT(GPTConfig.from_dict(load_checkpoint(tmp_path / "one" / "ckpt.pt")["model_args"])).flops_per_token()
    tokens_per_iter = 4 * 8 * 32  # gradient_accumulation_steps x batch_size x block_size, all ranks together
    for d, ranks in (("one", 1), ("two", 2)):
        for e in events(tmp_path / d, "train"):  # (rel=1e-9: only the float rounding of ms_per_iter's * 1000)
            seconds = e["ms_per_iter"] / 1000
            assert e["tokens_per_s"] * seconds == pytest.approx(tokens_per_iter, rel=1e-9), d
            peak = ranks * 1e12  # TINY's peak_tflops=1.0, per device
            assert e["mfu"] * peak * seconds == pytest.approx(flops_per_token * tokens_per_iter, rel=1e-9), d


def torchrun_straight_and_resumed(data, tmp_path, ranks):
    """The training losses of an rd run with dropout on `ranks` torchrun ranks: 6 iterations straight, and 3 +
    resume + 3 (each rank accumulates one micro-batch a step)."""
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", str(TRAIN))
    common = [*TINY, f"--dataset={data}", "--dropout=0.1", "--residual=rd", "--eval_interval=3",
              f"--gradient_accumulation_steps={ranks}"]
    train(*common, f"--out_dir={tmp_path / 'straight'}", "--max_iters=6", command=torchrun, cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=3", command=torchrun, cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'halves'}", "--max_iters=6", "--init_from=resume", command=torchrun,
          cwd=tmp_path)
    return losses(tmp_path / "straight"), losses(tmp_path / "halves")


def test_torchrun_resume_is_exact_with_each_ranks_dropout_stream(data, tmp_path):
    """Two ranks, dropout on: 6 iterations straight == 3 + resume + 3, bit for bit. Each rank's RNG state is
    saved and given back to that rank (rank 1 resumed with rank 0's dropout stream measured 5e-4 off).
    (With 2 ranks the all-reduce's a + b is exact in either order; docs/usage.md, "Resume", says why 3 or more
    ranks give equal-to-rounding losses.)"""
    straight, halves = torchrun_straight_and_resumed(data, tmp_path, ranks=2)
    assert list(halves) == list(range(6)) and halves == straight
    rngs = load_checkpoint(tmp_path / "straight" / "ckpt.pt")["rng"]  # seed + 1 + rank: a dropout stream per rank
    assert len(rngs) == 2 and not torch.equal(rngs[0]["torch"], rngs[1]["torch"])


def test_torchrun_resume_on_three_ranks_agrees_to_rounding(data, tmp_path):
    """Three ranks: 6 iterations straight and 3 + resume + 3 give the same losses up to the iteration of the
    resume, bit for bit, and to rounding after it, as docs/usage.md ("Resume") promises: the first step after
    a resume may sum the ranks' gradients in another order (at this size they came out equal to the bit too).
    1e-5 of the loss is about 100 float32 roundings of it; ranks 1 and 2 resumed with rank 0's dropout stream
    already differ at the resume's first iteration."""
    straight, halves = torchrun_straight_and_resumed(data, tmp_path, ranks=3)
    assert list(halves) == list(range(6)) and [halves[i] for i in range(4)] == [straight[i] for i in range(4)]
    assert all(abs(halves[i] - straight[i]) <= 1e-5 * straight[i] for i in range(4, 6)), (halves, straight)


def test_a_cut_log_stops_every_torchrun_rank_with_one_line(data, tmp_path):
    """A resume whose log.jsonl is shorter than its checkpoint saw is refused on every rank, each with the
    one-line error: checked on rank 0 alone, the other rank went on into a collective and died in a gloo
    traceback. (torchrun then prints its own report of the failed workers.)"""
    out = tmp_path / "run"
    common = [*TINY, f"--dataset={data}", f"--out_dir={out}", "--eval_interval=2", "--gradient_accumulation_steps=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    os.truncate(out / "log.jsonl", 100)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    result = train(*common, "--max_iters=4", "--init_from=resume", command=torchrun, cwd=tmp_path, ok=False)
    assert result.returncode != 0
    for rank in (0, 1):
        assert f"[rank {rank}] error: {out / 'log.jsonl'} is shorter than when" in result.stderr, result.stderr


def test_converted_checkpoint_keeps_its_loss(data, tmp_path):
    """init_from=<a standard checkpoint> in every routed mode: the step-0 val loss is the source's. An attnres
    checkpoint converts into rd with its loss too; into delta, with a note that the function changed. With
    no mode set, the source's own: the run's recorded settings name that model."""
    source = standard_checkpoint(tmp_path / "source.pt", data)
    val = {}
    for mode in ("standard", "delta", "attnres/res_blocks=2", "rd"):
        residual, _, blocks = mode.partition("/res_blocks=")
        out = tmp_path / mode.replace("/", "_")
        result = train(*TINY, f"--dataset={data}", f"--out_dir={out}", f"--init_from={source}", f"--residual={residual}",
                       f"--res_blocks={blocks or 0}", "--max_iters=0", cwd=tmp_path)
        val[mode] = events(out, "eval")[0]["val_loss"]
        ckpt = torch.load(out / "ckpt.pt", weights_only=True)  # the converted model is saved
        assert ckpt["model_args"]["residual"] == residual and ckpt["iter_num"] == 0
        if residual != "standard":
            assert "pseudo-queries start at zero" in result.stdout
        assert "MFU against" not in result.stdout  # (max_iters=0 trains nothing: no peak to measure)
    for mode in val:
        assert val[mode] == pytest.approx(val["standard"], abs=1e-5), val
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'attnres2'}", f"--init_from={source}", "--residual=attnres",
          "--res_blocks=2", "--max_iters=4", "--eval_interval=4", "--res_query_lr_mult=10", cwd=tmp_path)
    attnres = tmp_path / "attnres2" / "ckpt.pt"  # trained, so its queries (of routes over 2 or more sources) are not zero
    queries = {k: v for k, v in torch.load(attnres, weights_only=True)["model"].items() if "attn_res_query" in k}
    assert sum(bool(v.any()) for v in queries.values()) == len(queries) - 1  # all but the first layer's (1 source)
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'rd2'}", f"--init_from={attnres}", "--residual=rd",
                   "--res_blocks=2", "--max_iters=0", cwd=tmp_path)  # w_v starts as w_qk: the same function
    assert events(tmp_path / "rd2", "eval")[0]["val_loss"] == pytest.approx(events(attnres.parent, "eval")[-1]["val_loss"],
                                                                             abs=1e-5)
    assert "note" not in result.stdout
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'delta2'}", f"--init_from={attnres}",
                   "--residual=delta", "--res_blocks=2", "--max_iters=0", cwd=tmp_path)
    assert (f"note: {attnres} (attnres, res_blocks=2) loaded as this model (delta, res_blocks=2, its heads and linears) "
            "computes another function" in result.stdout)
    out = tmp_path / "as_is"  # no mode set: the source's own, standard, which the log and the checkpoint name (not delta)
    train(*TINY, f"--dataset={data}", f"--out_dir={out}", f"--init_from={source}", "--max_iters=0", cwd=tmp_path)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["model_args"]["residual"] == "standard"
    for config in (ckpt["config"], events(out, "start")[0]["config"]):
        assert {k: config[k] for k in ckpt["model_args"]} == ckpt["model_args"]


def test_init_from_takes_this_runs_block_size_and_crops_a_longer_context_with_a_note(data, tmp_path):
    """block_size is this run's (train.py's 128 unless set), not the source's: a shorter one keeps the first
    positions of the source's position embedding, with a note."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=256, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32)
    source = tmp_path / "source.pt"
    save_checkpoint(dict(model=GPT(config).state_dict(), model_args=asdict(config), iter_num=0, best_val_loss=0.0), source)
    wpe = load_checkpoint(source)["model"]["transformer.wpe.weight"]
    no_block_size = [a for a in TINY if not a.startswith("--block_size=")]
    for args, block_size, said in ((no_block_size, 128, " (train.py's default; set --block_size to keep more)"),
                                   (TINY + ["--block_size=16"], 16, "\n")):
        out = tmp_path / f"block{block_size}"
        result = train(*args, f"--dataset={data}", f"--out_dir={out}", f"--init_from={source}", "--max_iters=0",
                       cwd=tmp_path)
        assert f"note: the context is cropped to block_size={block_size} from {source}'s 256{said}" in result.stdout
        ckpt = load_checkpoint(out / "ckpt.pt")
        assert ckpt["model_args"]["block_size"] == block_size
        assert torch.equal(ckpt["model"]["transformer.wpe.weight"], wpe[:block_size])


def test_a_nanogpt_checkpoint_converts(data, tmp_path):
    """nanoGPT's checkpoints: a compiled model's names (every one prefixed _orig_mod.) and model_args without this
    project's settings. Loaded as attnres they keep their loss; with another n_head they load with the note."""
    source = standard_checkpoint(tmp_path / "source.pt", data)
    ckpt = load_checkpoint(source)
    nanogpt = tmp_path / "nanogpt.pt"
    save_checkpoint(dict(model={"_orig_mod." + k: v for k, v in ckpt["model"].items()}, iter_num=0, best_val_loss=0.0,
                         model_args={k: ckpt["model_args"][k] for k in ("n_layer", "n_head", "n_embd", "block_size",
                                                                           "bias", "vocab_size", "dropout")}), nanogpt)
    val = {}
    for name, path in (("ours", source), ("nanogpt", nanogpt)):
        train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / name}", f"--init_from={path}", "--residual=attnres",
              "--max_iters=0", cwd=tmp_path)
        val[name] = events(tmp_path / name, "eval")[0]["val_loss"]
    assert val["nanogpt"] == val["ours"]
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'heads'}", f"--init_from={nanogpt}", "--n_head=4",
                   "--max_iters=0", cwd=tmp_path)
    assert f"note: {nanogpt} (standard, res_blocks=0) loaded as this model" in result.stdout


def test_a_longer_context_is_cropped_to_its_first_positions(data, tmp_path):
    """init_from a checkpoint trained with a longer context than block_size keeps its first block_size position
    embeddings (nanoGPT's crop_block_size) and every other weight as it was."""
    source = standard_checkpoint(tmp_path / "source.pt", data)  # block_size 32
    out = tmp_path / "out"
    short = [a for a in TINY if not a.startswith("--block_size=")] + ["--block_size=16"]
    result = train(*short, f"--dataset={data}", f"--out_dir={out}", f"--init_from={source}", "--max_iters=0", cwd=tmp_path)
    assert "the context is cropped to block_size=16" in result.stdout
    cropped, whole = load_checkpoint(out / "ckpt.pt")["model"], load_checkpoint(source)["model"]
    assert cropped.keys() == whole.keys()
    assert torch.equal(cropped["transformer.wpe.weight"], whole["transformer.wpe.weight"][:16])
    assert all(torch.equal(v, whole[k]) for k, v in cropped.items() if k != "transformer.wpe.weight")


@pytest.mark.parametrize("log_interval", [1, 100])
def test_nonfinite_loss_stops_and_keeps_the_last_checkpoint(data, tmp_path, log_interval):
    """A loss is read at its log line, or else one iteration late: either way the lost iteration is the one
    reported, and nothing is evaluated or saved after it (log_interval=100: iteration 4's eval would)."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes()
    result = train(*common, "--max_iters=6", "--init_from=resume", "--learning_rate=1e30", "--grad_clip=0",
                   f"--log_interval={log_interval}", cwd=tmp_path, ok=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: the loss is nan"), result.stderr
    assert f"the last good checkpoint, {tmp_path / 'ckpt.pt'} at iter 2, is kept" in result.stderr
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    # iteration 2 is computed with the checkpoint's weights and its step spoils them: iteration 3 is lost
    assert [e["iter"] for e in events(tmp_path, "error")] == [3] and "at iter 3," in result.stderr
    assert [e["iter"] for e in events(tmp_path, "eval")] == [0, 2]  # no eval at 4, with lost weights


def spoil_a_checkpoint(data, tmp_path, *args, command=(sys.executable, str(TRAIN))):
    """Train to a checkpoint at iter 2, resume it with a step that makes every weight non-finite (its loss,
    iteration 3's, would show it, one iteration late) and *args: (the run's result, the checkpoint's bytes)."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes()
    return train(*common, "--init_from=resume", "--learning_rate=1e30", "--grad_clip=0", *args, cwd=tmp_path,
                 command=command, ok=False), before


def test_a_lost_iteration_stops_the_run_at_the_next_one_between_log_lines(data, tmp_path):
    """Between log lines and evaluations (here 100 iterations apart) a loss is still read one iteration late:
    iteration 3, the first lost one, is reported during iteration 4, not after training on lost weights up to
    the end of the run (iteration 6) or the next log line."""
    result, before = spoil_a_checkpoint(data, tmp_path, "--max_iters=6", "--eval_interval=100", "--log_interval=100")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: the loss is nan at iter 3, stopping; "), result.stderr
    assert [e["iter"] for e in events(tmp_path, "error")] == [3] and (tmp_path / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("when", ["an eval", "the end"])
def test_weights_spoilt_right_before_an_eval_are_never_saved(data, tmp_path, when):
    """The step of iteration 2 spoils the weights and an evaluation comes right after it, at iteration 3,
    before any loss shows it: the run stops there with the last good checkpoint, whether the evaluation
    saves (always_save_checkpoint) or ends the run."""
    args = ["--eval_interval=3", "--max_iters=6"] if when == "an eval" else ["--max_iters=3", "--always_save_checkpoint=False"]
    result, before = spoil_a_checkpoint(data, tmp_path, *args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: the loss is nan (train), nan (val) at iter 3, stopping; "
                                    f"the last good checkpoint, {tmp_path / 'ckpt.pt'} at iter 2, is kept"), result.stderr
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert [e["iter"] for e in events(tmp_path, "eval")] == [0, 2] and not events(tmp_path, "done")


# train.py with a stop requested (SIGTERM to itself) the moment it installs its handler, before the first
# iteration: the stop comes at the first log line, as a signal would, but at a known iteration
STOP_REQUESTED_AT_START = """
import os, runpy, signal, sys
install = signal.signal
def install_then_signal(sig, handler):
    previous = install(sig, handler)
    if sig == signal.SIGTERM and getattr(handler, "__name__", None) == "request_stop":
        os.kill(os.getpid(), signal.SIGTERM)
    return previous
signal.signal = install_then_signal
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_weights_spoilt_right_before_a_stop_are_never_saved(data, tmp_path):
    """A stop requested before iteration 2, whose step spoils the weights: the run stops at that iteration's
    log line, before any loss shows it; one forward over an evaluation batch does, and nothing is saved."""
    result, before = spoil_a_checkpoint(data, tmp_path, "--max_iters=100", "--eval_interval=100",
                                        command=(sys.executable, "-c", STOP_REQUESTED_AT_START, str(TRAIN)))
    assert result.returncode == 1 and "error: the loss is nan (train) at iter 3, stopping; " \
        f"the last good checkpoint, {tmp_path / 'ckpt.pt'} at iter 2, is kept" in result.stderr, result.stderr
    assert (tmp_path / "ckpt.pt").read_bytes() == before and not events(tmp_path, "stopped")


def test_a_stop_with_always_save_checkpoint_false_keeps_the_best_checkpoint(data, tmp_path):
    """always_save_checkpoint=False keeps the checkpoint of the best val loss, saved at its evaluation: a stop
    (here requested before the resumed run's first iteration, seen at its log line) saves nothing over it."""
    common = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--always_save_checkpoint=False"]
    train(*common, "--max_iters=2", "--eval_interval=2", cwd=tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes()
    result = train(*common, "--max_iters=100", "--eval_interval=100", "--init_from=resume", cwd=tmp_path, ok=False,
                   command=(sys.executable, "-c", STOP_REQUESTED_AT_START, str(TRAIN)))
    assert result.returncode == 128 + signal.SIGTERM.value, result.stdout + result.stderr
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert [(e["iter"], e["ckpt"]) for e in events(tmp_path, "stopped")] == [(3, str(tmp_path / "ckpt.pt"))]
    assert f"SIGTERM: stopped at iter 3; {tmp_path / 'ckpt.pt'} at iter 2" in result.stdout


def bad_inputs(data, tmp_path):
    """(arguments, what the one-line error says) for every kind of bad input."""
    source = standard_checkpoint(tmp_path / "source.pt", data)
    headless = load_checkpoint(source)  # (model_args without n_head, which no default can stand for)
    del headless["model_args"]["n_head"]
    save_checkpoint(headless, tmp_path / "headless.pt")
    wrong_data = make_dataset(tmp_path / "gpt2data", tokenizer="gpt2", vocab=VOCAB)
    nan_config = tmp_path / "nan_lr.py"  # (a config file: a command line cannot give nan)
    nan_config.write_text("learning_rate = float('nan')\n")
    return {  # more of the configurator's errors: test_configurator_errors
        "unknown key": (["--learning_rat=1e-3"], "unknown config key 'learning_rat' (see --help)"),
        "wrong type": (["--batch_size=1.5"], "batch_size=1.5 should be an integer"),
        "bad value": (["--residual=sideways"], "GPTConfig.residual='sideways' is not allowed"),
        "missing dataset": ([f"--dataset={tmp_path / 'nothing'}"], "no dataset at"),
        "vocab mismatch": (["--vocab_size=32"], "does not fit the model's vocab_size=32"),
        "tokenizer mismatch": ([f"--dataset={wrong_data}", f"--init_from={source}"], "trained on bytes tokens"),
        "shape mismatch": ([f"--init_from={source}", "--n_embd=48", "--n_head=2"], "do not match"),
        "no n_head in model_args": ([f"--init_from={tmp_path / 'headless.pt'}", "--max_iters=0"],
                                    f"{tmp_path / 'headless.pt'} has no n_head in its model_args"),
        "context past the source's": ([f"--init_from={source}", "--block_size=40"],
                                      "longer than the context of " + f"{source}, 32: set --block_size=32 or less"),
        "no checkpoint to resume": (["--init_from=resume"], "no checkpoint at"),
        "too short for block_size": (["--block_size=5000"], "hold no window of block_size + 1"),
        "compile_sublayers alone": (["--compile_sublayers=True"], "set compile=True as well"),
        "negative learning rate": (["--learning_rate=-1e-3"], "learning_rate=-0.001 must not be negative"),
        "negative seed": (["--seed=-1"], "seed=-1 must not be negative"),
        "seed past 64 bits": (["--seed=18446744073709551616"], f"does not fit a 64-bit generator: use one from 0 to {2**63 - 1}"),
        "negative min_lr": (["--min_lr=-1e-4"], "min_lr=-0.0001 must not be negative"),
        # (a schedule that would train, refused: --max_iters=1, so that a run let through ends soon)
        "min_lr above learning_rate": (["--min_lr=0.1", "--max_iters=1"], "min_lr=0.1 is above learning_rate=0.01: the "
                                                                          "decay would raise the rate; set min_lr"),
        "warmup past the decay's end": (["--warmup_iters=9", "--max_iters=1"], "warmup_iters=9 is more than "
                                                                               "lr_decay_iters=8: the warmup would run past"),
        "negative peak": (["--peak_tflops=-5.0"], "peak_tflops=-5.0 must not be negative"),  # (not: MFU against another peak)
        "beta past 1": (["--beta1=1.5"], "beta1=1.5 is one of AdamW's decay rates"),
        "beta of 1": (["--beta2=1.0"], "beta2=1.0 is one of AdamW's decay rates"),
        "zero eval_interval": (["--eval_interval=0"], "eval_interval=0 must be positive"),
        "nan learning rate": ([nan_config], "learning_rate=nan must not be negative"),
        "infinite learning rate": (["--learning_rate=1e999"], "learning_rate=inf must be finite"),
        "empty out_dir": (["--out_dir="], "out_dir is empty (an unset shell variable in --out_dir=$DIR?)"),
        "misspelt dataset": (["--dataset=shakespear"], "(no meta.json): did you mean --dataset=shakespeare? Else prepare"),
        "dataset not prepared": (["--dataset=finewebedu10B"], "(no meta.json): prepare it first with `python prepare.py "
                                                             "finewebedu10B`"),  # (not "did you mean fineweb10B?")
        "a setting without its dashes": (["n_layer=3"], "cannot read config file n_layer=3 (No such file or directory): "
                                                        "did you mean --n_layer=3?"),
    }


def test_bad_inputs_are_one_line_errors(data, tmp_path):
    for name, (args, message) in bad_inputs(data, tmp_path).items():
        result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", *args, cwd=tmp_path, ok=False)
        assert result.returncode != 0, name
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), (name, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert not (tmp_path / "out").exists(), name  # (refused after making it or before: no out_dir left behind)


def test_a_refused_run_takes_back_the_out_dir_it_made(data, tmp_path):
    """A run refused after it made its out_dir (here: a block_size longer than the data's shards, found once they
    are read) removes the folders it made, every level of them, as they are still empty; a folder that was there
    before stays."""
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'new' / 'out'}", "--block_size=5000",
                   cwd=tmp_path, ok=False)
    assert result.returncode == 1 and "hold no window of block_size + 1" in result.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'there'}", "--block_size=5000", cwd=tmp_path,
                   ok=False)
    assert result.returncode == 1 and (tmp_path / "there").is_dir()


REMOVED_BEFORE_THE_LOCK = """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import common
lock = common.lock_folder
def removed_first(folder, hold=True):
    os.rmdir(folder)  # as another train.py, refused there, takes back the out_dir it made
    return lock(folder, hold)
common.lock_folder = removed_first
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_an_out_dir_removed_as_the_run_starts_is_one_line(data, tmp_path):
    """Two train.py started at once in a new out_dir: the first makes it, is refused and takes it back, while the
    second, which found it there, is about to lock it. The second then stops in one line, not a traceback."""
    (tmp_path / "out").mkdir()
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--max_iters=1", cwd=tmp_path, ok=False,
                   command=(sys.executable, "-c", REMOVED_BEFORE_THE_LOCK, str(TRAIN)))
    assert result.returncode == 1 and result.stderr == (
        f"error: out_dir={tmp_path / 'out'} was removed as this run started (by another train.py refused there?): run "
        "the command again\n")


def test_an_out_dir_that_cannot_be_written_is_refused_before_training(data, tmp_path):
    """out_dir is tried before any work: a path through a file, a file, a link to a folder that is not there, or a
    folder where the checkpoint or the log goes, is one line naming it (not a traceback)."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_link").symlink_to(tmp_path / "nowhere")
    for name in ("ckpt.pt", "log.jsonl"):
        (tmp_path / f"folder_at_{name}" / name).mkdir(parents=True)
    for out_dir, problem in ((tmp_path / "a_file" / "out", f"{tmp_path / 'a_file'} is a file"),
                             (tmp_path / "a_file", f"{tmp_path / 'a_file'} is a file"),
                             (tmp_path / "a_link", f"{tmp_path / 'a_link'} is a link to {tmp_path / 'nowhere'}, which is "
                                                   "not there"),
                             *((tmp_path / f"folder_at_{name}", f"{tmp_path / f'folder_at_{name}' / name} is a folder")
                               for name in ("ckpt.pt", "log.jsonl"))):
        result = train(*TINY, f"--dataset={data}", f"--out_dir={out_dir}", "--max_iters=1", cwd=tmp_path, ok=False)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"error: out_dir={out_dir} cannot be written: {problem}"), result.stderr


def test_a_checkpoint_that_cannot_be_written_stops_the_run_in_one_line(data, tmp_path):
    """A save that fails (here: a file-size limit, as a full disk fails it) stops the run with one line that says
    what is saved and how to go on, and leaves no temporary file."""
    import resource

    def small_files():  # (SIGXFSZ ignored: a write past the limit then fails with EFBIG, as ENOSPC would)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))  # the log fits, a checkpoint (~400 kB) does not
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(TRAIN), *TINY, f"--dataset={data}", f"--out_dir={out}", "--max_iters=4",
                             "--eval_interval=2"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
                            preexec_fn=small_files)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: could not save {out / 'ckpt.pt'} (File too large)")
    assert "nothing is saved yet" in result.stderr  # (the first save: there is no checkpoint to resume)
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl"]


def test_a_checkpoint_that_cannot_be_written_stops_every_torchrun_rank_and_keeps_the_last_one(data, tmp_path):
    """Under torchrun a failed save (rank 0 writes it) stops every rank with the one line, the last checkpoint whole."""
    import resource

    def small_files():  # (SIGXFSZ ignored: a write past the limit then fails with EFBIG, as ENOSPC would)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))  # the log fits, a checkpoint (~400 kB) does not
    out = tmp_path / "out"
    common = [*TINY, f"--dataset={data}", f"--out_dir={out}", "--eval_interval=2", "--gradient_accumulation_steps=2"]
    train(*common, "--max_iters=2", cwd=tmp_path)
    before = (out / "ckpt.pt").read_bytes()
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    result = subprocess.run([*torchrun, *common, "--max_iters=4", "--init_from=resume"], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert result.returncode != 0
    for rank in (0, 1):  # (then torchrun's own report of the failed workers)
        assert (f"[rank {rank}] error: could not save {out / 'ckpt.pt'} (File too large): free space or make {out} "
                f"writable, then continue from {out / 'ckpt.pt'} (iter 2) with --init_from=resume\n") in result.stderr, \
            result.stderr
    assert (out / "ckpt.pt").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "log.jsonl"]


def test_a_log_that_cannot_be_written_stops_every_rank_in_one_line_that_says_how_to_go_on(data, tmp_path):
    """A log.jsonl that stops growing (a file-size limit just above its size, as a full disk) stops the run with one
    line: continue from the checkpoint it holds, or start again when nothing is saved. Under torchrun only rank 0
    writes the log, and every rank stops with its line, at the next log line, and saves nothing more."""
    import resource

    def limit(size):
        def small_files():  # (SIGXFSZ ignored: a write past the limit then fails with EFBIG, as ENOSPC would)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        return small_files

    probe = subprocess.run([sys.executable, "-c", "import torch; torch.optim.AdamW([torch.zeros(1, requires_grad=True)])"],
                           capture_output=True, text=True, preexec_fn=limit(200))
    if probe.returncode != 0:  # torch 2.7 writes a generated module to a temporary file as AdamW imports dynamo
        pytest.skip(f"torch {torch.__version__} itself cannot start under a 200-byte file-size limit")
    out = tmp_path / "out"
    common = [*TINY, f"--dataset={data}", f"--out_dir={out}", "--eval_interval=2", "--gradient_accumulation_steps=2"]
    run = lambda *args, command=(sys.executable, str(TRAIN)), size: subprocess.run(
        [*command, *common, *args], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
        preexec_fn=limit(size))
    result = run("--max_iters=2", size=200)  # the first line, the run's settings, does not fit
    assert result.returncode == 1 and result.stderr == (
        f"error: could not write {out / 'log.jsonl'} (File too large): free space or make {out} writable, then start "
        "the run again (nothing is saved yet)\n")
    shutil.rmtree(out)
    train(*common, "--max_iters=2", cwd=tmp_path)
    before = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_bytes()
    resume = f"continue from {out / 'ckpt.pt'} (iter 2) with --init_from=resume\n"
    result = run("--max_iters=4", "--init_from=resume", size=len(before[1]) + 100)  # the resume line does not fit
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and result.stderr.endswith(resume), result.stderr
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    result = run("--max_iters=4", "--init_from=resume", command=torchrun, size=len(before[1]) + 100)
    assert result.returncode != 0
    for rank in (0, 1):  # (then torchrun's own report of the failed workers)
        assert (f"[rank {rank}] error: could not write {out / 'log.jsonl'} (File too large): free space or make {out} "
                f"writable, then {resume}") in result.stderr, result.stderr  # (each rank's line whole, with its end)
    assert (out / "ckpt.pt").read_bytes() == before[0]


def test_a_token_beyond_the_vocabulary_is_a_one_line_error(tmp_path):
    """A shard whose tokens do not fit its meta.json's vocabulary (damaged, or another tokenizer's) is named in
    one line, where the embedding would fail with an index error."""
    data = make_dataset(tmp_path / "syn")
    tokens = np.arange(4_000) % VOCAB
    tokens[::20] = VOCAB  # in every window; the first id past the vocabulary, the edge of the check
    write_shard(data / "syn_val_000000.bin", tokens)
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--max_iters=2", cwd=tmp_path, ok=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"token id {VOCAB}, beyond the vocabulary of {VOCAB}" in result.stderr
    assert "syn_val_000000.bin" in result.stderr and "prepare the data again" in result.stderr


def test_windows_map_onto_shards_and_skip_a_shard_too_short_for_one(tmp_path):
    """Window i of a split lies in one shard (window i - first of shard k, shards of block_size tokens or fewer
    hold none, one of block_size + 1 holds one): a split in three shards, the middle one too short (train) or
    just long enough for one window (val), evaluates a checkpoint on exactly the windows this test reads itself
    (eval_iters x batch_size windows spread evenly from the first to the last of every window of the split)."""
    data = tmp_path / "shards"
    rng = np.random.default_rng(1)
    shards = {"train": [rng.integers(0, VOCAB, n) for n in (5_000, 20, 15_000)],
              "val": [rng.integers(0, VOCAB, n) for n in (1_000, 33, 3_000)]}
    for split, tokens in shards.items():
        for k, t in enumerate(tokens):
            write_shard(data / f"syn_{split}_{k:06d}.bin", t)
    write_meta(data, dict(tokenizer="bytes", vocab_size=VOCAB, train_tokens=20_020, val_tokens=4_033,
                          source="synthetic"))
    source = standard_checkpoint(tmp_path / "source.pt", data)
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", f"--init_from={source}", "--residual=standard",
          "--max_iters=0", cwd=tmp_path)
    logged = events(tmp_path / "out", "eval")[0]
    ckpt = load_checkpoint(source)
    model = GPT(GPTConfig.from_dict(ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    for split, tokens in shards.items():
        every_window = [t[i:i + 33] for t in tokens for i in range(len(t) - 32)]  # 20 tokens hold none of 33, 33 one
        windows = np.linspace(0, len(every_window) - 1, 2 * 8).astype(np.int64)
        rows = [every_window[w] for w in windows]
        xy = torch.from_numpy(np.stack(rows).astype(np.int64))
        with torch.no_grad():
            x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
            batch_losses = [model(x[b:b + 8], y[b:b + 8])[1].item() for b in (0, 8)]
        assert logged[f"{split}_loss"] == pytest.approx(sum(batch_losses) / 2, abs=1e-6), split


def test_help_lists_every_key_and_the_config_files_are_valid(tmp_path):
    configs = [REPO / "config" / f"{name}.py" for name in
               ("train_shakespeare_char", "finetune_shakespeare_gpt2_delta", "train_gpt2_fineweb")]
    result = train(*configs, "--help", cwd=REPO)  # the files are read and checked before --help prints
    keys = ("out_dir", "dataset", "batch_size", "block_size", "gradient_accumulation_steps", "learning_rate",
            "min_lr", "warmup_iters", "lr_decay_iters", "max_iters", "weight_decay", "beta1", "beta2",
            "grad_clip", "eval_interval", "eval_iters", "log_interval", "init_from", "device", "dtype",
            "compile", "seed", "res_query_lr_mult") + tuple(f.name for f in GPTConfig.__dataclass_fields__.values())
    listed = {line.split("=")[0].strip() for line in result.stdout.splitlines() if line.startswith("  ")}
    assert set(keys) <= listed
    assert "learning-rate multiplier of the routing pseudo-queries" in result.stdout


def test_configurator_errors(tmp_path, capsys):
    """Config files and overrides are checked against the defaults' types, each error one line, exit 2."""
    defaults = dict(batch_size=12, learning_rate=1e-3, compile=False, dataset="pydocs")
    config_file = tmp_path / "my_config.py"
    config_file.write_text("import math\nbatch_size = 4\nlearning_rate = math.sqrt(1e-6)\n")
    config, explicit = configurator.configure(defaults, [str(config_file), "--compile=True", "--learning_rate=3"], "train.py")
    assert config == dict(batch_size=4, learning_rate=3.0, compile=True, dataset="pydocs")
    assert explicit == {"batch_size", "learning_rate", "compile"}
    assert configurator.configure(defaults, ["--dataset=a/b c"], "train.py")[0]["dataset"] == "a/b c"  # strings as typed
    config_file.write_text("batch_size = 4\nlearning_rat = 1e-3\n")
    cases = {
        str(config_file): f"unknown config key 'learning_rat' in {config_file} (see --help)",
        "--compile=1": "compile=1 should be True or False",
        "--learning_rate=fast": "cannot read --learning_rate=fast",
        "--batch_size": "expected --key=value, got '--batch_size'",
        str(tmp_path / "missing.py"): "cannot read config file",
        "--learning_rate=1" + "0" * 400: "learning_rate is too large for a float",  # was an OverflowError
    }
    big = tmp_path / "big.py"
    big.write_text("learning_rate = 10 ** 5000\n")  # too large for a float, and for an int's repr
    cases[str(big)] = f"learning_rate in {big} is too large for a float"
    for arg, message in cases.items():
        with pytest.raises(SystemExit) as exit_:
            configurator.configure(defaults, [arg], "train.py")
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_configurator_refuses_a_bool_for_a_number_and_a_value_that_does_not_parse(capsys):
    """True is no number (Python's bool is an int): --batch_size=True or --learning_rate=True is refused,
    not trained as 1; a value that is no Python literal, an empty or unbalanced one included, is the same
    one-line error, not a traceback."""
    defaults = dict(batch_size=12, learning_rate=1e-3, compile=False, dataset="pydocs")
    cases = {
        "--batch_size=True": "batch_size=True should be an integer, like its default 12",
        "--learning_rate=True": "learning_rate=True should be a number, like its default 0.001",
        "--batch_size=": "cannot read --batch_size=: give a Python literal like its default 12",
        "--learning_rate=1e-3)": "cannot read --learning_rate=1e-3): give a Python literal",
    }
    for arg, message in cases.items():
        with pytest.raises(SystemExit) as exit_:
            configurator.configure(defaults, [arg], "train.py")
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {message}"), (arg, err)


def test_configurator_reads_strings_as_typed_and_skips_a_config_files_functions(tmp_path):
    """A string setting takes the text as it is, even one that reads as a number (--wandb_group=2024); a
    config file's functions and modules are its own, not settings."""
    defaults = dict(batch_size=12, dataset="pydocs", wandb_group="")
    config_file = tmp_path / "my_config.py"
    config_file.write_text("import math\ndef half(n):\n    return n // 2\nbatch_size = half(8)\n")
    config, explicit = configurator.configure(defaults, [str(config_file), "--wandb_group=2024", "--dataset=7"], "train.py")
    assert config == dict(batch_size=4, dataset="7", wandb_group="2024") and explicit == {"batch_size", "dataset", "wandb_group"}


def test_configurator_applies_files_and_overrides_left_to_right(tmp_path):
    """Arguments apply in the order given: a config file after an override wins over it, an override after a
    file wins over the file, and of two overrides of one key the last wins."""
    defaults = dict(batch_size=12, learning_rate=1e-3)
    config_file = tmp_path / "my_config.py"
    config_file.write_text("batch_size = 4\n")
    cases = {("--batch_size=8", str(config_file)): 4, (str(config_file), "--batch_size=8"): 8,
             ("--batch_size=8", "--batch_size=16"): 16, (str(config_file), "--batch_size=8", str(config_file)): 4}
    for argv, batch_size in cases.items():
        assert configurator.configure(defaults, list(argv), "train.py")[0] == dict(batch_size=batch_size,
                                                                                  learning_rate=1e-3), argv


def test_configurator_refuses_an_unknown_override_in_one_line(capsys):
    """A misspelt --key=value is the same one-line error, exit 2, as a misspelt key in a config file."""
    for arg in ("--batch_siz=8", "--Batch_size=8", "--=8"):
        with pytest.raises(SystemExit) as exit_:
            configurator.configure(dict(batch_size=12, dataset="pydocs"), [arg], "train.py")
        err = capsys.readouterr().err
        key = arg[2:].partition("=")[0]
        assert exit_.value.code == 2 and err == f"error: unknown config key {key!r} (see --help)\n", err


def test_configurator_takes_a_string_setting_as_typed_up_to_its_first_equals_sign():
    """A string setting is the text after the first '=', as it is: not a literal read and printed again
    (1e3 stays 1e3, quotes stay), and a later '=' is part of the value."""
    defaults = dict(dataset="pydocs", wandb_run_name="run", batch_size=12)
    config, explicit = configurator.configure(
        defaults, ["--dataset=1e3", "--wandb_run_name=lr=3e-4", "--batch_size=0x10"], "train.py")
    assert config == dict(dataset="1e3", wandb_run_name="lr=3e-4", batch_size=16)
    assert configurator.configure(defaults, ["--dataset='a'"], "train.py")[0]["dataset"] == "'a'"


def test_configurator_skips_a_config_files_private_names(tmp_path):
    """A config file's names that start with '_' are its own helpers, not settings: no unknown-key error."""
    config_file = tmp_path / "my_config.py"
    config_file.write_text("_tokens_per_step = 4096\nblock_size = 256\nbatch_size = _tokens_per_step // block_size\n")
    config, explicit = configurator.configure(dict(batch_size=12, block_size=1024), [str(config_file)], "train.py")
    assert config == dict(batch_size=16, block_size=256) and explicit == {"batch_size", "block_size"}


def test_script_defaults_are_the_literal_settings_after_the_imports(tmp_path):
    """script_defaults reads a script's config section without running it: after the docstring and imports, its
    literal bool, int, float and string settings, up to the first other statement (an expression included)."""
    script = tmp_path / "script.py"
    script.write_text('"""doc"""\nimport os\nfrom pathlib import Path\ncompile = True\nbatch_size = 12\n'
                      'learning_rate = 6e-4\ndataset = "pydocs"\nprint("start")\nmax_iters = 100\n')
    assert configurator.script_defaults(script) == dict(compile=True, batch_size=12, learning_rate=6e-4, dataset="pydocs")
    script.write_text("batch_size = 12\nblock_size = 2 * batch_size\nmax_iters = 100\n")
    assert configurator.script_defaults(script) == dict(batch_size=12)


def test_configurator_short_help_is_help(tmp_path, capsys):
    """-h, like --help, prints every key with its default and comment and exits 0 before later arguments are read."""
    script = tmp_path / "script.py"
    script.write_text("batch_size = 12  # sequences per step\n")
    for flag in ("-h", "--help"):
        with pytest.raises(SystemExit) as exit_:
            configurator.configure(dict(batch_size=12), [flag, "--nonsense=1"], str(script))
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and out.startswith("usage: python script.py ") and "batch_size=12  sequences per step" in out


def test_progress_line_shows_elapsed_time_and_eta(data, tmp_path):
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--max_iters=3", "--eval_interval=3", cwd=tmp_path)
    lines = [l for l in result.stdout.splitlines() if l.startswith("iter ")]
    assert len(lines) == 3 and all(" elapsed, ETA " in l for l in lines)
    assert lines[-1].endswith("ETA 0m00s")  # the last iteration has nothing left


def test_ms_per_iter_is_per_iteration_between_log_lines(data, tmp_path):
    """A log line's ms_per_iter (and so its tokens_per_s and mfu) is the time since the last log line divided by
    the iterations it covers, not their total: log lines at 0, 4 and 8 cover 1, 4 and 4 iterations, disjoint
    stretches of the run, so ms_per_iter x iterations summed over them cannot exceed the run's elapsed time (the
    total instead would count the 4-iteration stretches 4 times over, ~3x the elapsed time)."""
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path}", "--max_iters=9", "--eval_interval=100",
          "--log_interval=4", cwd=tmp_path)
    lines = events(tmp_path, "train")
    assert [e["iter"] for e in lines] == [0, 4, 8]
    covered = sum(e["ms_per_iter"] / 1000 * n for e, n in zip(lines, (1, 4, 4)))
    assert covered <= events(tmp_path, "done")[0]["elapsed_s"]


def test_wandb_logs_what_the_log_logs(data, tmp_path):
    """wandb_log=True, offline: the wandb run holds the numbers of log.jsonl's train and eval lines (the
    routing summary as routing/<key>) under the given project, name and group; the checkpoint records the
    run's id (eval.py adds its scores to that run)."""
    pytest.importorskip("wandb")
    out = tmp_path / "out"
    train(*TINY, f"--dataset={data}", f"--out_dir={out}", "--residual=rd", "--max_iters=4", "--eval_interval=2",
          "--wandb_log=True", "--wandb_project=protocol-test", "--wandb_run_name=rd-seed7", "--wandb_group=grid-7",
          cwd=tmp_path, env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    record = run.read_bytes()  # wandb's own binary log: keys and json values appear as text in it
    for text in ("protocol-test", "rd-seed7", "grid-7", "loss", "lr", "ms_per_iter", "tokens_per_s", "mfu",
                 "train_loss", "val_loss", "deep_max_weight", "mean_entropy", "mean_js"):
        assert text.encode() in record, text
    for number in (events(out, "eval")[-1]["val_loss"], events(out, "train")[-1]["loss"]):
        assert json.dumps(number).encode() in record
    run_id = load_checkpoint(out / "ckpt.pt")["wandb_run_id"]
    assert run.name == f"run-{run_id}.wandb"
    # resumed (the wandb settings, like the rest, from the checkpoint), it logs on into the same run
    train("--init_from=resume", f"--out_dir={out}", "--max_iters=6", cwd=tmp_path,
          env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"})
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and {r.name for r in runs} == {f"run-{run_id}.wandb"}
    assert load_checkpoint(out / "ckpt.pt")["wandb_run_id"] == run_id


def test_wandb_missing_is_a_one_line_error(data, tmp_path):
    """wandb is imported only for wandb_log=True; without the package that is one line saying what to install."""
    fake = tmp_path / "no_wandb" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
    result = train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--wandb_log=True", cwd=tmp_path,
                   ok=False, env={"PYTHONPATH": str(fake.parent)})
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: wandb_log=True needs the wandb package: pip install wandb")
    train(*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--max_iters=1", cwd=tmp_path,
          env={"PYTHONPATH": str(fake.parent)})  # without wandb_log, never imported


def test_a_wandb_run_that_cannot_start_stops_every_rank_in_one_line(data, tmp_path):
    """wandb.init failing (no login, no network: here a stand-in wandb that raises as the real one does without a key)
    is one line saying what to do, on every torchrun rank: rank 0 alone starts the wandb run, and a rank left
    waiting in a collective would die in a traceback."""
    fake = tmp_path / "failing_wandb" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class UsageError(Exception):\n    pass\n\n\ndef init(**kwargs):\n"
                                      "    raise UsageError('No API key configured. Use `wandb login` to log in.\\nmore')\n")
    line = ("error: wandb could not start the run (UsageError: No API key configured. Use `wandb login` to log in.): "
            "run `wandb login`, set WANDB_MODE=offline, or drop wandb_log\n")
    args = [*TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--wandb_log=True", "--gradient_accumulation_steps=2"]
    result = train(*args, cwd=tmp_path, ok=False, env={"PYTHONPATH": str(fake.parent)})
    assert result.returncode == 1 and result.stderr == line
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAIN))
    result = train(*args, command=torchrun, cwd=tmp_path, ok=False, env={"PYTHONPATH": str(fake.parent)})
    for rank in (0, 1):
        assert f"[rank {rank}] {line}" in result.stderr, result.stderr
    result = train(*TINY, f"--dataset={data}", "--gradient_accumulation_steps=-1", command=torchrun, cwd=tmp_path, ok=False)
    assert "[rank 0] error: gradient_accumulation_steps=-1 must be positive" in result.stderr  # (not: a multiple of 2)


def test_a_checkpoint_given_as_a_config_file_is_one_line(tmp_path, capsys):
    """`python train.py out/ckpt.pt` (and the same through compare.py): a binary file where a config file
    goes is one line that names it and says how a checkpoint is passed, not a UnicodeDecodeError."""
    import compare
    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint({"model": GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)).state_dict()}, ckpt)
    want = f"error: {ckpt} is not a Python config file (a checkpoint? pass it as --init_from={ckpt})\n"
    for read in (lambda: configurator.configure(dict(batch_size=12), [str(ckpt)], "train.py"),
                 lambda: compare.parse_args([str(ckpt)])):
        with pytest.raises(SystemExit) as exit_:
            read()
        assert exit_.value.code == 2 and capsys.readouterr().err == want
