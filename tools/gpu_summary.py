"""
The GPU check's summary (tools/gpu_check.sh writes the parts, this reads them back):

    python tools/gpu_summary.py OUT_DIR      # writes OUT_DIR/summary.json and prints it

The machine (GPU, torch, Triton, date), the code's commit, each part's exit code and seconds (whether it ran
side by side with others, and the date and commit of the gpu_check.sh run it came from) and which parts failed, the test counts from pytest's JUnit XML, the training
runs' tokens/s and MFU (median of their logged iterations after the first 20, which include warm-up; taken
beside the tests, so they say that training runs on the GPU, not how fast: bench.py's rows do), and each bench
row's ratios to standard. A file that is damaged (cut short, or not in the format its part writes) is named
in its place as unreadable, and the rest is summarised.
"""

import json
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import die, git_commit, triton_version  # noqa: E402

# what reading a file raises where it is cut short or not in the format its part writes
DAMAGED = (OSError, ValueError, KeyError, IndexError, TypeError, ET.ParseError)


def test_counts(xml_path):
    """{"passed", "failed", "skipped"} from pytest's --junitxml (errors count as failed)."""
    if not xml_path.exists():
        return None
    suites = ET.parse(xml_path).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites)
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = total["failures"] + total["errors"]
    return {"passed": total["tests"] - failed - total["skipped"], "failed": failed, "skipped": total["skipped"]}


def training(log):
    """A train.py run's speed, from its log.jsonl: median tokens/s and MFU of its logged iterations after
    warm-up, and its losses."""
    if not log.exists():
        return None
    events = [json.loads(line) for line in log.read_text().splitlines()]
    if not events:
        raise ValueError("no events (an empty file)")
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


def route(path):
    """route_kernels.py --json's figures, as they are."""
    return json.loads(path.read_text()) if path.exists() else None


def parts_run(path):
    """Each part's latest exit code and seconds (a rerun appends its line), whether it ran side by side with
    others, and the run it came from (date and commit, from the `# run` line each gpu_check.sh writes above its
    parts': a rerun of some parts keeps the others' results from an earlier run, perhaps of other code); a line
    that is not whole marks its part unreadable."""
    parts, run = {}, None
    if not path.exists():
        return parts
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if words[0] == "#":  # "# run DATE COMMIT clean|dirty"
            if len(words) == 5 and words[1] == "run":
                run = {"date": words[2], "commit": None if words[3] == "none" else words[3], "dirty": words[4] == "dirty"}
            continue
        try:
            name, rc, seconds, *side_by_side = words  # side_by_side: run beside other parts, not alone
            parts[name] = ({"exit": int(rc), "seconds": int(seconds)} | ({"side_by_side": True} if side_by_side else {})
                           | ({"run": run} if run else {}))
        except ValueError:
            parts[words[0]] = {"unreadable": f"{path.name} line {number}: {line!r}"}
    return parts


def main(out):
    out = Path(out)
    if not out.is_dir():
        die(f"{out} is not a folder: give the OUT_DIR tools/gpu_check.sh wrote")

    def read(reader, name):
        """reader(OUT_DIR/name), or where that file is damaged, which file and what is wrong with it: a GPU
        lease is short, and one bad file must not lose the summary of the rest."""
        try:
            return reader(out / name)
        except DAMAGED as e:
            return {"unreadable": f"{name}: {type(e).__name__}: {e}"}

    parts = parts_run(out / "parts.txt")
    summary = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version(),
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit()[0], "dirty": git_commit()[1],  # the code the parts ran, where it is a git checkout
        "parts": parts,
        # each part's latest run; one whose line is unreadable too, as nothing says that it passed
        "failed": [name for name, part in parts.items() if part.get("exit") != 0],
        "tests": read(test_counts, "tests.xml"),
        "train": {name: read(training, f"{name}/log.jsonl") for name in ("train_delta", "train_rd_dlr")},
        "bench_eager_fused": read(bench, "bench_eager_fused.json"),
        "bench_eager_plain": read(bench, "bench_eager_plain.json"),
        "bench_compiled_fused": read(bench, "bench_compiled_fused.json"),
        "bench_compiled_sublayers": read(bench, "bench_compiled_sublayers.json"),
        "route": read(route, "route.json"),
    }
    text = json.dumps(summary, indent=1) + "\n"
    try:
        (out / "summary.json").write_text(text)
    except OSError as e:
        die(f"cannot write {out / 'summary.json'} ({e.strerror or e}): make OUT_DIR writable")
    print(text, end="")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/gpu_summary.py OUT_DIR (the folder tools/gpu_check.sh wrote)")
    main(sys.argv[1])
