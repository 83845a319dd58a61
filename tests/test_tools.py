"""
tools/: the GPU check's summary read back from what its parts leave (pytest's JUnit XML, train.py's
log.jsonl, bench.py's JSON), and the shell scripts at least parse. The scripts themselves run on a GPU
(README, "Tests"); here their summary is checked on files of the same formats.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_summary  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="2"
skipped="3" tests="20" time="1.0"></testsuite></testsuites>"""


def write_train_log(path, tokens_per_s):
    """A train.py log.jsonl: start, 30 logged iterations (the first 20 warm up), done."""
    path.mkdir(parents=True)
    events = [dict(event="start", iter=0, device="cuda", config=dict(residual="rd", dtype="bfloat16"))]
    events += [dict(event="train", iter=i, tokens_per_s=1.0 if i < 20 else tokens_per_s, mfu=0.25) for i in range(30)]
    events.append(dict(event="done", iter=30, val_loss=2.5))
    (path / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_summary_counts_tests_and_reads_every_part(tmp_path):
    """Passed = tests - failures - errors - skipped; a train run's speed is the median after warm-up; a
    bench row's ratios; each part's latest exit code (a rerun replaces an earlier line)."""
    (tmp_path / "tests.xml").write_text(JUNIT)
    (tmp_path / "parts.txt").write_text("tests 1 130\nroute 0 25\ntests 0 95\n")
    write_train_log(tmp_path / "train_delta", 1000.0)
    rows = [dict(name=n, phase=p, ratio=r, tokens_per_s=100 * r, mem_ratio=1.1, peak_mem_mb=10.0, mfu=0.1,
                 compile_s=20.0 if p == "train" else 3.0)
            for n, r in (("standard", 1.0), ("rd/res_blocks=4", 0.5)) for p in ("train", "decode")]
    (tmp_path / "bench_eager_fused.json").write_text(json.dumps(dict(fused_route=True, route_tile="1024:1", compile=False,
                                                                     paired_route_tile="4096:4", rows=rows)))
    gpu_summary.main(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tests"] == {"passed": 14, "failed": 3, "skipped": 3}
    assert summary["parts"] == {"tests": {"exit": 0, "seconds": 95}, "route": {"exit": 0, "seconds": 25}}
    assert summary["train"]["train_delta"] == dict(residual="rd", device="cuda", dtype="bfloat16", tokens_per_s=1000.0,
                                                   mfu=0.25, val_loss=2.5)
    assert summary["train"]["train_rd_dlr"] is None and summary["bench_eager_plain"] is None
    assert (summary["bench_eager_fused"]["route_tile"], summary["bench_eager_fused"]["paired_route_tile"]) == ("1024:1", "4096:4")
    row = summary["bench_eager_fused"]["rows"]["rd/res_blocks=4"]
    assert row["train_ratio"] == 0.5 and row["decode_ratio"] == 0.5 and row["train_compile_s"] == 20.0 and row["decode_compile_s"] == 3.0


def test_gpu_check_benches_at_the_route_parts_fastest_tiles(tmp_path):
    """gpu_check.sh's line that picks the bench parts' tiles: the route part's JSON's fastest_tile and
    fastest_paired_tile (the keys route_kernels.benchmark_route writes) as --route_tile and
    --paired_route_tile, or nothing (the default tiles) without that JSON."""
    lines = [line for line in (ROOT / "tools" / "gpu_check.sh").read_text().splitlines() if line.startswith("route_tile=")]
    assert len(lines) == 1
    script = "\n".join([f"out={tmp_path}", *lines, 'echo "[$route_tile]"'])
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout == "[]\n"
    (tmp_path / "route.json").write_text(json.dumps(dict(fastest_tile="1024:1:prefetch", fastest_paired_tile="4096:4")))
    assert (subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout
            == "[--route_tile=1024:1:prefetch --paired_route_tile=4096:4]\n")


@pytest.mark.parametrize("script", ["gpu_check.sh", "bf16_sources_check.sh"])
def test_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(ROOT / "tools" / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
