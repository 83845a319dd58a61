"""
bench.py end to end on a tiny config: the rows and JSON keys the tables of docs/speed.md are built from,
ratios that are what they claim to be, and memory counts that see what routing keeps for backward.
(No speed is asserted here: speed is what bench.py itself measures, side by side.)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device=cpu", "--threads=1", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=2",
        "--rounds=1", "--train_steps=1", "--decode_tokens=2"]


def run_bench(*args):
    # TINY runs on the CPU, where --fused_route=true takes Triton's interpreter: chosen here, as on a machine with
    # a GPU conftest.py leaves it off (the default, auto, takes the plain route on a CPU either way)
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "bench.py", *TINY, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    result = run_bench(f"--json={path}")
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text()), result.stdout


def test_every_row_and_phase_with_the_documented_keys(report):
    data, stdout = report
    names = ["standard", "attnres/res_blocks=0", "attnres/res_blocks=4", "delta/res_blocks=0", "delta/res_blocks=4",
             "rd/res_blocks=0", "rd/res_blocks=4", "dense", "lowrank/rank=8", "dlr/rank=8", "folded/rank=8"]
    assert data["fused_route"] is False and data["route_tile"] is None  # the CPU's plain route
    assert data["threads"] == 1  # torch's thread count as run (config's threads is None where --threads is left out)
    rows = data["rows"]
    assert [(r["name"], r["phase"]) for r in rows] == [(n, p) for p in ("train", "decode") for n in names]
    for r in rows:
        assert {"name", "phase", "tokens_per_s", "ratio", "mfu"} <= set(r)
        assert {"peak_mem_mb", "mem_ratio"} <= set(r) if r["phase"] == "train" else not {"peak_mem_mb", "mem_ratio"} & set(r)
        assert r["tokens_per_s"] > 0 and r["mfu"] > 0
        assert f"| {r['name']:<22} | {r['phase']:<6} |" in stdout  # the printed table has the same rows


def test_ratios_are_tokens_per_s_against_the_named_reference(report):
    rows = {(r["name"], r["phase"]): r for r in report[0]["rows"]}
    for (name, phase), r in rows.items():
        ref = rows[(r["reference"], phase)]
        assert r["ratio"] == pytest.approx(r["tokens_per_s"] / ref["tokens_per_s"], rel=1e-9)
    # routed rows against standard, low-rank rows against dense (standard's twin), folded against lowrank
    assert {name: r["reference"] for (name, phase), r in rows.items()} == {
        **{name: "standard" for name in ("standard", "attnres/res_blocks=0", "attnres/res_blocks=4", "delta/res_blocks=0",
                                         "delta/res_blocks=4", "rd/res_blocks=0", "rd/res_blocks=4")},
        "dense": "dense", "lowrank/rank=8": "dense", "dlr/rank=8": "dense", "folded/rank=8": "lowrank/rank=8"}
    assert rows[("standard", "train")]["ratio"] == 1.0


def test_training_memory_counts_what_each_model_keeps(report):
    mem = {r["name"]: r["peak_mem_mb"] for r in report[0]["rows"] if r["phase"] == "train"}
    # routed modes keep their sources for the backward pass; rd also its value routes' inputs
    for mode in ("attnres", "delta", "rd"):
        assert mem[f"{mode}/res_blocks=0"] > mem["standard"]
    assert mem["rd/res_blocks=0"] > mem["attnres/res_blocks=0"]
    # rank n_embd/4 factors hold fewer parameters (and optimizer state) than dense; DLR adds none, folding none
    assert mem["lowrank/rank=8"] < mem["dense"]
    # DLR: each low-rank linear (c_attn, attn.c_proj, c_fc, mlp.c_proj: 9 d outputs a layer) keeps R (d_out x r)
    # and its scale as buffers, and saves B + sR (d_out x r) for the backward
    d, r, L = 32, 8, 2
    assert (mem["dlr/rank=8"] - mem["lowrank/rank=8"]) * 2 ** 20 == pytest.approx(L * (2 * 9 * d * r * 4 + 4 * 4), abs=1e-3)
    assert mem["folded/rank=8"] == mem["lowrank/rank=8"]
    assert mem["standard"] == mem["dense"]


def test_only_the_timed_rounds_count(tmp_path, monkeypatch):
    """The warm-up before the rounds (the first step, 3 decoded tokens: with --compile, the compiling calls)
    is no measurement: each row's tokens/s is its fastest timed round's. The timers are faked here, the
    warm-up's decoding 10x faster than a round's (eager on a CPU, 3 tokens after the prompt are faster
    than 32 at longer contexts), which the report must not show."""
    import bench
    rounds = {"decode": iter([0.010, 0.008, 0.012, 0.011]), "train": iter([0.5, 0.4, 0.6, 0.45])}
    monkeypatch.setattr(bench.Row, "time_decode", lambda self, n: 0.001 if n == 3 else next(rounds["decode"]))
    monkeypatch.setattr(bench.Row, "time_train", lambda self, steps: next(rounds["train"]))
    out = tmp_path / "bench.json"
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, "--rounds=2", "--rows=standard,attnres/res_blocks=0", f"--json={out}"])
    bench.main()
    rows = {(r["name"], r["phase"]): r["tokens_per_s"] for r in json.loads(out.read_text())["rows"]}
    batch, tokens = 2, 2 * 32  # TINY's batch and block size
    assert rows == pytest.approx({("standard", "decode"): batch / 0.010, ("attnres/res_blocks=0", "decode"): batch / 0.008,
                                  ("standard", "train"): tokens / 0.5, ("attnres/res_blocks=0", "train"): tokens / 0.4})


def test_route_tile_runs_the_fused_route_at_that_tile(tmp_path):
    """--route_tile sets the fused route's tile for every row (here in Triton's interpreter on the CPU), and
    the JSON says which tile ran; the plain route records none (the report above); a bad tile is a one-line error."""
    result = run_bench("--fused_route=true", "--route_tile=1024:1:prefetch", "--rows=attnres/res_blocks=0",
                       f"--json={tmp_path / 'b.json'}")
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["fused_route"] is True and data["route_tile"] == data["paired_route_tile"] == "1024:1:prefetch"
    assert "routes: fused (route_kernels.py), tile 1024:1:prefetch, paired routes (rd) 1024:1:prefetch" in result.stdout
    for option in ("route_tile", "paired_route_tile"):
        for bad, message in (("1024:3", f"--{option} item '1024:3'"), ("1024:1,2048:1", f"--{option} takes one tile")):
            result = run_bench(f"--{option}={bad}")
            assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_paired_route_tile_runs_rd_at_its_own_tile(tmp_path):
    """--paired_route_tile sets the tile of rd's paired routes apart from one route's (the default here), and
    the JSON says both; the row trains and decodes through the fused pair."""
    # one sequence a batch, and a given MFU peak: Triton's interpreter runs each route at half the cost
    result = run_bench("--fused_route=true", "--paired_route_tile=64:1", "--rows=rd/res_blocks=4",
                       f"--json={tmp_path / 'b.json'}", "--batch_size=1", "--peak_tflops=1.0")
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert (data["route_tile"], data["paired_route_tile"]) == ("4096:4", "64:1")
    assert {r["name"] for r in data["rows"]} == {"standard", "rd/res_blocks=4"}


@pytest.mark.parametrize("options, single, pair", [
    ([], (4096, 4, False), (1024, 1, True)),
    (["--route_tile=2048:4"], (2048, 4, False), (1024, 1, True)),
    (["--paired_route_tile=64:1"], (4096, 4, False), (64, 1, False)),
    (["--route_tile=2048:4", "--paired_route_tile=64:1"], (2048, 4, False), (64, 1, False)),
])
def test_a_tile_option_left_out_keeps_route_kernels_setting(monkeypatch, options, single, pair):
    """Each of --route_tile and --paired_route_tile overrides its own tile only: with a PAIRED_TILE set in
    route_kernels.py, giving --route_tile alone leaves the pairs at it (the tiles run() sees)."""
    import bench
    import route_kernels
    monkeypatch.setattr(route_kernels, "PAIRED_TILE", (1024, 1, True))
    monkeypatch.setattr(route_kernels, "available", lambda device: True)  # (on a CPU, also where the interpreter is off)
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device=cpu", "--fused_route=true", *options])
    seen = []
    monkeypatch.setattr(bench, "run", lambda args: seen.append((route_kernels.tile_for(1), route_kernels.tile_for(2))))
    bench.main()
    assert seen == [(single, pair)]
    assert route_kernels.tile_for(1) == (4096, 4, False) and route_kernels.PAIRED_TILE == (1024, 1, True)  # restored


@pytest.mark.parametrize("route", ["false", "auto"])
def test_a_tile_where_no_fused_route_runs_is_a_usage_error(route, monkeypatch, capsys):
    """--route_tile and --paired_route_tile shape the fused route's launches: where the routes take model.py's plain
    route (--fused_route=false, or auto on a CPU) they would be ignored without a word, and are refused instead."""
    import bench
    for options in (["--route_tile=1024:1"], ["--paired_route_tile=64:1"], ["--route_tile=1024:1", "--paired_route_tile=64:1"]):
        monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, f"--fused_route={route}", *options])
        with pytest.raises(SystemExit) as e:
            bench.parse_args()
        given = " and ".join(o.split("=")[0] for o in options)
        plain = "--fused_route=false" if route == "false" else "--fused_route=auto on cpu"
        assert e.value.code == 2 and capsys.readouterr().err.endswith(
            f"error: {given}: the routes take model.py's plain route here ({plain}), which has no tile; leave out "
            f"{given}\n")


def test_auto_runs_the_fused_route_on_a_gpu_triton_compiles_for(monkeypatch):
    """The tiles are taken where auto runs the fused route, as tools/gpu_check.sh gives them, and refused where
    Triton cannot compile for the GPU (the model then takes the plain route); true runs it wherever it is taken."""
    from argparse import Namespace

    import bench
    import route_kernels
    for available in (True, False):
        monkeypatch.setattr(route_kernels, "available", lambda device: available)
        assert bench.fused_route_runs(Namespace(fused_route="auto", device="cuda:1")) is available
        assert bench.fused_route_runs(Namespace(fused_route=True, device="cuda")) is True


def test_an_unknown_row_is_a_one_line_error():
    result = run_bench("--rows=attnres/res_blocks=3")
    assert result.returncode != 0
    assert "unknown row(s) ['attnres/res_blocks=3']" in result.stderr


def test_a_fused_route_that_cannot_run_is_a_one_line_error():
    """--fused_route=True where the fused route cannot run (a CPU without Triton's interpreter): refused with the
    reason before any row is built, not a traceback from the first forward."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "bench.py", *TINY, "--fused_route=True"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1].startswith("bench.py: error: --fused_route=True on cpu: Triton runs on CUDA GPUs")


def test_compile_sublayers_asks_for_compile():
    result = run_bench("--compile_sublayers")
    assert result.returncode == 2 and "--compile_sublayers chooses what --compile compiles: pass --compile as well" in result.stderr


def test_saved_tensors_leave_out_the_parameters():
    """A float32 linear saves its input and its own weight for the backward: only the input is more memory
    (the weight is counted once, with the gradients and AdamW's moments)."""
    sys.path.insert(0, str(ROOT))
    import bench
    linear, x = torch.nn.Linear(64, 32), torch.randn(10, 64, requires_grad=True)  # (no input gradient: no weight saved)
    with bench.SavedTensorBytes(linear.parameters()) as saved:
        linear(x)
    assert saved.nbytes == x.numel() * x.element_size()


def test_a_storage_saved_twice_is_counted_once():
    """Two linears that read one input both save it for their backward: one storage, one count."""
    import bench
    a, b, x = torch.nn.Linear(64, 32), torch.nn.Linear(64, 16), torch.randn(10, 64)
    with bench.SavedTensorBytes([*a.parameters(), *b.parameters()]) as saved:
        a(x), b(x)
    assert saved.nbytes == x.numel() * x.element_size()


def tiny_row(name, monkeypatch, *options):
    """A bench row on TINY's config (and any other options), as run() makes it."""
    import bench
    from common import autocast
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, *options])
    args = bench.parse_args()
    return bench.Row(name, bench.ROWS.get(name, "dense"), bench.row_settings(name), args, autocast(args.device, args.dtype))


def test_cpu_training_memory_is_the_state_plus_what_the_step_saves(monkeypatch):
    """On the CPU a row's training memory is 4 copies of its parameters (with the gradients and AdamW's two
    moments), its buffers (DLR's R and scales), and the tensors autograd saves for the backward, in MiB."""
    import bench
    row = tiny_row("dlr/rank=8", monkeypatch)
    seen = []

    class Recording(bench.SavedTensorBytes):
        def __enter__(self):
            seen.append(self)
            return super().__enter__()
    monkeypatch.setattr(bench, "SavedTensorBytes", Recording)
    row.measure_memory()
    params = sum(p.numel() * p.element_size() for p in row.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in row.model.buffers())
    assert buffers > 0 and seen[0].nbytes > 0
    assert row.peak_mem * 2 ** 20 == pytest.approx(4 * params + buffers + seen[0].nbytes)


def test_decoding_is_timed_after_a_prompt_of_prompt_tokens(monkeypatch):
    """Each row decodes after the first PROMPT_TOKENS tokens of its batch, as the module says."""
    import bench
    row = tiny_row("standard", monkeypatch)
    assert bench.PROMPT_TOKENS == 16 and torch.equal(row.prompt, row.x[:, :16])


def test_a_round_times_seconds_per_step_and_per_decoded_token(monkeypatch):
    """time_train runs `steps` steps and returns seconds per step; time_decode times n_tokens one-token
    steps after the prompt's prefill (not timed) and returns seconds per token. A fake clock that each
    step moves on gives the exact figures."""
    import types
    from contextlib import nullcontext
    import bench
    clock, calls = [0.0], []
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def takes(seconds, result=None):
        def step(*args):
            clock[0] += seconds
            calls.append(seconds)
            return result
        return step
    cpu = types.SimpleNamespace(device="cpu")
    assert bench.Row.time_train(types.SimpleNamespace(args=cpu, train_step=takes(0.25)), 4) == 0.25
    assert calls == [0.25] * 4
    logits = torch.zeros(2, 1, 8)

    class Model:
        def eval(self): pass
        def train(self): pass
        def __call__(self, tokens, cache):  # the prefill, into the row's cache emptied
            assert tokens.shape == (2, 16) and cache is row.cache and cache.position == 0
            clock[0] += 10.0
            return logits, None
    calls.clear()
    row = types.SimpleNamespace(args=cpu, ctx=nullcontext(), model=Model(), prompt=torch.zeros(2, 16, dtype=torch.long),
                                decode_step=takes(0.125, logits), cache=types.SimpleNamespace(position=torch.ones((), dtype=torch.long)))
    assert bench.Row.time_decode(row, 5) == 0.125 and calls == [0.125] * 5


def test_every_decoding_round_reuses_one_cache_and_decodes_as_a_new_one(monkeypatch):
    """The warm-up and every timed round decode into the same key-value buffers and position tensor (on a GPU
    the compiled step's CUDA graph reads them at fixed addresses: a new cache per round would re-record it
    inside the timed tokens), emptied before each round: every round's logits are those of a new cache."""
    import bench
    row = tiny_row("attnres/res_blocks=0", monkeypatch)
    seen, logits = [], []
    eager = row.decode_step

    def step(token, cache):
        seen.append((cache, cache.position, cache.k[0], cache.v[0]))  # (kept alive: no address is reused)
        out = eager(token, cache)
        logits.append(out)
        return out
    row.decode_step = step
    for n in (bench.WARMUP_DECODE_TOKENS, 4, 4):
        row.time_decode(n)
    assert len(seen) == bench.WARMUP_DECODE_TOKENS + 8
    assert all(all(a is b for a, b in zip(s, seen[0])) for s in seen)
    with torch.no_grad():  # a new cache, as the first round had
        cache = row.model.make_cache()
        out, _ = row.model(row.prompt, cache=cache)
        fresh = []
        for _ in range(4):
            out = row.model(out[:, -1].argmax(dim=-1, keepdim=True), cache=cache)[0]
            fresh.append(out)
    for round_logits in (logits[-8:-4], logits[-4:]):
        assert all(torch.equal(a, b) for a, b in zip(round_logits, fresh))


def test_float32_on_a_gpu_runs_as_train_py_and_against_a_float32_peak(monkeypatch):
    """On CUDA bench.py allows TF32 before it measures the peak, as train.py does before training (so a float32
    step and its peak are both TF32 matmuls), and a float32 run's peak is measured, not the datasheet's 16-bit
    tensor-core figure (TF32 peaks at half of it); bfloat16 and float16 keep the datasheet."""
    import common
    import bench
    monkeypatch.setattr(common, "measured_matmul_flops", lambda device, dtype: 1.5e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert common.peak_flops("cuda", "float32") == (1.5e12, "a float32 matmul measured on cuda")
    for dtype in ("bfloat16", "float16"):
        assert common.peak_flops("cuda", dtype) == (989e12, "the NVIDIA H100 80GB HBM3 datasheet")

    class Stop(Exception):
        pass
    calls = []
    monkeypatch.setattr(bench, "allow_tf32", lambda: calls.append("tf32"))
    monkeypatch.setattr(bench, "peak_flops", lambda *a: calls.append("peak") or (1e12, "test"))
    monkeypatch.setattr(bench, "Row", lambda *a: (_ for _ in ()).throw(Stop()))  # the rows: not on this machine
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, "--rows=standard"])
    args = bench.parse_args()
    for device, expected in (("cpu", ["peak"]), ("cuda", ["tf32", "peak"])):
        calls.clear()
        args.device = device
        with pytest.raises(Stop):
            bench.run(args)
        assert calls == expected


def test_ratio_mfu_and_memory_ratio_come_from_each_rows_fastest_round(tmp_path, monkeypatch):
    """Faked timers, FLOPs and memory: every round counts (a row's fastest may be the last), each runs
    --train_steps steps and --decode_tokens tokens, the ratio is the reference's fastest time over the
    row's, MFU is the training FLOPs per token (a third of them decoding: the forward only) times
    tokens/s over --peak_tflops, the memory ratio (training rows only) is over the reference's, and
    compile_s is null without --compile."""
    import bench
    times = {("standard", "train"): [0.5, 0.4], ("attnres/res_blocks=0", "train"): [0.6, 0.45],
             ("standard", "decode"): [0.012, 0.010], ("attnres/res_blocks=0", "decode"): [0.011, 0.008]}
    rounds, calls = {key: iter(t) for key, t in times.items()}, []

    def time_train(self, steps):
        calls.append(("train", steps))
        return next(rounds[self.name, "train"])

    def time_decode(self, n):
        calls.append(("decode", n))
        return 0.001 if n == bench.WARMUP_DECODE_TOKENS else next(rounds[self.name, "decode"])
    monkeypatch.setattr(bench.Row, "time_train", time_train)
    monkeypatch.setattr(bench.Row, "time_decode", time_decode)
    memory = {"standard": 10.0, "attnres/res_blocks=0": 12.5}
    monkeypatch.setattr(bench.Row, "measure_memory", lambda self: setattr(self, "peak_mem", memory[self.name]))
    monkeypatch.setattr(bench.GPT, "flops_per_token", lambda self: 6e6)
    out = tmp_path / "bench.json"
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, "--rounds=2", "--train_steps=2", "--decode_tokens=5",
                                      "--peak_tflops=0.001", "--rows=standard,attnres/res_blocks=0", f"--json={out}"])
    bench.main()
    assert sorted(calls) == [("decode", 3)] * 2 + [("decode", 5)] * 4 + [("train", 2)] * 4
    data = json.loads(out.read_text())
    assert data["matmul_peak_flops"] == 1e9
    rows = {(r["name"], r["phase"]): r for r in data["rows"]}
    batch, tokens = 2, 2 * 32  # TINY's batch and block size
    expected = {("standard", "train"): dict(tokens_per_s=tokens / 0.4, ratio=1.0, mem_ratio=1.0),
                ("attnres/res_blocks=0", "train"): dict(tokens_per_s=tokens / 0.45, ratio=0.4 / 0.45, mem_ratio=1.25),
                ("standard", "decode"): dict(tokens_per_s=batch / 0.010, ratio=1.0),
                ("attnres/res_blocks=0", "decode"): dict(tokens_per_s=batch / 0.008, ratio=0.010 / 0.008)}
    for (name, phase), e in expected.items():
        r = rows[name, phase]
        assert {k: r[k] for k in e} == pytest.approx(e) and ("mem_ratio" in r) == (phase == "train")
        assert r["mfu"] == pytest.approx((6e6 if phase == "train" else 2e6) * e["tokens_per_s"] / 1e9)
        assert r.get("peak_mem_mb") == (memory[name] if phase == "train" else None) and r["compile_s"] is None


def test_plot_keeps_eager_compiled_and_sublayer_runs_apart(tmp_path):
    """--plot draws a panel per setting: eager, compiled and compiled-sublayers runs of one dtype at one width
    are three settings, not one width given three times (a file from before compile_sublayers: compiled)."""
    import bench

    def run(name, width, compiled, ratio, **sublayers):
        rows = [{"name": "attnres/res_blocks=0", "phase": phase, "ratio": ratio} for phase in ("train", "decode")]
        (tmp_path / name).write_text(json.dumps({"compile": compiled, **sublayers, "dtype": "bfloat16",
                                                 "config": {"n_embd": width}, "rows": rows}))
        return str(tmp_path / name)
    files = [run("eager.json", 256, False, 0.8, compile_sublayers=False), run("compiled.json", 256, True, 0.9),
             run("sublayers.json", 256, True, 0.95, compile_sublayers=True),
             run("eager_wide.json", 512, False, 0.85, compile_sublayers=False)]
    series = bench.plot_width(files, str(tmp_path / "ratios.png"))
    lines = {"eager bfloat16": [(256, 0.8), (512, 0.85)], "compiled bfloat16": [(256, 0.9)],
             "compiled sublayers bfloat16": [(256, 0.95)]}
    assert series == {(setting, phase, "attnres/res_blocks=0"): points for setting, points in lines.items()
                      for phase in ("train", "decode")}


def test_a_size_no_row_can_take_is_a_one_line_error():
    # 3 layers = 6 sublayers: the attnres/res_blocks=4 row cannot split them into 4 blocks
    result = run_bench("--n_layer=3", "--rows=attnres/res_blocks=4")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: row attnres/res_blocks=4:") and result.stderr.count("\n") == 1


def test_decoding_past_the_context_is_a_one_line_error():
    result = run_bench("--block_size=32", "--decode_tokens=17", "--rows=standard")
    assert result.returncode != 0 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "decoding 17 tokens after a 16-token prompt needs block_size >= 33: raise --block_size or lower" in result.stderr
    result = run_bench("--block_size=18", "--decode_tokens=2", "--rows=standard")  # the warm-up decodes 3
    assert result.returncode != 0 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "decoding the warm-up's 3 tokens after a 16-token prompt needs block_size >= 19: raise --block_size\n" \
        in result.stderr
    result = run_bench("--block_size=32", "--decode_tokens=16", "--rows=standard")  # 16 + 16 fill the context exactly
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("option", ["--rounds=0", "--train_steps=0", "--decode_tokens=0", "--decode_tokens=-1",
                                    "--batch_size=0", "--threads=-1", "--threads=0", "--rank=-3"])
def test_counts_below_one_are_usage_errors(option, monkeypatch, capsys):
    """Each would end the run in a traceback (an empty min(), a division by zero, torch refusing the
    threads), or a table of zeros or negative tokens/s: refused with the options."""
    import bench
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, option])
    with pytest.raises(SystemExit) as e:
        bench.parse_args()
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"error: {option}: give a positive number of " in err


@pytest.mark.parametrize("peak", ["-5", "nan"])
def test_a_peak_below_zero_is_a_usage_error(peak, monkeypatch, capsys):
    """--peak_tflops=-5 would silently give MFU against the measured peak instead: refused with the options."""
    import bench
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, f"--peak_tflops={peak}"])
    with pytest.raises(SystemExit) as e:
        bench.parse_args()
    assert e.value.code == 2 and f"error: --peak_tflops={float(peak)}: give the peak in TFLOP/s" in capsys.readouterr().err


def test_a_json_that_cannot_be_written_is_refused_before_the_benchmark(tmp_path, monkeypatch, capsys):
    import bench
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("benchmarked before checking --json"))
    (tmp_path / "a_file").write_text("")
    for path, problem in ((tmp_path, "it is a folder"), (tmp_path / "a_file" / "b.json", f"{tmp_path / 'a_file'} is a file")):
        monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, f"--json={path}"])
        with pytest.raises(SystemExit) as e:
            bench.main()
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"error: cannot write --json {path}: {problem}" in err


def test_a_row_brings_its_chain_of_references(tmp_path):
    """folded is compared with lowrank, which is compared with dense: asking for folded runs all three."""
    result = run_bench("--rows=folded/rank=8", f"--json={tmp_path / 'b.json'}")
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert sorted({r["name"] for r in rows}) == ["dense", "folded/rank=8", "lowrank/rank=8"]


def test_plot_draws_each_rows_ratio_against_width(report, tmp_path):
    """--plot reads --json files of runs at different widths: every routed row becomes one line of
    (n_embd, ratio) points taken from the files, in width order, per setting and phase."""
    import bench

    wide = tmp_path / "wide.json"
    result = run_bench("--n_embd=64", "--rows=attnres/res_blocks=0", f"--json={wide}")
    assert result.returncode == 0, result.stderr
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps(report[0]))
    out = tmp_path / "ratios.png"
    series = bench.plot_width([str(wide), str(narrow)], str(out))
    assert out.stat().st_size > 10_000  # a real figure, not an empty canvas

    def ratio(data, name, phase):
        return next(r["ratio"] for r in data["rows"] if (r["name"], r["phase"]) == (name, phase))

    wide_data = json.loads(wide.read_text())
    for phase in ("train", "decode"):
        assert series["eager float32", phase, "attnres/res_blocks=0"] == [
            (32, ratio(report[0], "attnres/res_blocks=0", phase)), (64, ratio(wide_data, "attnres/res_blocks=0", phase))]
        # rows run at one width only are one point
        assert series["eager float32", phase, "attnres/res_blocks=4"] == [(32, ratio(report[0], "attnres/res_blocks=4", phase))]


def test_plot_rejects_what_it_cannot_plot(report, tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report[0]))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    empty = tmp_path / "empty.json"  # JSON, but no object: was an AttributeError
    empty.write_text("[]")
    # bench.py runs without a row --plot draws (--rows=standard,dense, say): an empty figure, were they all it had
    unplotted = [tmp_path / "standard_32.json", tmp_path / "standard_64.json"]
    for path, width in zip(unplotted, (32, 64)):
        path.write_text(json.dumps({**report[0], "config": {**report[0]["config"], "n_embd": width},
                                    "rows": [r for r in report[0]["rows"] if r["name"] in ("standard", "dense")]}))
    for args, message in [([f"--plot={tmp_path / 'a.png'}", str(run), str(run)], "two files for eager float32 at n_embd=32"),
                          ([f"--plot={tmp_path / 'a.png'}", *map(str, unplotted)],
                           f"error: {unplotted[0]}, {unplotted[1]} hold none of the rows --plot draws (attnres/res_blocks=0, "
                           "attnres/res_blocks=4, rd/res_blocks=0)"),
                          ([f"--plot={tmp_path / 'a.png'}", str(run), str(unplotted[1])], f"error: {unplotted[1]} holds none"),
                          ([f"--plot={tmp_path / 'a.png'}", str(other)], "is not a file written by bench.py --json"),
                          ([f"--plot={tmp_path / 'a.png'}", str(empty)], "is not a file written by bench.py --json (a JSON list"),
                          ([f"--plot={tmp_path / 'a.png'}", str(tmp_path / "missing.json")], "cannot read"),
                          ([str(run)], "--plot and JSON files go together")]:
        result = subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "a.png").exists()


def test_a_plot_that_cannot_be_written_is_refused_before_the_inputs_are_read(report, tmp_path, monkeypatch, capsys):
    """--plot is checked as --json is: under a file, or in a format matplotlib cannot write, it is a usage
    error before plot_width; a name without an extension is written as NAME.png, and named so."""
    import bench
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report[0]))
    (tmp_path / "a_file").write_text("")
    plot_width = bench.plot_width
    monkeypatch.setattr(bench, "plot_width", lambda paths, out: pytest.fail("plotted before checking --plot"))
    for path, problem in ((tmp_path / "a_file" / "p.png", f"cannot write --plot={tmp_path / 'a_file' / 'p.png'} "
                                                            f"({tmp_path / 'a_file'} is a file, not a folder)"),
                          (tmp_path / "p.xyz", "matplotlib cannot write .xyz files; end the name in one of .")):
        monkeypatch.setattr(sys, "argv", ["bench.py", f"--plot={path}", str(run)])
        with pytest.raises(SystemExit) as e:
            bench.main()
        assert e.value.code == 2 and problem in capsys.readouterr().err
    monkeypatch.setattr(bench, "plot_width", plot_width)
    monkeypatch.setattr(sys, "argv", ["bench.py", f"--plot={tmp_path / 'new' / 'p'}", str(run)])  # its folder made
    bench.main()
    assert (tmp_path / "new" / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == f"wrote {tmp_path / 'new' / 'p.png'}\n"


def test_a_default_rank_of_zero_is_a_one_line_error_only_where_a_low_rank_row_runs():
    """Below n_embd=4 the default rank n_embd/4 is 0: the low-rank rows ask for --rank, and rows without
    them run (they were a traceback from row names that were not asked for)."""
    result = run_bench("--n_embd=2", "--n_head=1")
    assert result.returncode != 0 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "default rank, n_embd/4, is 0 at --n_embd=2: give --rank" in result.stderr
    result = run_bench("--n_embd=2", "--n_head=1", "--rows=standard")
    assert result.returncode == 0, result.stderr


def test_gpu_training_memory_is_the_rows_state_plus_what_its_step_allocates(monkeypatch):
    """On a GPU every row's model and optimizer share one allocator: a row's training memory is its own state
    (parameters, buffers, AdamW's two moments) plus the peak its step allocates above what was allocated
    before it (every other row's state with it), in MiB, the peak counter reset just before the step."""
    import bench
    row = tiny_row("dlr/rank=8", monkeypatch)
    row.train_step()  # run()'s warm-up step comes first: AdamW's moments exist when the memory is measured
    row.args.device = "cuda"  # the allocator's counters below are faked; the model stays on the CPU
    before, above = 300 * 2 ** 20, 5 * 2 ** 20  # allocated before the step (all rows); the step's peak above that
    events = []
    monkeypatch.setattr(bench, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: events.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: before)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: events.append("peak") or before + above)
    step = row.train_step
    monkeypatch.setattr(row, "train_step", lambda: events.append("step") or step())
    row.measure_memory()
    assert events == ["reset", "step", "peak"]
    params = [p.numel() * p.element_size() for p in row.model.parameters()]
    buffers = sum(b.numel() * b.element_size() for b in row.model.buffers())
    assert buffers > 0
    # 3 x the parameters: themselves, exp_avg and exp_avg_sq (their gradients are in the step's peak);
    # AdamW's step counters, 4 bytes a parameter tensor, within the tolerance
    assert row.peak_mem * 2 ** 20 == pytest.approx(3 * sum(params) + buffers + above, abs=4 * len(params))


def test_a_row_runs_with_the_route_options_given(monkeypatch):
    """--fused_route and --bf16_sources reach every row's model: the model's own defaults are auto and true,
    so a row that dropped them would time the default route, not the one asked for."""
    row = tiny_row("attnres/res_blocks=0", monkeypatch, "--fused_route=false", "--bf16_sources=false")
    assert row.model.fused_route is False and row.model.bf16_sources is False


def test_rank_names_and_builds_the_low_rank_rows(monkeypatch):
    """--rank=4 (not the default n_embd/4 = 8) is the low-rank rows' name and their models' rank: folded/rank=4
    is dlr/rank=4 folded, compared with lowrank/rank=4, itself compared with dense (the standard model)."""
    import bench

    class Stop(Exception):
        pass
    built = {}

    class Built:  # what run() builds each row from; it stops once all are built
        def __init__(self, name, reference, cfg, args, ctx):
            built[name] = reference, cfg

        @property
        def model(self):
            raise Stop
    monkeypatch.setattr(bench, "Row", Built)
    monkeypatch.setattr(bench, "peak_flops", lambda *a: (1e12, "test"))
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, "--rank=4", "--rows=folded/rank=4"])
    with pytest.raises(Stop):
        bench.run(bench.parse_args())
    assert built == {"dense": ("dense", dict(residual="standard", lowrank_rank=0, dlr=False)),
                     "lowrank/rank=4": ("dense", dict(residual="standard", lowrank_rank=4, dlr=False)),
                     "folded/rank=4": ("lowrank/rank=4", dict(residual="standard", lowrank_rank=4, dlr=True, fold=True))}


def fake_timings(monkeypatch, train_s=0.5, decode_s=0.01):
    """Every timed round takes these seconds (a step, a token) and every row 1 MiB: run() without the timing."""
    import bench
    monkeypatch.setattr(bench.Row, "time_train", lambda self, steps: train_s)
    monkeypatch.setattr(bench.Row, "time_decode", lambda self, n: decode_s)
    monkeypatch.setattr(bench.Row, "measure_memory", lambda self: setattr(self, "peak_mem", 1.0))


@pytest.mark.parametrize("threads", [None, 3])
def test_the_cpu_peak_and_the_json_count_the_threads_the_rows_run_on(tmp_path, monkeypatch, threads):
    """The CPU's matmul peak is one thread's speed times torch's thread count (common.measured_matmul_flops), so
    --threads is set before the peak is measured; the JSON's threads is the count run with, torch's own where
    --threads is left out (config's threads is then None)."""
    import bench
    count = [6]  # torch's thread count, faked: this process keeps its own
    monkeypatch.setattr(torch, "set_num_threads", lambda n: count.__setitem__(0, n))
    monkeypatch.setattr(torch, "get_num_threads", lambda: count[0])
    seen = []
    monkeypatch.setattr(bench, "peak_flops", lambda *a: seen.append(count[0]) or (1e9, "test"))
    fake_timings(monkeypatch)
    out = tmp_path / "bench.json"
    options = [f"--threads={threads}"] if threads else []
    monkeypatch.setattr(sys, "argv", ["bench.py", *(a for a in TINY if not a.startswith("--threads=")), *options,
                                      "--rows=standard", f"--json={out}"])
    bench.main()
    data = json.loads(out.read_text())
    assert seen == [threads or 6] and data["threads"] == (threads or 6) and data["config"]["threads"] == threads


def test_compile_times_are_each_phases_first_call(tmp_path, monkeypatch):
    """With --compile each row's compile_s is its first (compiling) call of each phase: the warm-up's training
    step, and apart from it the warm-up's decoding. A clock that only those calls move on gives the exact
    seconds (torch.compile is left out: the calls timed are the same). The JSON names the run's settings."""
    import types
    import bench
    clock = [0.0]
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], strftime=lambda f: "2026-01-01"))
    monkeypatch.setattr(torch, "compile", lambda model: model)
    monkeypatch.setattr(bench.GPT, "compile_decoding", lambda self: lambda t, c: self(t, cache=c)[0])
    first_calls = {"standard": (30.0, 4.0), "attnres/res_blocks=0": (90.0, 6.0)}  # seconds: training step, decoding

    def train_step(self):
        clock[0] += first_calls[self.name][0]

    def time_decode(self, n):
        clock[0] += first_calls[self.name][1] if n == bench.WARMUP_DECODE_TOKENS else 0.0
        return 0.01
    fake_timings(monkeypatch)
    monkeypatch.setattr(bench.Row, "train_step", train_step)
    monkeypatch.setattr(bench.Row, "time_decode", time_decode)
    out = tmp_path / "bench.json"
    monkeypatch.setattr(sys, "argv", ["bench.py", *TINY, "--compile", "--dtype=bfloat16", "--peak_tflops=1",
                                      "--rows=standard,attnres/res_blocks=0", f"--json={out}"])
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    # main() raises the limit: put back on the way out by dynamo's own patch (pytest 9.2's monkeypatch deletes it instead)
    with torch._dynamo.config.patch({limit: getattr(torch._dynamo.config, limit)}):
        bench.main()
    data = json.loads(out.read_text())
    assert (data["device"], data["dtype"], data["compile"], data["compile_sublayers"]) == ("cpu", "bfloat16", True, False)
    assert {(r["name"], r["phase"]): r["compile_s"] for r in data["rows"]} == {
        (name, phase): s for name, (train, decode) in first_calls.items() for phase, s in (("train", train), ("decode", decode))}
