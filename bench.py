"""
How much does depth routing cost? Times, side by side and interleaved (so machine drift hits every
row alike), a training step and one-token decoding with the KV cache for every residual mode, and
the low-rank / DLR / folded variants, then prints tokens/s, the ratio to each row's reference,
peak memory and MFU.

    python bench.py                                   # CPU, float32, default config
    python bench.py --dtype=bfloat16 --json=bench.json
    python bench.py --device=cuda --dtype=bfloat16 --compile
    python bench.py --n_layer=12 --n_embd=768 --n_head=12 --rows=standard,delta/res_blocks=0
    python bench.py --plot=ratios.png run_256.json run_512.json   # routing's cost against width

MFU is measured against the same peak as train.py's (common.peak_flops): a GPU's datasheet figure,
else the matmul throughput measured at start-up on the same device and dtype; --peak_tflops sets it.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from common import (DTYPES, allow_tf32, autocast, boolean, cannot_write, die, peak_flops, provenance, resolve_device_and_dtype,
                    run_settings, synchronize, triton_version, write_atomic)
from model import GPT, GPTConfig

PROMPT_TOKENS = 16  # decoding is timed after a prompt of this many tokens, in the cache of block_size positions
WARMUP_DECODE_TOKENS = 3  # decoded once per row before timing: compiles the decode step (its second call records a CUDA graph)

# row -> the row it is compared with. Rows are run names as in compare.py (common.run_settings), plus
# 'dense' (standard, the low-rank rows' reference) and 'folded/rank=R' (dlr/rank=R folded for inference)
ROWS = {
    "standard": "standard",
    "attnres/res_blocks=0": "standard",
    "attnres/res_blocks=4": "standard",
    "delta/res_blocks=0": "standard",
    "delta/res_blocks=4": "standard",
    "rd/res_blocks=0": "standard",
    "rd/res_blocks=4": "standard",
    "dense": "dense",
    "lowrank/rank={r}": "dense",
    "dlr/rank={r}": "dense",
    "folded/rank={r}": "lowrank/rank={r}",
}


def row_settings(name):
    """GPTConfig overrides of a row, plus fold=True for a folded one."""
    if name == "dense":
        return run_settings("standard")
    if name.startswith("folded/"):
        return dict(run_settings("dlr/" + name.partition("/")[2]), fold=True)
    return run_settings(name)


# the options that count something, and what they count: 0 or less would end in a traceback (an empty
# min(), a division by zero, torch refusing the threads) or print a table of zeros or negative tokens/s
COUNTS = {"batch_size": "sequences per batch", "rounds": "rounds", "train_steps": "training steps per round",
          "decode_tokens": "decoded tokens per round", "threads": "threads", "rank": "low-rank dimensions"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (cuda, mps, then cpu) | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="float32", choices=["auto", *DTYPES], help="auto as in train.py")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="MFU's peak, TFLOP/s (default: as train.py)")
    p.add_argument("--compile", type=boolean, nargs="?", const=True, default=False,
                   help="torch.compile every model's training step, and apart from it its one-token decode step")
    p.add_argument("--compile_sublayers", type=boolean, nargs="?", const=True, default=False,
                   help="with --compile: the training step compiles each layer's sublayers (graphs that every layer "
                        "and row shares), not the whole model; the routes run eager (model.compile_sublayers)")
    p.add_argument("--fused_route", default="auto", type=lambda s: s if s == "auto" else boolean(s),
                   help="auto (the fused Triton route on CUDA) | true | false (model.py's plain route)")
    p.add_argument("--route_tile", default=None, metavar="ELEMENTS:WARPS[:prefetch]",
                   help="the fused route's tile (default: route_kernels.py's; python route_kernels.py --tiles=... times others)")
    p.add_argument("--paired_route_tile", default=None, metavar="ELEMENTS:WARPS[:prefetch]",
                   help="the tile of rd's two routes fused in one pass "
                        "(default: route_kernels.py's PAIRED_TILE, else the one-route tile)")
    p.add_argument("--bf16_sources", type=boolean, nargs="?", const=True, default=True,
                   help="fused route under bfloat16: sources stored in bfloat16 (false: float32)")
    p.add_argument("--n_layer", type=int, default=8)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--block_size", type=int, default=256)
    p.add_argument("--vocab_size", type=int, default=256, help="byte-level, like the default datasets: a 50k head would hide the routing cost")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--rank", type=int, default=None, help="low-rank rank (default n_embd / 4)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each row's fastest round is reported")
    p.add_argument("--train_steps", type=int, default=3, help="training steps per row per round")
    p.add_argument("--decode_tokens", type=int, default=32, help="decoded tokens per row per round")
    p.add_argument("--rows", default="all", help="comma-separated row names, or 'all'")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--plot", default=None, metavar="PNG", help="run nothing: plot the ratios of the given --json files against width")
    p.add_argument("inputs", nargs="*", metavar="JSON", help="with --plot: files written by --json, one width (and setting) each")
    args = p.parse_args()
    for option, what in COUNTS.items():
        value = getattr(args, option)
        if value is not None and value < 1:
            default = ", or leave it out for the default" if p.get_default(option) is None else ""
            p.error(f"--{option}={value}: give a positive number of {what}{default}")
    if not args.peak_tflops >= 0:  # (not < 0: nan is refused too) common.peak_flops would measure one instead
        p.error(f"--peak_tflops={args.peak_tflops}: give the peak in TFLOP/s, or leave it out to use the default peak")
    if args.json:  # found unwritable only after the benchmark, its figures would be lost
        problem = cannot_write(args.json)
        if problem:
            p.error(f"cannot write --json {args.json}: {problem}")
    if bool(args.plot) != bool(args.inputs):
        p.error("--plot and JSON files go together: python bench.py --plot=OUT.png A.json B.json ...")
    if args.plot:  # as --json: checked before the input files are read, and named as written
        from figures import picture_path
        try:
            args.plot = picture_path(args.plot, "plot")
        except ValueError as e:
            p.error(str(e))
    if args.compile_sublayers and not args.compile:
        p.error("--compile_sublayers chooses what --compile compiles: pass --compile as well")
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        p.error(str(e))
    if args.fused_route is True:  # (not "auto", which takes the plain route where the fused one cannot run)
        import route_kernels
        if not route_kernels.available(args.device):
            p.error(f"--fused_route=True on {args.device}: {route_kernels.why_unavailable(args.device)}")
    for option in ("route_tile", "paired_route_tile"):
        if getattr(args, option) is not None:
            import route_kernels
            try:
                tiles = route_kernels.parse_tiles(getattr(args, option))
            except ValueError as e:
                p.error(str(e).replace("--tiles", f"--{option}"))
            if len(tiles) != 1:
                p.error(f"--{option} takes one tile, not {getattr(args, option)!r}")
            setattr(args, option, tiles[0])
    tiled = " and ".join(f"--{o}" for o in ("route_tile", "paired_route_tile") if getattr(args, o) is not None)
    if tiled and not fused_route_runs(args):  # (a tile shapes the fused route's launches: the plain route ignores it)
        plain = "--fused_route=false" if args.fused_route is False else f"--fused_route=auto on {args.device}"
        p.error(f"{tiled}: the routes take model.py's plain route here ({plain}), which has no tile; leave out {tiled}")
    return args


def fused_route_runs(args):
    """Whether the rows' routes take the fused route (route_kernels.py), as GPT.route_implementation decides: with
    --fused_route=true (where it cannot run, parse_args refuses it), or auto on a CUDA GPU that Triton compiles for."""
    if args.fused_route is True:
        return True
    if args.fused_route is False or not args.device.startswith("cuda"):
        return False
    import route_kernels
    return route_kernels.available(args.device)


class SavedTensorBytes:
    """On the CPU there is no allocator peak to read, so training memory is counted as what a step
    keeps from its forward into its backward: parameters, gradients and AdamW's two moments, buffers,
    plus every tensor autograd saves for the backward pass (each storage counted once, and none that is a
    parameter's: in float32 autograd saves the weights themselves, already counted). It leaves out the
    backward's transient gradients of the activations, which a GPU allocator's peak includes: routing
    makes more of those (one per source of every route), so its true peak ratio is higher than this."""

    def __init__(self, parameters):
        self.storages = {}
        self.counted = {p.untyped_storage().data_ptr() for p in parameters}

    def pack(self, t):
        s = t.untyped_storage()
        if s.data_ptr() not in self.counted:
            self.storages[s.data_ptr()] = s.nbytes()
        return t

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def nbytes(self):
        return sum(self.storages.values())


class Row:
    """One model under test: its training step and its decoding loop."""

    def __init__(self, name, reference, cfg, args, ctx):
        overrides = dict(cfg)
        fold = overrides.pop("fold", False)
        torch.manual_seed(0)
        self.model = GPT(GPTConfig(**base_config(args), **overrides)).to(args.device)
        if fold:
            self.model.fold_dlr()
        self.model.fused_route, self.model.bf16_sources = args.fused_route, args.bf16_sources
        self.name, self.reference, self.args, self.ctx = name, reference, args, ctx
        self.optimizer = self.model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), args.device.split(":")[0])
        # --compile: two compiled callables, the training step (one graph and its backward) and the
        # one-token decode step (one graph for every position, a CUDA graph on a GPU); the prefill
        # stays eager, since every prompt length would be a graph of its own
        if args.compile and args.compile_sublayers:  # the training step's sublayers; the decode step stays whole
            self.train_forward = self.model.compile_sublayers()
        else:
            self.train_forward = torch.compile(self.model) if args.compile else self.model
        self.decode_step = self.model.compile_decoding() if args.compile else lambda t, c: self.model(t, cache=c)[0]
        self.compile_s = {}  # phase -> seconds of its first (compiling) call, with --compile
        g = torch.Generator().manual_seed(0)
        B, T, V = args.batch_size, args.block_size, args.vocab_size
        self.x = torch.randint(0, V, (B, T), generator=g).to(args.device)
        self.y = torch.randint(0, V, (B, T), generator=g).to(args.device)
        self.prompt = self.x[:, :PROMPT_TOKENS]
        # one cache for every decoding round, emptied before each (its position set back to 0): on a GPU the
        # compiled step is a CUDA graph that reads the cache's buffers at fixed addresses, and a new cache in
        # a round would re-record the graph inside that round's timed tokens
        self.cache = self.model.make_cache()
        self.times = {"train": [], "decode": []}
        self.peak_mem = None  # on the CPU counted from an eager step, compiled or not

    def train_step(self):
        with self.ctx:
            _, loss = self.train_forward(self.x, self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def time_train(self, steps):
        """Seconds per training step, over `steps` steps."""
        synchronize(self.args.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.train_step()
        synchronize(self.args.device)
        return (time.perf_counter() - t0) / steps

    @torch.no_grad()
    def time_decode(self, n_tokens):
        """Seconds per decoded token, over n_tokens one-token steps after the prompt."""
        self.model.eval()
        cache = self.cache
        cache.position.zero_()  # empty again, in place; slots past the position are masked, stale or zero
        with self.ctx:
            logits, _ = self.model(self.prompt, cache=cache)  # prefill, not timed
            synchronize(self.args.device)
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                token = logits[:, -1].argmax(dim=-1, keepdim=True)
                logits = self.decode_step(token, cache)
            synchronize(self.args.device)
        self.model.train()
        return (time.perf_counter() - t0) / n_tokens

    def measure_memory(self):
        dev = self.args.device
        if dev.startswith("cuda"):
            # every row's model and optimizer live on the GPU together: count this row's own state and
            # what its step allocates above what was there before, i.e. its peak were it alone
            state = sum(t.numel() * t.element_size() for t in (*self.model.parameters(), *self.model.buffers(),
                        *(v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v))))
            synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
            self.train_step()
            synchronize(dev)
            self.peak_mem = (state + torch.cuda.max_memory_allocated(dev) - before) / 2 ** 20
            return
        state = (sum(p.numel() * p.element_size() for p in self.model.parameters()) * 4  # params, grads, 2 moments
                 + sum(b.numel() * b.element_size() for b in self.model.buffers()))  # (DLR's R), as on a GPU
        with SavedTensorBytes(self.model.parameters()) as saved, self.ctx:
            _, loss = self.model(self.x, self.y)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        self.peak_mem = (state + saved.nbytes) / 2 ** 20


def base_config(args):
    return dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                vocab_size=args.vocab_size, dropout=0.0, bias=False)


# --plot: the routed rows' ratios against model width, with the targets they are held to
PLOT_ROWS = {"attnres/res_blocks=0": {"train": 0.90, "decode": 0.95},  # row -> target per phase
             "attnres/res_blocks=4": {"train": 0.97, "decode": 0.98},
             "rd/res_blocks=0": {}}  # rd's target is relative to attnres: no line of its own


def plot_width(paths, out):
    """One panel per setting (eager/compiled x dtype) and phase: each routed row's ratio to standard
    against n_embd, from --json files of runs at different widths. Returns the plotted series,
    {(setting, phase, row): [(n_embd, ratio), ...]}."""
    import matplotlib  # only --plot needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}  # setting -> n_embd -> {(row, phase): ratio}
    unplotted = []  # the files with none of PLOT_ROWS
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            die(f"cannot read {path} ({e}); give files written by bench.py --json")
        try:
            if not isinstance(data, dict):  # JSON, but not the object bench.py writes (e.g. [])
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            compiled = "compiled sublayers" if data.get("compile_sublayers") else "compiled"
            setting = f"{compiled if data['compile'] else 'eager'} {data['dtype']}"
            width = data["config"]["n_embd"]
            ratios = {(r["name"], r["phase"]): r["ratio"] for r in data["rows"]}
        except (KeyError, TypeError) as e:
            what = f"no {e}" if isinstance(e, KeyError) else e
            die(f"{path} is not a file written by bench.py --json ({what}); rerun bench.py with --json")
        if width in runs.setdefault(setting, {}):
            die(f"two files for {setting} at n_embd={width} ({path} is the second); plot one run per width")
        runs[setting][width] = ratios
        if not any(name in PLOT_ROWS for name, _ in ratios):
            unplotted.append(path)
    if unplotted:  # (each would add nothing to the figure; all of them, an empty figure)
        die(f"{', '.join(map(str, unplotted))} hold{'s' if len(unplotted) == 1 else ''} none of the rows --plot draws "
            f"({', '.join(PLOT_ROWS)}): give files of bench.py runs that have them (its default --rows=all runs them)")

    series = {}
    fig, axes = plt.subplots(len(runs), 2, figsize=(10, 2.8 * len(runs)), sharex=True, sharey=True, squeeze=False)
    order = sorted(runs, key=lambda s: (s.startswith("compiled"), "float32" not in s, s))  # eager fp32 first
    all_widths = sorted({w for widths in runs.values() for w in widths})
    for ax_row, setting in zip(axes, order):
        widths = sorted(runs[setting])
        for ax, phase in zip(ax_row, ("train", "decode")):
            for row, targets in PLOT_ROWS.items():
                points = [(w, runs[setting][w][row, phase]) for w in widths if (row, phase) in runs[setting][w]]
                if not points:
                    continue
                series[setting, phase, row] = points
                (line,) = ax.plot(*zip(*points), marker="o", label=row)
                if phase in targets:
                    ax.axhline(targets[phase], color=line.get_color(), linestyle=":", linewidth=1)
            ax.axhline(1.0, color="gray", linewidth=0.5)
            ax.set_title(f"{setting}, {phase}", fontsize=10)
            ax.set_xticks(all_widths)
            ax.grid(alpha=0.3)
        ax_row[0].set_ylabel("tokens/s vs standard")
    for ax in axes[-1]:
        ax.set_xlabel("n_embd")
    axes[0][0].legend(fontsize=8, title="dotted: target", title_fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)  # cannot_write took the missing folders as made
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return series


def main():
    args = parse_args()
    if args.plot:
        plot_width(args.inputs, args.plot)
        return
    if args.route_tile is None and args.paired_route_tile is None:
        run(args)
    else:
        import route_kernels
        # each option left out keeps route_kernels.py's setting
        with route_kernels.tile_shape(*(args.route_tile or route_kernels.tile_for(1)),
                                      paired=args.paired_route_tile or route_kernels.PAIRED_TILE):
            run(args)


def route_tile(routes=1):
    """The fused route's tile in effect (--route_tile, else route_kernels.py's), as ELEMENTS:WARPS[:prefetch];
    routes=2: rd's paired routes' (--paired_route_tile, else route_kernels.py's PAIRED_TILE, else the same)."""
    import route_kernels
    return route_kernels.tile_name(*route_kernels.tile_for(routes))


def run(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compile:  # one training graph per row; past the limit dynamo would silently run eager
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # before torch 2.7
        setattr(torch._dynamo.config, limit, 4 * len(ROWS))
    rank = args.rank or args.n_embd // 4
    rows = {name.format(r=rank): ref.format(r=rank) for name, ref in ROWS.items()}  # row -> its reference
    if args.rows != "all":
        wanted = args.rows.split(",")
        unknown = [w for w in wanted if w not in rows]
        if unknown:
            die(f"unknown row(s) {unknown}; choose from {', '.join(rows)}")
        for w in wanted:  # keep each row's reference, and its reference's (folded -> lowrank -> dense)
            if rows[w] not in wanted:
                wanted.append(rows[w])
        rows = {k: v for k, v in rows.items() if k in wanted}
    if rank == 0 and any(name.endswith("/rank=0") for name in rows):  # below n_embd=4 the default rank is 0
        die(f"the low-rank rows' default rank, n_embd/4, is 0 at --n_embd={args.n_embd}: give --rank, "
            f"or --rows without them")
    rows = {name: (row_settings(name), ref) for name, ref in rows.items()}
    for name, (cfg, _) in rows.items():  # a size that no row can take is a usage error, not a traceback
        try:
            GPTConfig(**base_config(args), **{k: v for k, v in cfg.items() if k != "fold"})
        except ValueError as e:
            die(f"row {name}: {e}")
    decoded = max(WARMUP_DECODE_TOKENS, args.decode_tokens)
    if PROMPT_TOKENS + decoded > args.block_size:
        what, fix = ((f"{decoded} tokens", "raise --block_size or lower --decode_tokens") if decoded == args.decode_tokens
                     else (f"the warm-up's {decoded} tokens", "raise --block_size"))
        die(f"decoding {what} after a {PROMPT_TOKENS}-token prompt needs block_size >= {PROMPT_TOKENS + decoded}: {fix}")
    ctx = autocast(args.device, args.dtype)
    if args.device.startswith("cuda"):
        allow_tf32()  # float32 matmuls on tensor cores, as train.py runs them (and as the peak below is measured)

    peak, peak_source = peak_flops(args.device, args.dtype, args.peak_tflops)
    compiled = (", compiled (training: the sublayers)" if args.compile_sublayers else ", compiled") if args.compile else ""
    print(f"device {args.device}, {args.dtype}{compiled}, torch threads "
          f"{torch.get_num_threads()}; matmul peak {peak / 1e12:.2f} TFLOP/s, from {peak_source}")
    print(f"config: {args.n_layer} layers, {args.n_embd} wide, {args.n_head} heads, context {args.block_size}, "
          f"batch {args.batch_size}, vocab {args.vocab_size}; low-rank rank {rank}")

    bench = [Row(name, ref, cfg, args, ctx) for name, (cfg, ref) in rows.items()]
    fused = bench[0].model.route_implementation(torch.device(args.device))[0] is not None
    if fused:
        print(f"routes: fused (route_kernels.py), tile {route_tile()}, paired routes (rd) {route_tile(2)}")
    for row in bench:  # warm-up (and compilation), then memory
        synchronize(args.device)
        t0 = time.perf_counter()
        row.train_step()
        synchronize(args.device)
        row.compile_s["train"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        row.time_decode(WARMUP_DECODE_TOKENS)  # compiles the decode step; a CUDA graph is recorded at its second call
        row.compile_s["decode"] = time.perf_counter() - t0
        if args.compile:
            print(f"compiled {row.name}: training step {row.compile_s['train']:.0f} s, "
                  f"decode step {row.compile_s['decode']:.0f} s", flush=True)
        row.measure_memory()
    for _ in range(args.rounds):  # interleaved: every row runs once per round; only these rounds count
        for row in bench:
            row.times["train"].append(row.time_train(args.train_steps))
            row.times["decode"].append(row.time_decode(args.decode_tokens))

    results = []
    by_name = {row.name: row for row in bench}
    tokens_per_step = {"train": args.batch_size * args.block_size, "decode": args.batch_size}
    for phase in ("train", "decode"):
        for row in bench:
            t = min(row.times[phase])  # the fastest round: other load only ever adds time
            ref_t = min(by_name[row.reference].times[phase])
            # decode: the forward only, and attention counted over block_size positions, not the written ones
            flops = row.model.flops_per_token() * (1 if phase == "train" else 1 / 3)
            tok_s = tokens_per_step[phase] / t
            results.append({"name": row.name, "phase": phase, "tokens_per_s": tok_s, "ratio": ref_t / t,
                            "reference": row.reference, "mfu": flops * tok_s / peak,
                            "compile_s": row.compile_s[phase] if args.compile else None})
    for row in results:  # memory, training only (what a training step keeps; decoding is not measured)
        if row["phase"] == "train":
            row["peak_mem_mb"] = by_name[row["name"]].peak_mem  # MiB (2^20 bytes), as the published files have it
            row["mem_ratio"] = row["peak_mem_mb"] / by_name[row["reference"]].peak_mem

    print()
    print(f"| {'row':<22} | {'phase':<6} | {'tokens/s':>10} | {'ratio':>6} | {'vs':<16} | {'peak MiB':>8} | {'mem ratio':>9} | {'MFU':>6} |")
    print(f"|{'-' * 24}|{'-' * 8}|{'-' * 12}|{'-' * 8}|{'-' * 18}|{'-' * 10}|{'-' * 11}|{'-' * 8}|")
    for r in results:
        mem = f"{r['peak_mem_mb']:.0f}" if r["phase"] == "train" else ""
        mem_ratio = f"{r['mem_ratio']:.3f}" if r["phase"] == "train" else ""
        print(f"| {r['name']:<22} | {r['phase']:<6} | {r['tokens_per_s']:>10,.0f} | {r['ratio']:>6.3f} | "
              f"{r['reference']:<16} | {mem:>8} | {mem_ratio:>9} | {100 * r['mfu']:>5.1f}% |")
    if args.json:
        text = json.dumps({"device": args.device, "dtype": args.dtype, "compile": args.compile,
                           "compile_sublayers": args.compile_sublayers, **provenance(args.device),
                           "triton": triton_version(), "date": time.strftime("%Y-%m-%d"),
                           "fused_route": fused, "route_tile": route_tile() if fused else None,
                           "paired_route_tile": route_tile(2) if fused else None,
                           "matmul_peak_flops": peak, "threads": torch.get_num_threads(),  # (the CPU peak's multiplier)
                           "config": vars(args), "rows": results}, indent=1)
        try:
            write_atomic(args.json, lambda f: f.write(text.encode()))
        except OSError as e:  # a full disk, or the folder changed during the run: the table above has the figures
            die(f"cannot write --json {args.json} ({e.strerror or e}); the table above holds the figures")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
