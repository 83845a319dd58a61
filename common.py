"""
What the scripts share, so that each is written once:

    die(message)                       the one-line error every failure a user can fix ends in
    boolean(text)                      yes/no options of the argparse tools, read as train.py reads them
    write_atomic(path, write)          the atomic, durable file writer (checkpoints, shards, meta.json)
    durable_replace(src, dst)          its rename, fsynced (finished downloads use it)
    provenance(device)                 the commit, torch and chip a log records first
    sublayer_routes, routing_summary   a run's routing in a few numbers (train.py's log, compare.py's tables)
    run_settings, run_name             run names ('rd/res_blocks=4', 'dlr/rank=32') <-> settings

torch is imported inside the functions that need it: prepare.py and download.py use this module
without paying for torch.
"""

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


# -----------------------------------------------------------------------------
# failing clearly, writing safely

def die(message, code=1):
    """An expected failure (bad input, a missing file, no network): one line on stderr that says what
    to do, no traceback. Under torchrun the line names its rank. Exit code 2 is a usage error."""
    prefix = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    print(f"{prefix}error: {message}", file=sys.stderr)
    sys.exit(code)


def boolean(s):
    """argparse's type for a yes/no option, so that the tools read booleans as train.py does: with
    nargs="?" and const=True, --flag, --flag=True and --flag=false all work."""
    if s.lower() in ("1", "true", "yes"):
        return True
    if s.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"expected true or false, got {s!r}")


def write_atomic(path, write):
    """Call write(f) on a temporary file next to path, then durable_replace it onto path: an interrupted
    run or a power cut leaves the old file or the new one under path, never part of one. A failure
    removes the temporary file. Checkpoints, shards and meta.json are all written this way."""
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
# run names: what compare.py's grids and bench.py's rows call a model

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
