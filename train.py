"""
Train a GPT with any residual mode, on one CPU or on many GPUs.

    python train.py                                         # a small delta model on pydocs, minutes on a CPU
    python train.py config/train_shakespeare_char.py --residual=attnres
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py
    python train.py --help                                  # every key, its default, what it does

Reads the shards of data/<dataset>/ (prepare.py), writes out_dir/ckpt.pt and out_dir/log.jsonl.
Started by torchrun it trains with DDP (NCCL on GPUs, gloo on CPUs), on any number of nodes that share a
filesystem (data/ and out_dir).
"""

import atexit
import difflib
import inspect
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
from common import (MAX_SEED, NonFiniteLosses, ReaderMayLeave, allow_tf32, autocast, bind_device, cannot_write, die,
                    first_line, hms, lock_folder, make_folders, once_per_node, peak_flops, process_group_options,
                    provenance, remove_empty_folders, resolve_device, resolve_dtype, routing_summary)
from checkpoint import (GPT2_CONFIGS, checkpoint_model_args, clean_state_dict, converts_exactly, download_gpt2,
                        load_checkpoint, load_gpt2, load_state_into, save_checkpoint)
from download import DownloadError
from model import GPT, GPTConfig
from prepare import DATA_ROOT, DATASETS, prepare
from shards import ShardError, find_shards, fingerprint, load_meta, read_shard

# -----------------------------------------------------------------------------
# default config values: the default run, a small delta model on pydocs (offline) in a few minutes on a CPU
# I/O
out_dir = "out"  # ckpt.pt and log.jsonl go here
eval_interval = 500  # evaluate at the first iteration, every this many and at the end; checkpoint there (not at the start)
log_interval = 10  # a progress line every this many iterations
eval_iters = 20  # batches of each split per evaluation, always the same windows
eval_only = False  # evaluate once, then exit
always_save_checkpoint = True  # False: save only when the val loss improves
init_from = "scratch"  # scratch | resume | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | path/to/ckpt.pt
cache_dir = "cache"  # where downloaded GPT-2 weights are kept
# data
dataset = "pydocs"  # a folder of data/ made by prepare.py, or a path to one
gradient_accumulation_steps = 1  # micro-batches per iteration, all ranks together
batch_size = 16  # sequences per micro-batch
block_size = 128  # context length
# model: every GPTConfig field (with init_from a checkpoint or gpt2, the ones you set override its own)
n_layer = 4  # transformer layers (2 sublayers each)
n_head = 4  # attention heads
n_embd = 128  # model width
dropout = 0.0  # dropout probability
bias = True  # biases in Linears and LayerNorms, like GPT-2
vocab_size = 0  # 0: the dataset's vocabulary, rounded up to a multiple of 64
residual = "delta"  # standard | attnres | delta | rd
res_blocks = 0  # routing blocks: 0 = per sublayer, else a divisor of 2 * n_layer
fixed_value_route = False  # rd only: the value pseudo-queries never train (stay zero: a uniform value route)
lowrank_rank = 0  # 0 = dense linears, r > 0 = low-rank W = B A of rank r
lowrank_act = "silu"  # activation between A and B: silu | identity
dlr = False  # Duplicated Latent Residual on every low-rank linear
dlr_alpha = 1.0  # DLR scale
# AdamW
learning_rate = 1e-3  # peak learning rate
max_iters = 2000  # training iterations
weight_decay = 0.1  # on matrices only
beta1 = 0.9  # AdamW beta1
beta2 = 0.99  # AdamW beta2
grad_clip = 1.0  # clip the gradient norm at this value, 0 = off
res_query_lr_mult = 1.0  # learning-rate multiplier of the routing pseudo-queries
# learning rate schedule
decay_lr = True  # False: a constant learning_rate
warmup_iters = 100  # linear warmup iterations
lr_decay_iters = 2000  # cosine decay ends here, ~= max_iters per Chinchilla
min_lr = 1e-4  # the learning rate after decay, ~= learning_rate / 10 per Chinchilla
# system
device = "auto"  # auto (cuda, mps, then cpu) | cpu | cuda | cuda:1 | mps
dtype = "auto"  # auto (GPU: bfloat16, or float16 where it is emulated; CPU, MPS: float32) | float32 | bfloat16 | float16
compile = False  # torch.compile the model
compile_sublayers = False  # with compile: compile each layer's sublayers (two graphs every layer shares), routes left eager
fused_route = True  # on CUDA, routes run as one Triton kernel each where Triton imports (False: model.py's plain route)
bf16_sources = True  # fused route under bfloat16: routing sources (and block sums) in bfloat16, math in float32 (False: float32)
peak_tflops = 0.0  # MFU's peak per device, TFLOP/s; 0 = the GPU's datasheet figure (bfloat16, float16), or a measured matmul where none is listed or in float32
seed = 1337  # model init, training windows and (seed + 1 + rank) dropout; same seed = same backbone in every mode
# experiment tracking, as nanoGPT does it (needs `pip install wandb`)
wandb_log = False  # also send what log.jsonl logs to Weights & Biases
wandb_project = "nanoattnres"  # the wandb project
wandb_run_name = ""  # the wandb run's name; "" = the out_dir's name
wandb_group = ""  # a wandb group; compare.py puts the runs of one grid in one
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()  # (not a CONSTANT imported above)
               if not k.startswith("_") and not k.isupper() and isinstance(v, (bool, int, float, str))]
config, explicit = configurator.configure({k: globals()[k] for k in config_keys}, sys.argv[1:], __file__)
# -----------------------------------------------------------------------------
if os.name != "nt" and sys.stdout is not None:  # (`python train.py | head`: see agree_on_stop; None: started >&-)
    sys.stdout = ReaderMayLeave(sys.stdout, "training stops at its next log line, where it saves its work")

# init_from=resume continues a run as it was: its settings come from its checkpoint, so `--init_from=resume
# --out_dir=DIR` alone resumes it, whatever config file it started from. Set again, a setting takes effect
# and is printed (its length, evaluation, schedule, dtype, compiling, dropout); those that decide its batches
# and what AdamW keeps in its own state (RESUMED_AS_TRAINED), and the model's shape (checked against the
# checkpoint's model_args below), stop the run instead: a new run from it may change them. Where this command
# runs is its own (NOT_RESUMED); the dtype is resumed as it was resolved (e.g. bfloat16), not re-chosen.
RESUMED_AS_TRAINED = ("dataset", "gradient_accumulation_steps", "batch_size", "block_size", "seed",
                      "weight_decay", "beta1", "beta2", "res_query_lr_mult")
NOT_RESUMED = ("init_from", "out_dir", "eval_only", "cache_dir", "device")  # (the device is stored resolved: cuda:0)
model_keys = [f.name for f in fields(GPTConfig)]
if not config["out_dir"].strip():  # ("" is the current folder: a run would write ckpt.pt and log.jsonl there)
    die("out_dir is empty (an unset shell variable in --out_dir=$DIR?): give the folder the run writes to")
ckpt_path, log_path = Path(config["out_dir"]) / "ckpt.pt", Path(config["out_dir"]) / "log.jsonl"
new_run_from_it = f"start a new run from it with --init_from={ckpt_path} and another out_dir"  # (what resume cannot do)
ckpt = None
if config["init_from"] == "resume":
    try:
        ckpt = load_checkpoint(ckpt_path, map_location="cpu")  # the model moves to the device once built
    except (FileNotFoundError, ValueError) as e:
        die(e)
    lacking = [k for k in ("optimizer", "iter_num", "rng", "data_rng", "log_bytes", "config") if k not in ckpt]
    if lacking:
        die(f"{ckpt_path} cannot be resumed (it has no {', '.join(lacking)}; train.py did not write it): {new_run_from_it}")
    trained, changed = ckpt["config"], []
    for k in config:
        if k in NOT_RESUMED or k not in trained or trained[k] == config[k]:
            continue
        if k not in explicit:
            config[k] = trained[k]
        elif k in RESUMED_AS_TRAINED:
            die(f"init_from=resume continues the run in {config['out_dir']} as it was, but {k}={config[k]!r} differs "
                f"from its {trained[k]!r}: drop {k}, or {new_run_from_it}")
        elif k not in model_keys or k == "dropout":  # (other model keys: checked when the model is built)
            changed.append(f"{k} {trained[k]!r} -> {config[k]!r}")
    if changed and int(os.environ.get("RANK", 0)) == 0:
        print(f"resuming {config['out_dir']} with: {', '.join(changed)}")
globals().update(config)  # config files and --key=value overrides (and, resuming, the run's own settings)


# distributed: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE
ddp = "RANK" in os.environ
rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
master = rank == 0  # only rank 0 prints, logs and saves
try:
    device = bind_device(resolve_device(device), ddp, local_rank)  # under torchrun: cuda:LOCAL_RANK
except ValueError as e:
    die(e)
device_type = device.split(":")[0]
if ddp:
    dist.init_process_group(**process_group_options(device))
barrier = dist.barrier if ddp else None  # for once_per_node
try:
    dtype = resolve_dtype(dtype, device)  # auto: see common.resolve_dtype
except ValueError as e:
    die(e)
if dtype == "float16" and device_type not in ("cuda", "cpu"):  # (torch's gradient scaler runs on both; not tried elsewhere)
    die(f"dtype=float16 trains with a gradient scaler, which train.py runs on CUDA and CPU: use bfloat16 or float32 "
        f"on {device_type}")
if compile_sublayers and not compile:
    die("compile_sublayers=True chooses what compile=True compiles: set compile=True as well")
for key in ("batch_size", "block_size", "eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps"):
    if not config[key] > 0:  # (not <= 0: nan is refused too)
        die(f"{key}={config[key]} must be positive")
if gradient_accumulation_steps % world_size:
    die(f"gradient_accumulation_steps={gradient_accumulation_steps} must be a multiple of the {world_size} ranks")
for key in ("learning_rate", "min_lr", "seed", "max_iters", "warmup_iters", "lr_decay_iters", "weight_decay",
            "res_query_lr_mult", "grad_clip", "peak_tflops"):  # (learning_rate=0: a frozen model, as the seeding tests use)
    if not config[key] >= 0:
        die(f"{key}={config[key]} must not be negative")
    if config[key] == math.inf:  # (a learning rate of inf trains one step, to a nan loss)
        die(f"{key}={config[key]} must be finite")
if seed > MAX_SEED:
    die(f"seed={seed} does not fit a 64-bit generator: use one from 0 to {MAX_SEED}")
for key in ("beta1", "beta2"):
    if not 0 <= config[key] < 1:
        die(f"{key}={config[key]} is one of AdamW's decay rates: give one in [0, 1), e.g. 0.9 or 0.95")
# the schedule get_lr follows, where this command chooses it: eval_only trains nothing, and a resumed run goes on
# with the schedule it trained with (from before these checks, maybe) unless the command sets part of it again
schedule_chosen = init_from != "resume" or bool({"decay_lr", "learning_rate", "min_lr", "warmup_iters",
                                                  "lr_decay_iters"} & set(explicit))
if decay_lr and not eval_only and schedule_chosen:
    # equal values are a schedule still: a constant rate, or a warmup straight into min_lr (a decay of no length)
    if min_lr > learning_rate:
        die(f"min_lr={min_lr} is above learning_rate={learning_rate}: the decay would raise the rate; set min_lr to at "
            f"most learning_rate (~ learning_rate / 10), or decay_lr=False for a constant rate")
    if warmup_iters > lr_decay_iters:
        die(f"warmup_iters={warmup_iters} is more than lr_decay_iters={lr_decay_iters}: the warmup would run past the "
            f"decay's end, then drop to min_lr at once; set warmup_iters to at most lr_decay_iters (a few percent of "
            f"it), or raise lr_decay_iters (~= max_iters)")
if wandb_log and not eval_only:  # (on every rank, though rank 0 alone logs: so that every rank stops here)
    try:
        import wandb  # optional: only a run that logs to wandb needs it
    except ImportError:
        die("wandb_log=True needs the wandb package: pip install wandb (or drop wandb_log)")
config.update(device=device, dtype=dtype)  # what this run used, saved with the checkpoint
micro_steps = gradient_accumulation_steps // world_size  # this rank's micro-batches per iteration
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
if device_type == "cuda":
    allow_tf32()  # float32 matmuls on tensor cores
ctx = autocast(device, dtype)
out_dir = Path(out_dir)
if not eval_only:  # (eval_only writes nothing there)
    # on every rank (the folder is shared), so that all of them stop here together, before any work is done
    for path in (ckpt_path, log_path):
        problem = cannot_write(path)
        if problem:
            problem = f"{path} is a folder" if problem == "it is a folder" else problem
            die(f"out_dir={out_dir} cannot be written: {problem}; choose another out_dir")
    if master:
        # a run refused from here on (its data, its model, its checkpoint) leaves no empty out_dir behind: what
        # it made is taken back at exit, if nothing was written there (a run that starts writes its log at once)
        atexit.register(remove_empty_folders, make_folders(out_dir))
    # one run writes an out_dir at a time: a second train.py there (a command started twice, a grid rerun while
    # a run it lost track of still trains) would interleave the logs and race the checkpoints
    try:
        locked = lock_folder(out_dir) if master else None
    except FileNotFoundError:  # (another train.py, refused there a moment ago, took back the out_dir it had made)
        die(f"out_dir={out_dir} was removed as this run started (by another train.py refused there?): run the command "
            "again")
    if locked is False:
        die(f"another train.py is running in {out_dir}: wait for it to end or stop it, or use another out_dir")
    if locked:  # no other train.py writes here, so a temporary checkpoint is a save cut short by a kill (as big as
        for stale in out_dir.glob(f".{ckpt_path.name}.tmp*"):  # a checkpoint each, and never read)
            stale.unlink(missing_ok=True)
if init_from != "resume" and ckpt_path.exists() and (not eval_only or init_from == "scratch"):
    # a new run would replace it at its first save (and its log at once): never another run's work silently;
    # and eval_only from scratch beside it would score a fresh model, not the checkpoint there
    die(f"{ckpt_path} holds an earlier run: {'evaluate' if eval_only else 'continue'} it with --init_from=resume, or "
        f"{'evaluate' if eval_only else 'train'} into another out_dir (or delete {out_dir} first)")

# -----------------------------------------------------------------------------
# data: data/<dataset>/*_{train,val}_*.bin and meta.json, from prepare.py

data_dir = Path(dataset) if "/" in dataset else DATA_ROOT / dataset


def prepare_pydocs():
    """A fresh machine trains with no extra step: pydocs is prepared where it is missing."""
    if not (data_dir / "meta.json").exists():
        try:
            prepare("pydocs")
        except ValueError as e:
            die(e)
        except OSError as e:  # a full disk, a folder that cannot be written
            die(f"could not prepare pydocs in {data_dir} ({e.strerror or e}): free space or make it writable, then "
                "run again")


if dataset == "pydocs":
    once_per_node(prepare_pydocs, rank, local_rank, barrier)
if not (data_dir / "meta.json").exists():
    how = f"python prepare.py {dataset}" if dataset in DATASETS and dataset != "text" else f"python prepare.py <name> --out {data_dir}"
    # a name prepare.py does not know may be misspelt (shakespear): the closest of its datasets and those prepared here
    known = sorted({*DATASETS, *(meta.parent.name for meta in DATA_ROOT.glob("*/meta.json"))})
    near = difflib.get_close_matches(dataset, known, n=1) if dataset not in DATASETS and "/" not in dataset else []
    meant = f"did you mean --dataset={near[0]}? Else " if near else ""
    die(f"no dataset at {data_dir} (no meta.json): {meant}prepare it first with `{how}` (see python prepare.py --help)")
try:
    meta = load_meta(data_dir)
    data = {split: [read_shard(p) for p in find_shards(data_dir, split)] for split in ("train", "val")}
except ShardError as e:
    die(e)
data_fingerprint = {}
for split, shards in data.items():
    counted = sum(len(s) for s in shards)
    if counted != meta[f"{split}_tokens"]:  # what prepare.py wrote it for: a shard added, removed or cut since
        die(f"the {split} shards of {data_dir} hold {counted:,} tokens, its meta.json counts {meta[f'{split}_tokens']:,}: "
            f"shards were added or removed since it was written (an interrupted prepare?); prepare it again")
    if ckpt is not None and ckpt.get("dataset_meta", {}).get(f"{split}_tokens", counted) != counted:
        die(f"{data_dir} holds {counted:,} {split} tokens, {ckpt['dataset_meta'][f'{split}_tokens']:,} when the run in "
            f"{out_dir} was trained: its batches would differ; {new_run_from_it}")
    data_fingerprint[split] = fingerprint(shards)
    if ckpt is not None and ckpt.get("data_fingerprint", data_fingerprint)[split] != data_fingerprint[split]:
        die(f"the {split} shards of {data_dir} hold as many tokens as when the run in {out_dir} was trained, but not "
            f"the same ones (its shards were replaced since): its batches would differ; {new_run_from_it}")
    # a window is block_size + 1 tokens (inputs, and targets shifted by one); shorter shards hold none
    data[split] = [s for s in shards if len(s) > block_size]
    if not data[split]:
        die(f"the {split} shards of {data_dir} hold no window of block_size + 1 = {block_size + 1} tokens: "
            f"lower block_size or prepare more data")
# window i of a split is window i - first_window[k] of its shard k; shard k holds len - block_size of them, and
# first_window[-1] counts the split's windows
first_window = {split: np.cumsum([0] + [len(s) - block_size for s in shards]) for split, shards in data.items()}


def get_batch(split, windows):
    """x, y for the given window indices of a split (y is x shifted by one token)."""
    shard = np.searchsorted(first_window[split], windows, side="right") - 1
    rows = [data[split][k][i:i + block_size + 1] for k, i in zip(shard, windows - first_window[split][shard])]
    tokens = np.stack(rows)
    if tokens.max() >= meta["vocab_size"]:  # (a few thousand numbers on the CPU: nothing next to a step)
        k = shard[int(tokens.max(axis=1).argmax())]
        die(f"a {split} shard holds token id {tokens.max()}, beyond the vocabulary of {meta['vocab_size']} in "
            f"{data_dir / 'meta.json'} ({getattr(data[split][k], 'filename', f'{split} shard {k}')}): it is damaged "
            f"or from another tokenizer; prepare the data again")
    xy = torch.from_numpy(tokens.astype(np.int64))
    xy = torch.stack([xy[:, :-1], xy[:, 1:]])  # x and y side by side: one copy to the device, not two
    if device_type == "cuda":  # pinned memory lets the copy run asynchronously
        xy = xy.pin_memory().to(device, non_blocking=True)
    x, y = xy.to(device)
    return x, y


# Training windows: each iteration draws all its gradient_accumulation_steps micro-batches from one
# generator seeded by `seed`, and rank r takes micro-batches r, r + world_size, ... So the windows
# depend on the seed only (not on the model, nor on the number of ranks: two ranks see what one
# process with the same gradient_accumulation_steps sees), and every rank reads only its own.
data_rng = np.random.default_rng(seed)


def train_batches():
    windows = data_rng.integers(0, first_window["train"][-1], size=(gradient_accumulation_steps, batch_size))
    return [get_batch("train", w) for w in windows[rank::world_size]]


# Evaluation windows: eval_iters batches spread evenly over each split, the same in every
# evaluation, run and mode, so that losses compare.
eval_windows = {split: np.linspace(0, first_window[split][-1] - 1, eval_iters * batch_size).astype(np.int64)
                .reshape(eval_iters, batch_size) for split in data}

# -----------------------------------------------------------------------------
# model: from scratch, resumed, or converted from a checkpoint or GPT-2 into the configured mode

model_overrides = {k: config[k] for k in model_keys if k in explicit and not (k == "vocab_size" and vocab_size == 0)}
iter_num, best_val_loss, state, elapsed_before = 0, float("inf"), None, 0.0
source_tokenizer = None  # the tokenizer the source checkpoint was trained with
if init_from == "scratch":
    model_args = {k: config[k] for k in model_keys}
    if vocab_size == 0:
        model_args["vocab_size"] = -(-meta["vocab_size"] // 64) * 64  # a multiple of 64 is faster
elif init_from == "resume":  # (the checkpoint is loaded above, with the run's settings)
    try:
        model_args, state = checkpoint_model_args(ckpt, ckpt_path), ckpt["model"]  # (a field added since: its default)
    except ValueError as e:
        die(e)
    for k, v in model_overrides.items():
        if v != model_args[k] and k != "dropout":
            die(f"init_from=resume continues the run in {out_dir} as it was, but {k}={v!r} differs from its "
                f"{model_args[k]!r}: drop {k}, or {new_run_from_it}")
    model_args = {**model_args, **model_overrides}
    iter_num, best_val_loss, log_bytes = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["log_bytes"]
    source_tokenizer = ckpt.get("dataset_meta", {}).get("tokenizer")
    wandb_run_id = ckpt.get("wandb_run_id")  # a resumed run logs on into the same wandb run
    elapsed_before = ckpt.get("elapsed_s", 0.0)  # the run's time up to its checkpoint, in earlier processes
else:  # a checkpoint of any mode, or GPT-2: loaded into the configured mode (README "Exact equivalences", 2)
    try:
        if init_from in GPT2_CONFIGS:
            once_per_node(lambda: download_gpt2(init_from, cache_dir), rank, local_rank, barrier)  # then every rank reads it
            source_args, state = load_gpt2(init_from, cache_dir)
            source_tokenizer = "gpt2"
        else:
            if not Path(init_from).is_file():
                die(f"init_from={init_from!r}: use scratch, resume, {', '.join(GPT2_CONFIGS)}, or the path of a checkpoint")
            if not eval_only and Path(init_from).resolve() == ckpt_path.resolve():
                die(f"init_from={init_from} is the checkpoint this run writes: choose another out_dir, or init_from=resume")
            # to the CPU: ours are saved there, but another's (nanoGPT's) may hold GPU tensors, which would
            # take GPU memory beside the model's
            ckpt = load_checkpoint(init_from, map_location="cpu")
            # nanoGPT saves its compiled model, whose names start with _orig_mod., and no routing settings
            source_args, state = checkpoint_model_args(ckpt, init_from), clean_state_dict(ckpt["model"])
            source_tokenizer = ckpt.get("dataset_meta", {}).get("tokenizer")
            source_dataset = ckpt.get("config", {}).get("dataset")
            if eval_only and source_dataset not in (None, dataset) and master:  # (fine-tuning on other data is the point)
                print(f"note: {init_from} was trained on {source_dataset}; this evaluates it on {dataset} "
                      f"(--dataset={source_dataset} for its own)")
    except (FileNotFoundError, ValueError, DownloadError) as e:
        die(e)
    if block_size > source_args["block_size"]:
        die(f"block_size={block_size} is longer than the context of {init_from}, {source_args['block_size']}: "
            f"set --block_size={source_args['block_size']} or less")
    # the model trains with this run's block_size: a longer context is cropped to its first positions,
    # like nanoGPT's crop_block_size
    model_args = {**source_args, **model_overrides, "block_size": block_size}
    if block_size < source_args["block_size"] and master:
        print(f"note: the context is cropped to block_size={block_size} from {init_from}'s {source_args['block_size']}"
              + ("" if "block_size" in explicit else " (train.py's default; set --block_size to keep more)"))
    state = {**state, "transformer.wpe.weight": state["transformer.wpe.weight"][:block_size]}
if model_args["block_size"] != block_size:
    die(f"block_size={block_size} differs from the checkpoint's {model_args['block_size']}: set --block_size={model_args['block_size']}")
if meta["vocab_size"] > model_args["vocab_size"]:
    die(f"the data's vocabulary ({meta['tokenizer']} tokens, vocab_size {meta['vocab_size']}) does not fit the model's "
        f"vocab_size={model_args['vocab_size']}: use vocab_size=0 (from the data) or another dataset")
if source_tokenizer and source_tokenizer != meta["tokenizer"]:
    die(f"{init_from} was trained on {source_tokenizer} tokens but {data_dir} holds {meta['tokenizer']} tokens: "
        f"prepare the data with --tokenizer {source_tokenizer}")

try:
    torch.manual_seed(seed)  # right before building: the same seed gives the same backbone in every mode
    raw_model = GPT(GPTConfig.from_dict(model_args))  # pseudo-queries start at zero and draw no random numbers
    if state is not None:
        missing, _ = load_state_into(raw_model, state)  # pseudo-queries it lacks start at zero (rd's w_v: a copy of w_qk)
        if missing and master:
            print(f"converted {init_from} into {raw_model.config.residual}: {len(missing)} pseudo-queries start at zero")
        if init_from != "resume" and not converts_exactly(source_args, asdict(raw_model.config)) and master:
            print(f"note: {init_from} ({source_args['residual']}, res_blocks={source_args.get('res_blocks', 0)}) loaded as "
                  f"this model ({raw_model.config.residual}, res_blocks={raw_model.config.res_blocks}, its heads and linears) "
                  "computes another function: training starts from a changed model (README, \"Exact equivalences\", lists the "
                  "conversions that keep it)")
except ValueError as e:  # a bad model key, or a checkpoint of another shape
    die(e)
if init_from not in ("scratch", "resume"):  # the log, wandb and the checkpoint name the model trained, not train.py's defaults
    config.update(asdict(raw_model.config))
torch.manual_seed(seed + 1 + rank)  # dropout draws from its own stream, one per rank
raw_model.fused_route = "auto" if fused_route else False  # (train.py's True: fused where CUDA and Triton allow)
raw_model.bf16_sources = bf16_sources
raw_model.to(device)
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type, res_query_lr_mult)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
if init_from == "resume":
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except ValueError as e:
        die(f"the optimizer state in {ckpt_path} does not fit the model ({e}): it cannot be resumed; {new_run_from_it}")
    if ckpt.get("scaler"):  # empty when the run was not float16
        scaler.load_state_dict(ckpt["scaler"])
    data_rng.bit_generator.state = ckpt["data_rng"]
    if len(ckpt["rng"]) == world_size:
        torch.set_rng_state(ckpt["rng"][rank]["torch"].cpu())
        random.setstate(ckpt["rng"][rank]["python"])
        if device_type == "cuda" and ckpt["rng"][rank]["cuda"] is not None:
            torch.cuda.set_rng_state(ckpt["rng"][rank]["cuda"].cpu())
    elif master:
        print(f"note: the checkpoint was written by {len(ckpt['rng'])} ranks, this run has {world_size}: "
              "the training windows continue exactly, the dropout streams start afresh")
ckpt = state = None  # free the memory
start_iter = iter_num
saved_iter = iter_num if init_from == "resume" else None  # the iteration of the checkpoint in out_dir, if ours
# One model under three names: raw_model is the module (its weights, config, routing statistics, clipping),
# model what evaluates (compiled or not), train_model what trains (model, wrapped in DDP under torchrun)
if compile and compile_sublayers:  # a compile as short at any depth (model.compile_sublayers; docs/speed.md)
    model = raw_model.compile_sublayers()
else:
    model = torch.compile(raw_model) if compile else raw_model
# the model's buffers (DLR's fixed matrices) are constants: nothing to send before every forward (torch 2.13
# renamed broadcast_buffers to forward_sync_buffers; each version is asked by its own name)
no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                  else {"broadcast_buffers": False})
# gradient_as_bucket_view: the gradients live in DDP's all-reduce buckets, not in a second copy
train_model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, gradient_as_bucket_view=True,
                  **no_buffer_sync) if ddp else model

# -----------------------------------------------------------------------------
# What the training loop calls: the schedule, evaluation, the log, the loss checks and the checkpoint. They
# read the run's state as module globals, some set further down where the run starts (writes_log, wandb_run,
# t_start): defined here so the loop below reads as the steps it takes.


def get_lr(it):
    """Linear warmup (learning_rate / (warmup_iters + 1) at step 0, never 0), then cosine down to min_lr."""
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@torch.no_grad()
def estimate_loss():
    """Mean loss over the fixed evaluation windows of each split; the ranks share the batches."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=device)  # sum of batch losses, number of batches
        for windows in eval_windows[split][rank::world_size]:
            with ctx:
                _, loss = model(*get_batch(split, windows))
            total += torch.stack([loss.float(), torch.ones((), device=device)])
        if ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


@torch.no_grad()
def routing():
    """model.last_routing on the first val batch: per route its depth weights, max weight, entropy."""
    if raw_model.config.residual == "standard":
        return None
    raw_model.eval()
    with ctx:
        raw_model(*get_batch("val", eval_windows["val"][0]), collect_routing=True)
    raw_model.train()
    return raw_model.last_routing


def write_failed(what, e):
    """The line for a write into out_dir that failed (a full disk, a folder made read-only): what to free, and
    how to go on from what out_dir holds."""
    then = (f"continue from {ckpt_path} (iter {saved_iter}) with --init_from=resume" if saved_iter is not None
            else "start the run again (nothing is saved yet)")
    return f"could not {what} ({e.strerror or e}): free space or make {out_dir} writable, then {then}"


log_failure = None  # under torchrun: rank 0's failed log write, until the ranks next meet (see log_event)


def log_event(**record):
    """Append one JSON line to out_dir/log.jsonl (rank 0), and send its numbers to wandb if it logs."""
    global log_failure
    if writes_log:
        try:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            failed = write_failed(f"write {log_path}", e)
            if not ddp:
                die(failed)
            # rank 0 alone writes the log: stopping here would leave the other ranks in a collective. Every rank
            # stops together at the next log line (agree_on_stop) or save (save_run), before anything is saved.
            log_failure = log_failure or failed
    if wandb_run is not None and record["event"] in ("train", "eval"):
        wandb_run.log(wandb_numbers(record), step=record["iter"])
    elif wandb_run is not None and record["event"] == "done":
        wandb_run.summary.update(wandb_numbers(record))


def wandb_numbers(record):
    """A log.jsonl record's numbers as wandb keys: its own (loss, lr, tokens_per_s, mfu, val_loss, ...)
    and the routing summary's as routing/<key>; the per-route weights stay in log.jsonl."""
    numbers = {k: v for k, v in record.items() if k != "iter" and type(v) in (int, float)}
    numbers.update({f"routing/{k}": v for k, v in record.get("routing_summary", {}).items() if type(v) in (int, float)})
    return numbers


# float16: ten overflowing iterations in a row, each on other batches, are no accident (one is: the
# scaler skips it); float32 and bfloat16 have no scaler, and the first one has spoilt the weights
FLOAT16_NONFINITE_LIMIT = 10
nonfinite = NonFiniteLosses(limit=FLOAT16_NONFINITE_LIMIT if scaler.is_enabled() else 1)


# An iteration's loss is checked one iteration late (or at its log line): reading it at once would make
# the CPU wait for the GPU every iteration, where it could be preparing the next batches meanwhile.
def loss_to_host(loss):
    """(loss on the host, an event that marks its arrival): the copy is queued behind the iteration's
    work, so reading it later waits for that iteration only (.item() waits for all work queued since)."""
    if device_type != "cuda":
        return loss, None
    host = loss.to("cpu", non_blocking=True)
    arrived = torch.cuda.Event()
    arrived.record()
    return host, arrived


def check_loss(it, host, arrived):
    """The loss of iteration it as a float; stops the run when it is lost: non-finite (in float16, that many
    iterations in a row: NonFiniteLosses)."""
    if arrived is not None:
        arrived.synchronize()
    lossf = host.item()
    if nonfinite.count(lossf):
        in_a_row = f" ({nonfinite.in_a_row} iterations in a row)" if nonfinite.limit > 1 else ""
        stop_lost_run(it, f"the loss is {lossf}", in_a_row)
    if not math.isfinite(lossf) and master:
        print(f"iter {it}: the loss is {lossf}; the gradient scaler skipped its step "
              f"({nonfinite.in_a_row} in a row, {nonfinite.limit} stop the run)")
    return lossf


@torch.no_grad()
def check_the_last_step(it, losses=None):
    """Stops the run before the state at iteration `it` is saved or reported, when the step that led to it
    spoilt the weights (to non-finite or to overflowing values). The loss that shows it is the next iteration's, not
    computed yet when an evaluation, the end of the run or a stop signal comes right after the step (in
    float16 the scaler skips such steps). losses: the evaluation's; without them, one forward over the first
    evaluation batch measures it (a fixed batch and no dropout: no random draw, resuming stays exact)."""
    if losses is None:
        model.eval()
        with ctx:
            _, loss = model(*get_batch("train", eval_windows["train"][0]))
        model.train()
        losses = {"train": loss.item()}
    lost = {split: loss for split, loss in losses.items() if not math.isfinite(loss)}
    if lost:
        stop_lost_run(it, "the loss is " + ", ".join(f"{loss} ({split})" for split, loss in lost.items()))


def stop_lost_run(it, what, detail=""):
    kept = f"the last good checkpoint, {ckpt_path} at iter {saved_iter}, is kept" if saved_iter is not None \
        else "no checkpoint was saved"
    log_event(event="error", iter=it, message=f"{what}{detail}")
    die(f"{what} at iter {it}{detail}, stopping; {kept}. Lower learning_rate, or check the data")


if master:
    n_params = raw_model.get_num_params() / 1e6
    print(f"data: {data_dir}, {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"({meta['tokenizer']}, vocab {meta['vocab_size']})")
    print(f"model: {raw_model.config.residual}, {raw_model.config.n_layer} layers, {raw_model.config.n_embd} wide, "
          f"{n_params:.2f}M parameters, from {init_from}" + (f" at iter {iter_num}" if init_from == "resume" else ""))
    if eval_only:
        print(f"evaluating on {device} in {dtype}, {world_size} process(es): {eval_iters} x {batch_size} x {block_size} "
              f"tokens per split")
    else:
        print(f"training on {device} in {dtype}, {world_size} process(es): {gradient_accumulation_steps} x {batch_size} "
              f"x {block_size} = {tokens_per_iter:,} tokens per iteration, {max_iters} iterations")
    if dtype == "float16" and device_type == "cpu":
        print("float16 on a CPU: right, but slow where the CPU has no float16 matrix units (most have none); "
              "bfloat16 is the fast half precision on CPUs")
    if raw_model.config.residual != "standard":
        with ctx:
            fused, source_dtype = raw_model.route_implementation(torch.device(device))
        print("routes: " + (f"fused (Triton), sources in {str(source_dtype or torch.float32).removeprefix('torch.')}"
                            if fused else "model.py's plain route"))

# log.jsonl: a new run starts it afresh; a resumed one drops what was logged after its checkpoint. eval_only
# measures and prints, and leaves the log (and wandb) of the run it evaluates as they are.
writes_log = master and not eval_only
# the log lost lines its checkpoint saw (an interrupted write): every rank stops (the folder is shared), not rank 0 alone
if init_from == "resume" and not eval_only and log_path.exists() and log_path.stat().st_size < log_bytes:
    die(f"{log_path} is shorter than when {ckpt_path} was saved ({log_path.stat().st_size} < {log_bytes} bytes): "
        f"the log was cut off or replaced; move it aside to resume (a new log starts), or start a new run")
if writes_log:
    if init_from == "resume" and log_path.exists():
        with open(log_path, "r+") as f:
            f.truncate(log_bytes)
    elif init_from != "resume":
        log_path.unlink(missing_ok=True)
wandb_run, wandb_failed = None, None
if wandb_log and writes_log:
    resume_id = wandb_run_id if init_from == "resume" else None
    try:
        wandb_run = wandb.init(project=wandb_project, name=wandb_run_name or out_dir.resolve().name,
                               group=wandb_group or None, config=config,
                               **(dict(id=resume_id, resume="allow") if resume_id else {}))
    except Exception as e:  # (wandb has errors of its own kinds: no login, no network, a bad project name)
        wandb_failed = (f"wandb could not start the run ({first_line(e)}): run `wandb login`, set "
                        "WANDB_MODE=offline, or drop wandb_log")
if ddp and wandb_log:  # rank 0 alone starts it: every rank stops with it, rather than wait in the next collective
    box = [wandb_failed]
    dist.broadcast_object_list(box, src=0)
    wandb_failed = box[0]
if wandb_failed:
    die(wandb_failed)
# the first line says which code, machine and settings made the run (a resume adds one for its own start)
log_event(event="start" if init_from != "resume" else "resume", iter=iter_num, **provenance(device), config=config)

# -----------------------------------------------------------------------------
# training loop

def log_size():
    """Bytes in log.jsonl now (rank 0; 0 elsewhere): what a checkpoint saved now goes with."""
    return log_path.stat().st_size if master and log_path.exists() else 0


def save_run(log_bytes):
    """Everything a resume needs into ckpt_path, atomically. Called on every rank: each gives its RNG state,
    rank 0 writes, and a failed write stops every rank.
    log_bytes: the size of log.jsonl the checkpoint goes with (a resume cuts the log back to it)."""
    global saved_iter
    rng = dict(torch=torch.get_rng_state(), python=random.getstate(),
               cuda=torch.cuda.get_rng_state() if device_type == "cuda" else None)
    rngs = [None] * world_size
    if ddp:
        dist.all_gather_object(rngs, rng)  # every rank's dropout stream
    else:
        rngs = [rng]
    failed = log_failure  # (under torchrun: a log write that failed since the ranks last met; nothing is saved)
    if master and not failed:
        run_state = {
            "model": raw_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "model_args": asdict(raw_model.config),
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "config": config,
            "dataset_meta": meta,
            "data_fingerprint": data_fingerprint,  # what a resume checks the data against, beyond its token counts
            "rng": rngs,  # per rank: torch (dropout), python, cuda
            "data_rng": data_rng.bit_generator.state,  # the data position: the next windows to draw
            "log_bytes": log_bytes,
            "wandb_run_id": wandb_run.id if wandb_run is not None else None,  # eval.py adds its scores there
            "elapsed_s": elapsed_before + time.time() - t_start,  # a resumed run's time counts from its start
        }
        try:
            save_checkpoint(run_state, ckpt_path)
            print(f"saved {ckpt_path}")
        except OSError as e:  # a full disk, a folder made read-only: the atomic write left the old file whole
            failed = write_failed(f"save {ckpt_path}", e)
    if ddp:  # every rank stops with rank 0, rather than wait for it in the next collective
        box = [failed]
        dist.broadcast_object_list(box, src=0)
        failed = box[0]
    if failed:
        die(failed)
    saved_iter = iter_num


# Ctrl-C (SIGINT) or a scheduler's SIGTERM: the run stops at its next log line, with a checkpoint to resume
# from, instead of losing what it trained since the last one. Every rank gets the signal, not necessarily
# in the same iteration, so at each log line the ranks agree (one small all-reduce) on whether to stop.
# A second signal, seconds later, stops at once; one right after the first is the same stop request arriving
# twice (a terminal signals every process, and torchrun forwards the signal to its workers as well).
SIGNAL_REPEAT_S = 2.0
stop_signal, stop_time, stopping = None, None, False


def request_stop(signum, frame):
    global stop_signal, stop_time
    if stop_signal is not None:
        if time.time() - stop_time > SIGNAL_REPEAT_S:
            raise KeyboardInterrupt
        return
    stop_signal, stop_time = signal.Signals(signum), time.time()  # (no print here: it may interrupt a print)


def agree_on_stop():
    """Whether to stop at this log line: a signal came, or stdout's reader left. Under torchrun the ranks agree
    (one small all-reduce), so that a rank that missed the signal, or got it later, stops with the others; a
    failed log write on rank 0 (log_event) stops every rank here, with its line."""
    global stop_signal, stop_time
    if getattr(sys.stdout, "reader_left", False) and stop_signal is None:  # as a tool stopped by a closed pipe
        stop_signal, stop_time = signal.SIGPIPE, time.time()
    if not ddp:
        return stop_signal is not None
    received = torch.tensor([stop_signal.value if stop_signal is not None else 0, log_failure is not None], device=device)
    dist.all_reduce(received, op=dist.ReduceOp.MAX)
    signum, log_failed = received.tolist()
    if log_failed:
        box = [log_failure]
        dist.broadcast_object_list(box, src=0)
        die(box[0])
    if signum > 0 and stop_signal is None:  # another rank's signal
        stop_signal, stop_time = signal.Signals(signum), time.time()
    return signum > 0


# (while training only, and not where the signal is ignored: a shell starts a background job with SIGINT ignored)
handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
for sig, handler in handlers.items():
    if not eval_only and handler is not signal.SIG_IGN:
        signal.signal(sig, request_stop)

if not eval_only and iter_num < max_iters:  # (nothing to train, as eval_only or a conversion at max_iters=0: no MFU)
    peak, peak_source = peak_flops(device, dtype, peak_tflops)
    if master:
        print(f"MFU against {peak / 1e12:.3g} TFLOP/s per device, from {peak_source}")
    peak *= world_size
t_start = t_last = time.time()
iters_since_log, val_loss, first_val = 0, None, None
unread = None  # (iter, loss on the host, its event): the last iteration whose loss is not checked yet
while True:

    # evaluate, log the routing, checkpoint (a resumed run evaluates again at its first iteration)
    if iter_num % eval_interval == 0 or iter_num >= max_iters or eval_only or iter_num == start_iter:
        if unread:  # nothing is evaluated or saved after a lost iteration
            check_loss(*unread)
            unread = None
        log_bytes = log_size()  # the log as of this checkpoint
        losses = estimate_loss()
        if iter_num > start_iter:  # (a model loaded as it is, at the start, is not this run's to stop)
            check_the_last_step(iter_num, losses)
        val_loss = losses["val"]
        first_val = val_loss if first_val is None else first_val
        record = dict(event="eval", iter=iter_num, train_loss=losses["train"], val_loss=val_loss)
        line = f"step {iter_num}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}"
        stats = routing() if master else None
        if stats:
            summary = routing_summary(stats)
            record.update(routing_summary=summary, routing=stats)
            line += f" | routing: deepest max weight {summary['deep_max_weight']:.3f}, mean entropy {summary['mean_entropy']:.3f}"
            line += f", mean js {summary['mean_js']:.4f}" if "mean_js" in summary else ""
        if master:
            print(line)
        log_event(**record)
        improved = val_loss < best_val_loss
        best_val_loss = min(best_val_loss, val_loss)
        # save what is new: any iteration after the start, or a converted model at its start
        is_new = iter_num > start_iter or init_from not in ("scratch", "resume")
        if (improved or always_save_checkpoint) and is_new and not eval_only:
            save_run(log_bytes)
        t_last, iters_since_log = time.time(), 0  # evaluation time is not training time
    if iter_num >= max_iters or eval_only:
        break
    if stopping:  # a signal, seen by every rank at the last log line: save (no evaluation: a resume makes it) and stop
        if always_save_checkpoint and iter_num > start_iter and saved_iter != iter_num:
            check_the_last_step(iter_num)
            save_run(log_size())
        kept = f"{ckpt_path} at iter {saved_iter}" if saved_iter is not None else "no checkpoint"
        log_event(event="stopped", iter=iter_num, signal=stop_signal.name, ckpt=str(ckpt_path) if saved_iter is not None else None)
        if master:  # (on stderr where stdout's reader left: to be read)
            print(f"{stop_signal.name}: stopped at iter {iter_num}; {kept}"
                  + (f" (continue with --init_from=resume --out_dir={out_dir})" if saved_iter is not None else "")
                  + ("" if always_save_checkpoint else " (always_save_checkpoint=False keeps the best, saved at its eval)"),
                  file=sys.stderr if getattr(sys.stdout, "reader_left", False) else sys.stdout)
        if wandb_run is not None:
            wandb_run.finish(exit_code=1)
        if ddp:
            dist.barrier()
            dist.destroy_process_group()
        if log_failure:  # ("stopped" not logged: the ranks have met for the last time)
            die(log_failure)
        sys.exit(128 + stop_signal.value)  # the shell's code for a run ended by that signal: not finished

    # one iteration: gradient_accumulation_steps micro-batches over all ranks, one optimizer step
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
    loss_sum = torch.zeros((), device=device)
    batches = train_batches()
    for micro_step, (x, y) in enumerate(batches):
        if ddp:  # the gradients are all-reduced in the last micro step's backward only
            train_model.require_backward_grad_sync = micro_step == micro_steps - 1
        with ctx:
            _, loss = train_model(x, y)
            loss = loss / micro_steps
        loss_sum += loss.detach()
        scaler.scale(loss).backward()
    if ddp:  # the iteration's loss: the mean over every rank's micro-batches
        dist.all_reduce(loss_sum)
        loss_sum /= world_size
    if unread:  # the previous iteration's: done on the device by now, while this one's work waits in its queue
        check_loss(*unread)
    unread = (iter_num, *loss_to_host(loss_sum))
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    # log: time per iteration averaged since the last log line or evaluation
    iters_since_log += 1
    if iter_num % log_interval == 0:
        lossf = check_loss(*unread)  # this iteration's, read now for the line
        unread = None
        dt = (time.time() - t_last) / iters_since_log
        mfu = raw_model.estimate_mfu(gradient_accumulation_steps * batch_size, dt, peak)
        if master:
            # the ETA extrapolates this run's pace so far, evaluations included
            elapsed = time.time() - t_start
            eta = elapsed / (iter_num + 1 - start_iter) * (max_iters - iter_num - 1)
            print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms, "
                  f"{tokens_per_iter / dt:,.0f} tok/s, mfu {mfu * 100:.2f}%, {hms(elapsed)} elapsed, ETA {hms(eta)}")
        log_event(event="train", iter=iter_num, loss=lossf, lr=lr, ms_per_iter=dt * 1000,
                  tokens_per_s=tokens_per_iter / dt, mfu=mfu)
        t_last, iters_since_log = time.time(), 0
        stopping = agree_on_stop()
    iter_num += 1

for sig, handler in handlers.items():  # the summary stops at a first Ctrl-C
    signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # (None: one installed outside Python)

# -----------------------------------------------------------------------------
elapsed = time.time() - t_start
done_ckpt = str(ckpt_path) if saved_iter is not None else None  # this run's checkpoint (or the one it resumed)
log_event(event="done", iter=iter_num, val_loss=val_loss, best_val_loss=best_val_loss, ckpt=done_ckpt,
          elapsed_s=elapsed_before + elapsed)  # (resumed: with the time up to its checkpoint, not what was lost after)
if master:
    iters_run = iter_num - start_iter
    took = f"{elapsed:.0f} s" if elapsed < 100 else f"{elapsed / 60:.1f} min"
    print(f"\ndone: {iters_run} iterations in {took}"
          + (f" ({iters_run * tokens_per_iter / elapsed:,.0f} tokens/s overall)" if iters_run else ""))
    print(f"val loss {val_loss:.4f} (best {best_val_loss:.4f}; {first_val:.4f} at iter {start_iter})")
    if stats:  # (the last evaluation's routing)
        deep = stats[summary["deepest"]]
        print(f"routing: the deepest routed sublayer puts {deep['max_weight']:.2f} of its weight on one of its "
              f"{deep['sources']} sources (uniform would be {1 / deep['sources']:.2f}); mean normalised entropy "
              f"{summary['mean_entropy']:.2f} (1 = uniform)")
    if done_ckpt:
        print(f"checkpoint: {done_ckpt}")
        print(f"sample from it: python sample.py --out_dir={out_dir}")
if wandb_run is not None:
    wandb_run.finish()
if ddp:
    dist.barrier()  # tear down together: a gloo rank destroyed while a peer still writes can abort at exit
    dist.destroy_process_group()
if log_failure:  # ("done" not logged: the ranks have met for the last time)
    die(log_failure)
