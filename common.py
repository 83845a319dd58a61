"""
What the scripts share: where a result came from (provenance), and a run's routing in a few numbers.
"""

import platform
import statistics
import subprocess
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
