"""
What the scripts share. Today: where a result came from (provenance).
"""

import platform
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
