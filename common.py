"""
What the scripts share, so that each is written once:

    die(message)                       the one-line error every failure a user can fix ends in
    ReaderMayLeave                     stdout for a long run that `| head` must not end mid-step
    boolean(text)                      yes/no options of the argparse tools, read as train.py reads them
    write_atomic(path, write)          the atomic, durable file writer (checkpoints, shards, meta.json)
    durable_replace(src, dst)          its rename, fsynced (finished downloads use it)
    provenance(device)                 the commit, torch and chip a log records first
    sublayer_routes, routing_summary   a run's routing in a few numbers (train.py's log, compare.py's tables)
    run_settings, run_name             run names ('rd/res_blocks=4', 'dlr/rank=32') <-> settings
    split_point, REFERENCE             a grid's run names ('n_layer=8/rd/res_blocks=0'), what they are compared with
    task_scores                        an lm-eval run's metrics by name (eval.py's results, compare.py's columns)
    resolve_device, resolve_dtype      the device and dtype a script runs on (cpu, cuda, cuda:N, mps), autocast
    bind_device, process_group_options the GPU a (torchrun) process takes, its process group; allow_tf32
    peak_flops                         the matmul peak MFU is measured against, the same in train.py and bench.py
    once_per_node, NonFiniteLosses     what torchrun's processes do together; when a run is lost

torch is imported inside the functions that need it: prepare.py and download.py use this module
without paying for torch.
"""

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent


# -----------------------------------------------------------------------------
# failing clearly, writing safely

MAX_SEED = 2**63 - 1  # torch's generators take 64 bits; room left for the seed + 1 + rank that train.py draws dropout from


def die(message, code=1):
    """An expected failure (bad input, a missing file, no network): one line on stderr that says what
    to do, no traceback. Under torchrun the line names its rank. Exit code 2 is a usage error."""
    prefix = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    sys.stderr.write(f"{prefix}error: {message}\n")  # one write: ranks stopping at once do not interleave their lines
    sys.stderr.flush()
    sys.exit(code)


class ReaderMayLeave:
    """sys.stdout for a long run whose reader may stop reading (`python train.py | head`). Writing to a pipe
    no one reads raises BrokenPipeError at whatever print comes next, which would end the run there and lose
    what it did since its last checkpoint. Instead the rest of the output goes to /dev/null, one line on
    stderr says so, and .reader_left tells the run, which stops where it can keep its work (train.py: at its
    next log line, with a checkpoint, as on SIGTERM)."""

    def __init__(self, stream, then):
        self.stream, self.then, self.reader_left = stream, then, False

    def write(self, text):
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._reader_went_away()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._reader_went_away()

    def _reader_went_away(self):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())  # the rest, and the flush at exit, go there
        if not self.reader_left:
            self.reader_left = True
            try:
                sys.stderr.write(f"stdout was closed (its reader stopped): {self.then}\n")
                sys.stderr.flush()
            except BrokenPipeError:  # (`2>&1 | head`: stderr was the same pipe) then it goes there too
                os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


def first_line(e):
    """An exception as one line: its type and the first line of its message (a library's can run to many)."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def is_number(x):
    """Whether x is a number as JSON or a config file gives one (None, text and bools are not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def boolean(s):
    """argparse's type for a yes/no option: with nargs="?" and const=True, --flag, --flag=True and
    --flag=false all work, so train.py's spelling (--flag=True, --flag=False) works in the tools too."""
    if s.lower() in ("1", "true", "yes"):
        return True
    if s.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"expected true or false, got {s!r}")


def write_atomic(path, write):
    """Call write(f) on a temporary file next to path, then durable_replace it onto path: an interrupted
    run or a power cut leaves the old file or the new one under path, never part of one. A failure
    removes the temporary file (a process killed outright cannot: its .NAME.tmpPID stays, unread). Checkpoints, shards and meta.json are all written this way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        durable_replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cannot_write(path):
    """Why a file cannot be written at path, in a few words, or None where it can: asked before the
    work that makes the file, so that no one waits for an evaluation or a fold to learn it. The folders
    write_atomic would make are taken as made where their nearest existing one can be written in."""
    path = Path(path)
    folder = path.parent
    try:  # (a folder that cannot be searched makes even is_dir and exists raise)
        if path.is_dir():
            return "it is a folder"
        while not folder.exists():
            if folder.is_symlink():  # (no folder can be made where a link stands)
                return f"{folder} is a link to {os.readlink(folder)}, which is not there"
            folder = folder.parent
        if not folder.is_dir():
            return f"{folder} is a file, not a folder"
        tempfile.TemporaryFile(dir=folder).close()  # the one check that sees permissions, read-only disks and quotas alike
    except OSError as e:
        return f"cannot create a file in {folder} ({e.strerror})"
    return None


def lock_folder(folder, hold=True):
    """Take the advisory lock on folder that train.py holds on its out_dir, one process at a time: False where
    another process holds it, True once taken. hold=True keeps it for the rest of this process (the OS releases it
    however the process ends, a kill -9 too); hold=False only asks. None where locks do not exist (Windows, a
    filesystem without them): the caller goes on unguarded. A lock on the folder itself leaves no file behind."""
    if os.name == "nt":
        return None
    import fcntl
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    finally:
        if not hold:
            os.close(fd)
    return True  # (fd stays open while held: closing it would release the lock)


def make_folders(folder):
    """mkdir -p folder: returns the folders this call made, outermost first ([] where folder was there). Each
    is made by a mkdir of its own, so a folder another process made at the same moment is never counted here."""
    folder, missing = Path(folder), []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
            made.append(folder)
        except FileExistsError:  # (made by another process in between: its own)
            pass
    return made


def remove_empty_folders(made):
    """Take back the folders make_folders made, innermost first, as long as they are empty: a folder anything
    was written into stays, and so do the folders around it (rmdir removes an empty folder and nothing else)."""
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone)
            return


def durable_replace(src, dst):
    """os.replace(src, dst) that survives a power cut. A rename can reach the disk before the bytes it
    names, and a power cut then leaves an empty file under dst: so src's bytes are fsynced first, and
    the folder after, so that the rename itself is on disk when this returns."""
    with open(src, "ab") as f:  # fsync needs a descriptor; "ab" changes nothing and works on every OS
        os.fsync(f.fileno())
    os.replace(src, dst)
    if os.name != "nt":  # Windows cannot open a folder; NTFS journals the rename itself
        folder = os.open(Path(dst).parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)



# -----------------------------------------------------------------------------
# provenance

def git_commit():
    """(commit, dirty) of the code in this folder: dirty when a tracked file differs from the commit.
    (None, None) where there is no git or no repository, e.g. an unpacked copy."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return None, None


def device_name(device):
    """The chip behind a torch device string: the GPU's name, or the CPU's model."""
    import torch
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def triton_version():
    """Triton's version where it is installed (the fused route's kernels), else None; without importing it."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def provenance(device):
    """What a log records first, so that every number traces back to the code and machine that made it."""
    import torch
    commit, dirty = git_commit()
    return dict(commit=commit, dirty=dirty, torch=torch.__version__, device=device, device_name=device_name(device))


# -----------------------------------------------------------------------------
# routing in a few numbers

def sublayer_routes(routes):
    """The input routes of the sublayers, in depth order ('L0.attn', 'L0.mlp', ...), from route names
    (model.route_names() or the keys of model.last_routing): no rd value routes, no output route."""
    return [r for r in routes if r != "out" and not r.endswith(".v")]


def routing_summary(stats):
    """A run's routing in a few numbers, from model.last_routing: the deepest sublayer route (the last
    that chooses among several sources), its max weight and normalised entropy, the mean normalised
    entropy over the sublayer routes, and for rd the mean JS divergence between QK and V routes."""
    routes = [r for r in sublayer_routes(stats) if "entropy" in stats[r]]
    if not routes:
        return {}
    deepest = routes[-1]
    summary = dict(deepest=deepest, deep_max_weight=stats[deepest]["max_weight"], deep_entropy=stats[deepest]["entropy"],
                   mean_entropy=statistics.fmean(stats[r]["entropy"] for r in routes))
    js = [s["js_qk_v"] for s in stats.values() if "js_qk_v" in s]
    if js:
        summary["mean_js"] = statistics.fmean(js)
    return summary


# -----------------------------------------------------------------------------
# sampling settings: sample.py's flags and eval.py's task settings, one rule

def sampling_problem(temperature=None, top_k=None, top_p=None):
    """What is wrong with these sampling settings (None: left at the default), as `name=value (what it
    takes)`, or None where nothing is."""
    if temperature is not None and not (is_number(temperature) and 0 <= temperature < math.inf):  # (inf: uniform)
        return f"temperature={temperature!r} (0 for greedy, more to sample)"
    if top_k is not None and not (is_number(top_k) and float(top_k).is_integer() and top_k >= 0):
        return f"top_k={top_k!r} (a count of tokens, 0 for all)"
    if top_p is not None and not (is_number(top_p) and 0 <= top_p <= 1):
        return f"top_p={top_p!r} (a probability mass, from 0 to 1)"
    return None


# -----------------------------------------------------------------------------
# downstream scores: what eval.py writes, compare.py tabulates and wandb receives

def task_scores(results):
    """{"task/metric": (value, higher_is_better)} from lm-evaluation-harness's results dict: every numeric
    metric of every task and group, its filter named where it is not the harness's default "none"
    ("gsm8k/exact_match,strict-match"); standard errors left out."""
    scores = {}
    for task, metrics in results["results"].items():
        better = results.get("higher_is_better", {}).get(task, {})
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # alias, sample_len, a stderr, "N/A"
            name = f"{task}/{metric}" + (f",{filter_name}" if filter_name != "none" else "")
            scores[name] = (value, better.get(metric, True))
    return scores


# -----------------------------------------------------------------------------
# run names: what compare.py's grids and bench.py's rows call a model

REFERENCE = "standard"  # every run of a grid is compared with the standard (dense) run of the same seed


def read_train_args(path, remedy):
    """The train.py arguments a run of a grid began with, from the train_args.json compare.py writes. A file
    that is not such a list is a ValueError that names it, ending in remedy: what to do about it."""
    path = Path(path)
    try:
        args = json.loads(path.read_text())
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("not a list of train.py arguments")
    except OSError as e:  # (a folder with a checkpoint but not this file: not begun by compare.py)
        raise ValueError(f"cannot read {path} ({e.strerror}), so what the run trains is unknown: {remedy}") from None
    except ValueError as e:  # (JSON's errors are ValueErrors too)
        raise ValueError(f"{path} is damaged ({e}): {remedy}") from None
    return args


def split_point(name):
    """A run name's sweep value and the rest: 'n_layer=8/rd/res_blocks=0' -> ('n_layer=8', 'rd/res_blocks=0');
    ('', name) for a name without one. Run kinds never hold '=', so a first part with '=' is a value."""
    first, _, rest = name.partition("/")
    return (first, rest) if "=" in first else ("", name)


def run_settings(name):
    """The settings a run name stands for: `<kind>[/key=value...]`, e.g. 'standard', 'delta/res_blocks=4',
    'rd_fixedv/res_blocks=0', 'dlr/rank=32'. kind is a residual mode, rd_fixedv (rd with a fixed value
    route), lowrank or dlr (standard with low-rank linears); keys are res_blocks (routed kinds) and rank.
    The settings are train.py keys and GPTConfig fields alike."""
    from model import RESIDUAL_MODES
    kind, *parts = name.split("/")
    kinds = RESIDUAL_MODES + ("rd_fixedv", "lowrank", "dlr")
    if kind not in kinds:
        raise ValueError(f"run {name!r}: it must start with one of {', '.join(kinds)}")
    routed = kind not in ("standard", "lowrank", "dlr")
    residual = "rd" if kind == "rd_fixedv" else kind if kind in RESIDUAL_MODES else "standard"
    settings = dict(residual=residual, **dict(res_blocks=0) if routed else {},
                    **dict(fixed_value_route=kind == "rd_fixedv") if residual == "rd" else {},
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
    name = "rd_fixedv" if settings.get("fixed_value_route") else settings["residual"]
    if name != "standard":
        name += f"/res_blocks={settings['res_blocks']}"
    if settings["lowrank_rank"]:
        name += f"/rank={settings['lowrank_rank']}"
    return name


def hms(seconds):
    """A duration for a progress line: 4m05s, or 2h07m from an hour up."""
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# -----------------------------------------------------------------------------
# device and dtype: resolved here, once, for train.py, sample.py and bench.py

DTYPES = ("float32", "bfloat16", "float16")  # the names of the torch dtypes a run may compute in


def resolve_device(device="auto"):
    """The torch device to run on: auto takes cuda, then mps, then cpu; cpu, cuda, cuda:N and mps are
    checked against what this machine has. Raises ValueError saying what to use instead."""
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    kind, colon, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (colon and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device={device!r} is not allowed: use auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device} but torch sees no CUDA GPU: use device=cpu, or install a CUDA build of torch")
    if kind == "cuda" and colon and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device={device} but this machine has {torch.cuda.device_count()} GPU(s), cuda:0 .. "
                         f"cuda:{torch.cuda.device_count() - 1}")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device=mps but torch sees no Apple GPU: use device=cpu")
    return device


def resolve_dtype(dtype, device):
    """The dtype to compute in (autocast; weights stay float32). auto: bfloat16 on CUDA GPUs that have it
    in hardware (Ampere and later), float16 on older ones (V100, T4: torch emulates bfloat16 there, slowly,
    and is_bf16_supported() alone says True), with train.py's gradient scaler; float32 on CPU and MPS.
    On a CPU bfloat16 autocast costs more in casts than it saves at the default size, and wins from
    about 256 wide (docs/speed.md, "Measurements behind the code"): pass dtype=bfloat16 for larger
    CPU models. Raises ValueError for an unknown dtype."""
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16" if has_bf16_hardware(device) else "float16"
        return "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: use auto, {', '.join(DTYPES)}")
    return dtype


def has_bf16_hardware(device):
    """Whether this very GPU computes bfloat16 natively (compute capability 8.0, Ampere, or later).
    torch.cuda.is_bf16_supported() answers for the current GPU, not the one named: on a machine with
    mixed GPUs, cuda:1 would get cuda:0's answer."""
    import torch
    if torch.version.hip:  # ROCm: every GPU it runs on has bfloat16
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def bind_device(device, ddp=False, local_rank=0):
    """The device this process computes on, made the current CUDA device. Under torchrun each process
    takes GPU LOCAL_RANK of its node; a plain "cuda" is GPU 0 (set_device needs an index: given "cuda"
    it raises). Raises ValueError when LOCAL_RANK names a GPU this process cannot see."""
    import torch
    if not device.startswith("cuda"):
        return device
    if ddp:
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise ValueError(f"LOCAL_RANK={local_rank} but this process sees {count} GPU(s): start at most {count} "
                             f"process(es) per node (torchrun --nproc_per_node={count}), and let each see all of "
                             "the node's GPUs (leave CUDA_VISIBLE_DEVICES unset, or list them all)")
        device = f"cuda:{local_rank}"
    torch.cuda.set_device(torch.device(device).index or 0)
    return device


# A rank waits in a barrier while rank 0 prepares a dataset or downloads GPT-2 (gpt2-xl is ~6 GB):
# NCCL's default 10 minutes would end such a run, so the process group waits this long.
DIST_TIMEOUT_S = 2 * 3600


def process_group_options(device):
    """dist.init_process_group's arguments for a torchrun process on device: NCCL bound to its GPU
    (device_id: NCCL connects eagerly, on the right GPU) on CUDA, gloo on a CPU; a timeout long
    enough for a download in once_per_node."""
    from datetime import timedelta

    import torch
    options = dict(backend="gloo", timeout=timedelta(seconds=DIST_TIMEOUT_S))
    if device.startswith("cuda"):
        options.update(backend="nccl", device_id=torch.device(device))
    return options


def allow_tf32():
    """float32 matmuls and convolutions on tensor cores (TF32), on CUDA. torch >= 2.9 has the
    fp32_precision settings and deprecates the allow_tf32 flags, which clash with them under Inductor."""
    import torch
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def resolve_device_and_dtype(device, dtype):
    """resolve_device, then resolve_dtype on it: what the tools (sample.py, bench.py) run on."""
    device = resolve_device(device)
    return device, resolve_dtype(dtype, device)


def autocast(device, dtype):
    """The context the model computes in: autocast to dtype on the device's own kind (cuda, mps or
    cpu), or none for float32."""
    import torch
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def synchronize(device):
    """Wait for the device to finish its queued work (a timer's edge); the very device, not cuda:0."""
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device == "mps":
        torch.mps.synchronize()


# -----------------------------------------------------------------------------
# the matmul peak MFU is measured against, the same in train.py and bench.py

# Dense bfloat16 tensor-core peaks (float16 before Ampere), TFLOP/s without sparsity, from NVIDIA's
# datasheets, under the exact names torch.cuda.get_device_name() gives. Exact, because a substring
# confuses chips: "L4" is in "NVIDIA L40S" (121 against 362), and "H100" is both the SXM (989) and
# the PCIe card (756). A GPU not listed here, or a float32 run, is measured like a CPU; peak_tflops
# overrides both.
GPU_PEAK_TFLOPS = {
    "NVIDIA B200": 2250,
    "NVIDIA H200": 989, "NVIDIA H200 NVL": 835,
    "NVIDIA H100 80GB HBM3": 989, "NVIDIA H100 NVL": 835, "NVIDIA H100 PCIe": 756,
    "NVIDIA A100-SXM4-80GB": 312, "NVIDIA A100-SXM4-40GB": 312, "NVIDIA A100 80GB PCIe": 312,
    "NVIDIA A100-PCIE-40GB": 312,
    "NVIDIA L40S": 362, "NVIDIA L40": 181, "NVIDIA L4": 121, "NVIDIA A10": 125, "NVIDIA RTX A6000": 155,
    "NVIDIA GeForce RTX 4090": 165, "NVIDIA GeForce RTX 3090": 71,
    "Tesla V100-SXM2-16GB": 125, "Tesla V100-SXM2-32GB": 125, "Tesla V100-PCIE-16GB": 112,
    "Tesla V100-PCIE-32GB": 112, "Tesla T4": 65,
}


def measured_matmul_flops(device, dtype):
    """FLOP/s a square matmul reaches on device in dtype: the best of five 40 ms windows (~0.2 s). On a
    CPU it is timed on one thread and multiplied by torch's thread count: a multi-threaded timing
    collapses whenever another process holds a core (docs/speed.md, "Measurements behind the code"),
    one thread only loses its share."""
    import torch
    n = 512 if device == "cpu" else 4096  # a GPU needs a large matmul to reach its peak
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    g = torch.Generator(device=device).manual_seed(0)  # its own generator: the global RNG stays untouched
    a, w = (torch.randn(n, n, generator=g, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    # a @ w.T, the layout of every nn.Linear (x W^T): on a CPU float16 runs it 6x faster than a @ w (18.8
    # against 2.9 GFLOP/s on one AVX-512 core; float32 and bfloat16 equal in both), and timing a @ w put
    # float16 training above 100% MFU
    best = 0.0
    for _ in range(5):
        a @ w.T
        synchronize(device)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.04:
            a @ w.T
            synchronize(device)
            reps += 1
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    if device == "cpu":
        torch.set_num_threads(threads)
        best *= threads
    return best


def peak_flops(device, dtype, peak_tflops=0.0):
    """(FLOP/s, where it comes from): MFU's denominator for one device. peak_tflops > 0 is taken as
    given; a GPU in GPU_PEAK_TFLOPS computing in bfloat16 or float16 gets its datasheet peak (a 16-bit
    tensor-core figure: float32, TF32 on tensor cores, peaks at half of it or less); anything else (a CPU,
    MPS, an unlisted GPU, float32) what measured_matmul_flops measures in the training dtype: the
    fraction of the machine's practical matmul speed."""
    import torch
    if peak_tflops > 0:
        return peak_tflops * 1e12, "peak_tflops"
    if device.startswith("cuda") and dtype in ("bfloat16", "float16"):
        name = torch.cuda.get_device_name(device)
        if name in GPU_PEAK_TFLOPS:
            return GPU_PEAK_TFLOPS[name] * 1e12, f"the {name} datasheet"
    return measured_matmul_flops(device, dtype), f"a {dtype} matmul measured on {device}"


# -----------------------------------------------------------------------------
# torchrun: what ranks must do together

def once_per_node(fn, rank, local_rank, barrier=None):
    """Run fn (a download, a dataset's preparation) on one process per node while the others wait.
    Rank 0 goes first: where the nodes share a filesystem the other nodes then find its result and
    fn has nothing left to do; where they do not, each node makes its own copy. So no two processes
    write one file at once (every rank downloading GPT-2 into the same .part file corrupted it), and
    every rank passes the same barriers whatever it finds on disk (a rank that checked for a file
    before deciding whether to wait could skip the barrier rank 0 waits in, and hang the run).
    barrier: dist.barrier under torchrun; None in a single process, which just runs fn."""
    if barrier is None:
        return fn()
    if rank == 0:
        fn()
    barrier()
    if local_rank == 0 and rank != 0:
        fn()
    barrier()


class NonFiniteLosses:
    """Counts the non-finite training losses in a row, to say when a run is lost. In float32 and
    bfloat16 the optimizer has taken the step, so the weights are no longer finite: limit 1. With
    float16, the gradient scaler skips a step whose gradients overflowed (the weights stay as they
    were) and halves its scale: one overflow is no reason to stop, limit > 1 in a row is."""

    def __init__(self, limit):
        self.limit, self.in_a_row = limit, 0

    def count(self, loss):
        """Record one iteration's loss (a float); True when the run must stop."""
        self.in_a_row = 0 if math.isfinite(loss) else self.in_a_row + 1
        return self.in_a_row >= self.limit
