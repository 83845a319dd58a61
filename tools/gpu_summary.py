"""
The GPU check's summary (tools/gpu_check.sh writes the parts, this reads them back):

    python tools/gpu_summary.py OUT_DIR      # writes OUT_DIR/summary.json and prints it

The machine (GPU, torch, Triton, date), the code's commit, each part's exit code and seconds (and whether it
ran side by side with others) and which parts failed, the test counts from pytest's JUnit XML, the training
runs' tokens/s and MFU (median of their logged iterations after the first 20, which include warm-up; taken
beside the tests, so they say that training runs on the GPU, not how fast: bench.py's rows do), and each bench
row's ratios to standard.
"""

import json
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import git_commit, triton_version  # noqa: E402


def test_counts(xml_path):
    """{"passed", "failed", "skipped"} from pytest's --junitxml (errors count as failed)."""
    if not xml_path.exists():
        return None
    suites = ET.parse(xml_path).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites)
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = total["failures"] + total["errors"]
    return {"passed": total["tests"] - failed - total["skipped"], "failed": failed, "skipped": total["skipped"]}


def training(out_dir):
    """A train.py run's speed: median tokens/s and MFU of its logged iterations after warm-up, and its losses."""
    log = out_dir / "log.jsonl"
    if not log.exists():
        return None
    events = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [e for e in events if e["event"] == "train" and e["iter"] >= 20]
    done = [e for e in events if e["event"] == "done"]
    start = events[0]
    return {"residual": start["config"]["residual"], "device": start["device"], "dtype": start["config"]["dtype"],
            "tokens_per_s": statistics.median(e["tokens_per_s"] for e in steps) if steps else None,
            "mfu": statistics.median(e["mfu"] for e in steps) if steps else None,
            "val_loss": done[0]["val_loss"] if done else None}


def bench(path):
    """{row: {phase: ratio to its reference, ...}} and the standard row's tokens/s, from bench.py --json."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    rows = {}
    for r in data["rows"]:
        entry = rows.setdefault(r["name"], {})
        entry[f"{r['phase']}_ratio"] = round(r["ratio"], 3)
        entry[f"{r['phase']}_tokens_per_s"] = round(r["tokens_per_s"])
        if r.get("compile_s") is not None:
            entry[f"{r['phase']}_compile_s"] = round(r["compile_s"], 1)
        if r["phase"] == "train":
            entry["mem_ratio"] = round(r["mem_ratio"], 3)
            entry["peak_mem_mb"] = round(r["peak_mem_mb"])
            entry["mfu"] = round(r["mfu"], 4)
    return {"fused_route": data.get("fused_route"), "route_tile": data.get("route_tile"),
            "paired_route_tile": data.get("paired_route_tile"), "compile": data["compile"], "rows": rows}


def main(out):
    out = Path(out)
    parts = {}
    if (out / "parts.txt").exists():
        for line in (out / "parts.txt").read_text().splitlines():
            name, rc, seconds, *side_by_side = line.split()  # side_by_side: run beside other parts, not alone
            parts[name] = {"exit": int(rc), "seconds": int(seconds)} | ({"side_by_side": True} if side_by_side else {})
    summary = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version(),
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit()[0], "dirty": git_commit()[1],  # the code the parts ran, where it is a git checkout
        "parts": parts,
        "failed": [name for name, part in parts.items() if part["exit"] != 0],  # each part's latest run
        "tests": test_counts(out / "tests.xml"),
        "train": {name: training(out / name) for name in ("train_delta", "train_rd_dlr")},
        "bench_eager_fused": bench(out / "bench_eager_fused.json"),
        "bench_eager_plain": bench(out / "bench_eager_plain.json"),
        "bench_compiled_fused": bench(out / "bench_compiled_fused.json"),
        "bench_compiled_sublayers": bench(out / "bench_compiled_sublayers.json"),
        "route": json.loads((out / "route.json").read_text()) if (out / "route.json").exists() else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/gpu_summary.py OUT_DIR (the folder tools/gpu_check.sh wrote)")
    main(sys.argv[1])
