"""
What the scripts share: where a result came from (provenance), a run's routing in a few numbers,
the device and dtype a script runs on, the matmul peak its MFU is measured against, and the few
steps torchrun's processes must take together.
"""

import math
import platform
import statistics
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent


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
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def provenance(device):
    """What a log records first, so that every number traces back to the code and machine that made it."""
    commit, dirty = git_commit()
    return dict(commit=commit, dirty=dirty, torch=torch.__version__, device=device, device_name=device_name(device))


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


def hms(seconds):
    """A duration for a progress line: 4m05s, or 2h07m from an hour up."""
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# -----------------------------------------------------------------------------
# device and dtype: resolved here, once, for train.py, sample.py and bench.py

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device="auto"):
    """The torch device to run on: auto takes cuda, then mps, then cpu; cpu, cuda, cuda:N and mps are
    checked against what this machine has. Raises ValueError saying what to use instead."""
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
    On a CPU bfloat16 autocast costs more in casts than it saves at small sizes: on a 2-core Xeon with
    AMX, 4 layers x 128 wide, 16 x 128 tokens, one thread, an iteration takes 159 ms in float32 and
    175 ms in bfloat16; from ~256 wide bfloat16 wins (bench.py: 1.5x at 8 x 256), so pass
    dtype=bfloat16 for larger CPU models. Raises ValueError for an unknown dtype."""
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"
        return "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: use auto, {', '.join(DTYPES)}")
    return dtype


def autocast(device, dtype):
    """The context the model computes in: autocast to dtype on the device's own kind (cuda, mps or
    cpu), or none for float32."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=DTYPES[dtype])


def synchronize(device):
    """Wait for the device to finish its queued work (a timer's edge); the very device, not cuda:0."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device == "mps":
        torch.mps.synchronize()


# -----------------------------------------------------------------------------
# the matmul peak MFU is measured against, the same in train.py and bench.py

# Dense bfloat16 tensor-core peaks (float16 before Ampere), TFLOP/s without sparsity, from NVIDIA's
# datasheets, under the exact names torch.cuda.get_device_name() gives. Exact, because a substring
# confuses chips: "L4" is in "NVIDIA L40S" (121 against 362), and "H100" is both the SXM (989) and
# the PCIe card (756). A GPU not listed here is measured like a CPU; peak_tflops overrides both.
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
    collapses whenever another process holds a core (measured: 20x), one thread only loses its share."""
    n = 512 if device == "cpu" else 4096  # a GPU needs a large matmul to reach its peak
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    g = torch.Generator(device=device).manual_seed(0)  # its own generator: the global RNG stays untouched
    a, b = (torch.randn(n, n, generator=g, device=device, dtype=DTYPES[dtype]) for _ in range(2))
    best = 0.0
    for _ in range(5):
        a @ b
        synchronize(device)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.04:
            a @ b
            synchronize(device)
            reps += 1
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    if device == "cpu":
        torch.set_num_threads(threads)
        best *= threads
    return best


def peak_flops(device, dtype, peak_tflops=0.0):
    """(FLOP/s, where it comes from): MFU's denominator for one device. peak_tflops > 0 is taken as
    given; a GPU in GPU_PEAK_TFLOPS gets its datasheet peak; anything else (a CPU, MPS, an unlisted
    GPU) what measured_matmul_flops measures in the training dtype: the fraction of the machine's
    practical matmul speed."""
    if peak_tflops > 0:
        return peak_tflops * 1e12, "peak_tflops"
    if device.startswith("cuda"):
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
