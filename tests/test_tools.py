"""
tools/: the GPU check's summary read back from what its parts leave (pytest's JUnit XML, train.py's
log.jsonl, bench.py's JSON), and the shell scripts at least parse. The scripts themselves run on a GPU
(README, "Tests"); here their summary is checked on files of the same formats.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_summary  # noqa: E402
from common import git_commit  # noqa: E402  (tools/gpu_summary.py puts the repository on the path)

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
    bench row's ratios; each part's latest exit code (a rerun replaces an earlier line), whether it ran
    side by side with others, and the run it came from (the `# run` line above it, where there is one)."""
    (tmp_path / "tests.xml").write_text(JUNIT)
    (tmp_path / "parts.txt").write_text("tests 1 130 side_by_side\n# run 2026-12-01T10:00Z abc123 clean\nroute 0 25 \n"
                                        "# run 2026-12-02T11:30Z def456 dirty\ntests 0 95 side_by_side\nbench_fused 0 40\n")
    write_train_log(tmp_path / "train_delta", 1000.0)
    rows = [dict(name=n, phase=p, ratio=r, tokens_per_s=100 * r, mem_ratio=1.1, peak_mem_mb=10.0, mfu=0.1,
                 compile_s=20.0 if p == "train" else 3.0)
            for n, r in (("standard", 1.0), ("rd/res_blocks=4", 0.5)) for p in ("train", "decode")]
    (tmp_path / "bench_eager_fused.json").write_text(json.dumps(dict(fused_route=True, route_tile="1024:1", compile=False,
                                                                     paired_route_tile="4096:4", rows=rows)))
    gpu_summary.main(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tests"] == {"passed": 14, "failed": 3, "skipped": 3}
    first, second = (dict(date="2026-12-01T10:00Z", commit="abc123", dirty=False),
                     dict(date="2026-12-02T11:30Z", commit="def456", dirty=True))
    assert summary["parts"] == {"tests": {"exit": 0, "seconds": 95, "side_by_side": True, "run": second},
                                "route": {"exit": 0, "seconds": 25, "run": first},
                                "bench_fused": {"exit": 0, "seconds": 40, "run": second}}  # (no side_by_side: alone)
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


FAKE_PYTHON = """#!{python}
# python3 for gpu_check.sh without a GPU: a part's command is written down with its start and end times (and the
# route part writes a route.json); `python3 -c ...` and the summary run for real
import json, os, sys, time
args = sys.argv[1:]
if args[0] == "-c" or args[0].endswith("gpu_summary.py"):
    os.execv(sys.executable, [sys.executable, *args])
command = " ".join(args)
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(["start", time.time(), command]) + "\\n")
print("ran", command)


def groups(command):  # group -> size: the first parts of the three side-by-side lanes; the five tiles' warm-ups
    found = {{}}
    if command in ("prepare.py", "route_kernels.py --warm") or command.startswith("-m pytest"):
        found["lanes"] = 3
    if command.startswith("route_kernels.py --warm"):
        found["warms"] = 5
    return found


# each waits (up to 20 s) for the others of its groups to start: where the script runs them at once, they
# overlap however slowly this machine starts processes
mine = groups(command)
deadline = time.time() + 20
while mine and time.time() < deadline:
    with open(os.environ["FAKE_RECORD"]) as f:
        started = [groups(event[2]) for event in map(json.loads, f) if event[0] == "start"]
    if all(sum(group in g for g in started) >= size for group, size in mine.items()):
        break
    time.sleep(0.05)
time.sleep(0.2)
for arg in args:
    if arg.startswith("--json=") and arg.endswith("route.json"):
        open(arg[len("--json="):], "w").write(json.dumps(dict(fastest_tile="1024:1", fastest_paired_tile="4096:4")))
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(["end", time.time(), command]) + "\\n")
"""


def test_gpu_check_runs_the_checks_side_by_side_and_the_timings_alone(tmp_path):
    """tools/gpu_check.sh, every default part, with a python3 that only notes what it was asked to run: tests,
    training and sampling, and the warm-up of the route's kernels run at once (three lanes); the warm-ups of
    the default tile and of each other tile (that one only) at once; the route part after all of them, alone, and
    the bench after it, at route.json's tiles. The log has each part's output under its own heading, in a
    fixed order, and the summary marks the parts that ran side by side. A GPU lease is too short to find
    that out there."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    record, out = tmp_path / "record.jsonl", tmp_path / "out"
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", FAKE_RECORD=str(record))
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(out)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in record.read_text().splitlines()]
    start = {command: t for kind, t, command in events if kind == "start"}
    end = {command: t for kind, t, command in events if kind == "end"}

    def one(*words):  # the command with all these words
        [command] = [c for c in start if all(w in c.split() for w in words)]
        return command
    tests, train, warm = one("-m", "pytest"), one("prepare.py"), "route_kernels.py --warm"  # warm: the default tile's
    assert max(start[tests], start[train], start[warm]) < min(end[tests], end[train], end[warm])  # three lanes at once
    tile_warms = [c for c in start if "--warm" in c and "--tiles=" in c]
    assert len(tile_warms) == 4 and all("--only_tiles" in c.split() for c in tile_warms)
    assert max(start[c] for c in [warm, *tile_warms]) < min(end[c] for c in [warm, *tile_warms])  # every tile at once
    route, bench_fused = one("route_kernels.py", f"--json={out}/route.json"), one("bench.py", f"--json={out}/bench_eager_fused.json")
    side_by_side = [c for c in start if c not in (route, bench_fused) and "bench.py" not in c]
    assert start[route] > max(end[c] for c in side_by_side) and start[bench_fused] > end[route]
    assert "--route_tile=1024:1" in bench_fused.split() and "--paired_route_tile=4096:4" in bench_fused.split()
    assert "--tiles=1024:1,1024:1:prefetch,4096:4:prefetch,2048:4" in route.split()

    log = (out / "gpu_check.log").read_text()
    names = ["tests", "prepare", "train_delta", "train_rd_dlr", "sample", "fold", "sample_folded", "route_warm", "route",
             "bench_fused", "bench_plain"]
    headings = [log.index(f"=== {name} (limit") for name in names]
    assert headings == sorted(headings)
    commands = [tests, train, one("train.py", f"--out_dir={out}/train_delta"), one("--residual=rd"), one("sample.py", "--max_new_tokens=200"),
                one("fold.py"), one("sample.py", "--max_new_tokens=100"), warm, route, bench_fused, one("--fused_route=false")]
    for name, at, command in zip(names, headings, commands):
        assert at < log.index(f"ran {command}\n") < log.index(f"=== {name}: exit 0")  # between its heading and its end
    parts = json.loads((out / "summary.json").read_text())["parts"]
    assert sorted(parts) == sorted(names) and all(p["exit"] == 0 for p in parts.values())
    assert [name for name in names if parts[name].get("side_by_side")] == names[:8]


FAKE_TRAIN = """#!{python}
# python3 for bf16_sources_check.sh without a GPU: train.py writes a log whose val loss is 2 + seed / 10, plus
# 0.01 (seed 0), 0.02 (seed 1) or 0.06 (seed 2) with bf16 sources, and notes its arguments; the summary runs for real
import json, os, sys
args = sys.argv[1:]
if args[0] != "train.py":
    os.execv(sys.executable, [sys.executable, *args])
opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--"))
seed, bf16 = int(opts["seed"]), opts["bf16_sources"] == "True"
os.makedirs(opts["out_dir"])
with open(os.path.join(opts["out_dir"], "log.jsonl"), "w") as f:
    f.write(json.dumps(dict(event="done", val_loss=2 + seed / 10 + bf16 * (0.01, 0.02, 0.06)[seed])) + "\\n")
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(" ".join(args) + "\\n")
"""


def test_bf16_sources_check_pairs_the_seeds_at_the_granularity_asked(tmp_path):
    """tools/bf16_sources_check.sh OUT 4 delta: six delta runs with --res_blocks=4 (seeds 0-2, bf16 sources on and
    off), each in its own folder under OUT/delta/res_blocks=4, and the paired difference's mean and std over the seeds."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_TRAIN.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record.txt"
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", FAKE_RECORD=str(record))
    result = subprocess.run(["bash", str(ROOT / "tools" / "bf16_sources_check.sh"), str(tmp_path / "out"), "4", "delta"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    runs = record.read_text().splitlines()
    assert len(runs) == 6 and all("--residual=delta --res_blocks=4" in run for run in runs)
    runs_dir = tmp_path / "out" / "delta" / "res_blocks=4"
    assert sorted(runs_dir.glob("bf16_sources=*/seed*")) == \
        [runs_dir / f"bf16_sources={b}" / f"seed{s}" for b in ("False", "True") for s in range(3)]
    assert "8-layer delta, res_blocks=4" in result.stdout
    assert "seed 2: val loss bf16 sources 2.2600, float32 sources 2.2000, difference +0.0600" in result.stdout
    assert "paired difference (bf16 - float32): +0.0300 +- 0.0265 nats over 3 seeds (0 of them lower" in result.stdout


@pytest.mark.parametrize("script", ["gpu_check.sh", "bf16_sources_check.sh"])
def test_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(ROOT / "tools" / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_summary_takes_each_bench_figure_from_its_own_phase(tmp_path):
    """As bench.py --json writes a row: memory and its ratio on the training phase only, tokens/s, ratio and
    MFU on both. The summary's memory and MFU are the training step's, tokens/s and ratio each phase's."""
    rows = [dict(name="rd/res_blocks=4", phase="train", tokens_per_s=81234.4, ratio=0.91234, reference="standard",
                 mfu=0.412345, compile_s=None, peak_mem_mb=20480.4, mem_ratio=1.23456),
            dict(name="rd/res_blocks=4", phase="decode", tokens_per_s=1567.6, ratio=0.87654, reference="standard",
                 mfu=0.012345, compile_s=None)]
    path = tmp_path / "bench_eager_plain.json"
    path.write_text(json.dumps(dict(fused_route=False, route_tile=None, paired_route_tile=None, compile=False, rows=rows)))
    assert gpu_summary.bench(path)["rows"] == {"rd/res_blocks=4": dict(
        train_ratio=0.912, train_tokens_per_s=81234, mem_ratio=1.235, peak_mem_mb=20480, mfu=0.4123,
        decode_ratio=0.877, decode_tokens_per_s=1568)}


def test_training_speed_is_the_median_after_warm_up(tmp_path):
    """One slow logged iteration after the warm-up (here 10x slower, iteration 25) moves a mean by a tenth of
    itself, not the median: the summary's tokens/s and MFU are the medians of the iterations from 20 on."""
    run = tmp_path / "train_delta"
    write_train_log(run, 1000.0)
    events = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    slow = next(e for e in events if e.get("iter") == 25 and e["event"] == "train")
    slow.update(tokens_per_s=100.0, mfu=0.025)
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    speed = gpu_summary.training(run / "log.jsonl")
    assert (speed["tokens_per_s"], speed["mfu"]) == (1000.0, 0.25)  # the mean would be 910 and 0.2275


def test_summary_reads_every_file_the_gpu_check_writes(tmp_path):
    """Every --json, --junitxml and training --out_dir that tools/gpu_check.sh gives its parts is one the summary
    reads, and it reads no other: a name changed on one side only would summarise that part as missing (null)."""
    script = (ROOT / "tools" / "gpu_check.sh").read_text().replace("\\\n", " ")  # a command continued on the next line: one line
    jsons = set(re.findall(r'--json="\$out/(\w+)\.json"', script))
    runs = set(re.findall(r'train\.py [^\n]*--out_dir="\$out/(\w+)"', script))
    assert "bench_compiled_sublayers" in jsons and "route" in jsons and runs == {"train_delta", "train_rd_dlr"}
    assert '--junitxml="$out/tests.xml"' in script
    (tmp_path / "tests.xml").write_text(JUNIT)
    for name in jsons:
        (tmp_path / f"{name}.json").write_text(json.dumps(dict(compile=False, rows=[], fastest_tile="4096:4")))
    for name in runs:
        write_train_log(tmp_path / name, 1000.0)
    gpu_summary.main(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    read = {key for key, value in summary.items() if key == "route" or key.startswith("bench_")}
    assert read == jsons and all(summary[name] is not None for name in jsons)
    assert summary["route"]["fastest_tile"] == "4096:4" and summary["tests"] is not None
    assert set(summary["train"]) == runs and all(summary["train"][name] is not None for name in runs)


def test_gpu_check_refuses_an_unknown_part_before_running_anything(tmp_path):
    """A misspelt part (compile for compiled) is refused in one line that lists the parts, before OUT_DIR is
    made or anything runs, not run as nothing and passed."""
    out = tmp_path / "out"
    for parts in (["bench", "compile"], ["bench compile"]):  # (one argument of several parts is read as they are)
        result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(out), *parts],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.splitlines() == ["tools/gpu_check.sh: no part named 'compile': name parts from tests "
                                              "train sample route bench compiled compiled_sublayers"]
        assert not out.exists()


def test_gpu_check_refuses_an_out_dir_that_is_a_file(tmp_path):
    """An OUT_DIR that is a file ends in one line and a nonzero exit before anything runs, not in a cascade of
    mkdir and tee errors and the summary's traceback; the file is left as it was."""
    out = tmp_path / "out"
    out.write_text("not a folder\n")
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(out), "bench"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"tools/gpu_check.sh: OUT_DIR {out} is a file: name a folder (it is made if missing)"]
    assert out.read_text() == "not a folder\n"


FAKE_PARTS = """#!{python}
# python3 for gpu_check.sh without a GPU: a script FAKE_FAIL names exits 1, any other passes (bench.py writing its
# --json with no rows); `python3 -c ...` and the summary run for real unless FAKE_FAIL names them
import json, os, sys
args = sys.argv[1:]
script = args[1] if args[0] == "-m" else args[0]
if script in os.environ["FAKE_FAIL"].split():
    sys.exit(1)
if args[0] == "-c" or script.endswith("gpu_summary.py"):
    os.execv(sys.executable, [sys.executable, *args])
for arg in args:
    if arg.startswith("--json="):
        open(arg[len("--json="):], "w").write(json.dumps(dict(compile=False, rows=[])))
"""


def test_gpu_check_leaves_no_earlier_result_to_a_failed_part(tmp_path):
    """A part removes what an earlier run of it wrote before it runs: where it fails, the summary has nothing of
    that run to show under this run's date (the tests' counts, a bench's rows; and no earlier fold for
    sample_folded), lists the failed parts, and the script exits 1 after running them all. The exit status is
    this run's: a rerun whose parts pass exits 0, though the summary still lists a part that failed in an earlier
    run and was not rerun. A run that never writes its summary leaves no earlier one."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_PARTS.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "out"
    (out / "train_rd_dlr").mkdir(parents=True)
    (out / "train_rd_dlr" / "folded.pt").write_text("an earlier fold")
    (out / "tests.xml").write_text(JUNIT)
    rows = [dict(name="standard", phase="train", ratio=1.0, tokens_per_s=100.0, mem_ratio=1.0, peak_mem_mb=10.0, mfu=0.1)]
    for name in ("bench_eager_fused", "bench_eager_plain"):
        (out / f"{name}.json").write_text(json.dumps(dict(compile=False, rows=rows)))
    (out / "parts.txt").write_text("bench_fused 0 40 \nbench_plain 0 20 \n")

    def check(parts, fail):
        env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", FAKE_FAIL=fail)
        return subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(out), *parts], env=env,
                              capture_output=True, text=True, timeout=120)

    result = check(["tests", "sample", "bench"], "pytest sample.py fold.py bench.py")
    assert result.returncode == 1, result.stderr
    failed = {"tests", "sample", "fold", "sample_folded", "bench_fused", "bench_plain"}
    last = re.fullmatch(rf"##### failed: ([\w ]+) \(their output: {re.escape(str(out))}/logs/\)", result.stdout.splitlines()[-1])
    assert last and sorted(last[1].split()) == sorted(failed)  # the side-by-side parts: in the order they ended
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["failed"]) == sorted(failed)
    assert summary["tests"] is None and summary["bench_eager_fused"] is None and summary["bench_eager_plain"] is None
    assert not (out / "train_rd_dlr" / "folded.pt").exists()

    runs = {name: part["run"] for name, part in json.loads((out / "summary.json").read_text())["parts"].items()
            if "run" in part}
    (out / "parts.txt").write_text((out / "parts.txt").read_text().replace(" run 20", " run 19"))  # an earlier year
    result = check(["bench"], "")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["failed"]) == sorted(failed - {"bench_fused", "bench_plain"})  # their latest run: the one before
    commit, dirty = git_commit()
    for run in (runs["tests"], summary["parts"]["bench_fused"]["run"]):  # each run's own commit and date
        assert (run["commit"], run["dirty"]) == (commit, dirty) and re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\dZ", run["date"])
    assert summary["parts"]["tests"]["run"]["date"] == "19" + runs["tests"]["date"][2:]  # kept from the earlier run
    assert summary["bench_eager_fused"]["rows"] == {} and summary["bench_eager_plain"]["rows"] == {}

    result = check(["bench"], "tools/gpu_summary.py")
    assert result.returncode == 1 and not (out / "summary.json").exists()


def test_summary_names_a_damaged_file_and_summarises_the_rest(tmp_path):
    """A file cut short or not in its part's format (a short line in parts.txt, a truncated tests.xml, an empty
    or truncated log.jsonl, a bench JSON without "compile") is named in its place as unreadable, and the other
    files are summarised as ever: one bad file does not lose the rest. A part whose line is unreadable is
    not taken to have passed."""
    (tmp_path / "parts.txt").write_text("route 0 25 \ntests 0\nbench_fused 0 40 \n")
    (tmp_path / "tests.xml").write_text(JUNIT[:100])
    (tmp_path / "train_delta").mkdir()
    (tmp_path / "train_delta" / "log.jsonl").write_text("")
    write_train_log(tmp_path / "train_rd_dlr", 1000.0)
    log = tmp_path / "train_rd_dlr" / "log.jsonl"
    log.write_text(log.read_text()[:-20])
    rows = [dict(name="standard", phase="train", ratio=1.0, tokens_per_s=100.0, mem_ratio=1.0, peak_mem_mb=10.0, mfu=0.1)]
    (tmp_path / "bench_eager_fused.json").write_text(json.dumps(dict(compile=False, rows=rows)))
    (tmp_path / "bench_eager_plain.json").write_text(json.dumps(dict(rows=rows)))
    gpu_summary.main(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["parts"] == {"route": {"exit": 0, "seconds": 25}, "tests": {"unreadable": "parts.txt line 2: 'tests 0'"},
                                "bench_fused": {"exit": 0, "seconds": 40}}
    assert summary["failed"] == ["tests"]
    assert summary["tests"]["unreadable"].startswith("tests.xml: ParseError: ")
    assert summary["train"]["train_delta"] == {"unreadable": "train_delta/log.jsonl: ValueError: no events (an empty file)"}
    assert summary["train"]["train_rd_dlr"]["unreadable"].startswith("train_rd_dlr/log.jsonl: JSONDecodeError: ")
    assert summary["bench_eager_plain"] == {"unreadable": "bench_eager_plain.json: KeyError: 'compile'"}
    assert summary["bench_eager_fused"]["rows"]["standard"]["train_ratio"] == 1.0 and summary["route"] is None


def test_summary_of_a_folder_that_is_not_there_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_summary.py"), str(tmp_path / "nothing")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {tmp_path / 'nothing'} is not a folder: give the OUT_DIR "
                                          "tools/gpu_check.sh wrote"]
