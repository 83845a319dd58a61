"""
common.py: what the scripts share is written once, and every script uses it. With what a CPU can show
of the GPU and torchrun paths: the device and dtype choice (GPU capabilities mocked), the MFU peak by
exact GPU name, synchronising the named GPU, one rank per node doing a download or a preparation, the
non-finite count, checkpoints read into CPU memory. The GPUs themselves: test_gpu.py.
"""

import os
import re
import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from checkpoint import load_model, model_args, save_checkpoint  # noqa: E402
from common import (GPU_PEAK_TFLOPS, NonFiniteLosses, autocast, once_per_node, peak_flops, resolve_device,  # noqa: E402
                    resolve_dtype, synchronize)
from helpers import folder_locked_by_another_process, tiny_config  # noqa: E402
from model import GPT  # noqa: E402

SCRIPTS = ("train.py", "compare.py", "figures.py", "prepare.py", "sample.py", "fold.py", "bench.py")


def test_die_is_one_line_with_rank_and_exit_code(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as exit_:
        common.die("no dataset at data/x: run `python prepare.py x`")
    assert exit_.value.code == 1 and capsys.readouterr().err == "error: no dataset at data/x: run `python prepare.py x`\n"
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(SystemExit) as exit_:
        common.die("bad key", 2)
    assert exit_.value.code == 2 and capsys.readouterr().err == "[rank 3] error: bad key\n"


def test_no_script_exits_with_an_error_of_its_own():
    """Every expected failure ends in common.die: no script prints its own 'error:' line or raises
    SystemExit with a message, so the format (and the rank prefix under torchrun) is the same everywhere."""
    own = re.compile(r"""print\(f?["']error|SystemExit\(f?["']|sys\.exit\(1\)""")
    offenders = [f"{path.name}:{n}" for path in REPO.glob("*.py") if path.name != "common.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if own.search(line)]
    assert not offenders, offenders


@pytest.mark.parametrize("text, value", [("True", True), ("yes", True), ("1", True), ("false", False), ("NO", False), ("0", False)])
def test_boolean_reads_what_train_py_reads(text, value):
    assert common.boolean(text) is value


def test_boolean_refuses_anything_else():
    with pytest.raises(ValueError):
        common.boolean("maybe")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script):
    result = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                            cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert result.returncode == 0 and result.stderr == "" and len(result.stdout.splitlines()) > 5, result


def test_tool_flags_take_train_py_booleans(monkeypatch):
    """--compile, --compile=True and --compile=false mean the same in bench.py as in train.py."""
    import bench
    for argv, value in ((["--compile=false"], False), (["--compile"], True), (["--compile=True"], True), ([], False)):
        monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
        assert bench.parse_args().compile is value


def test_run_names_round_trip():
    for name in ("standard", "attnres/res_blocks=0", "delta/res_blocks=4", "rd/res_blocks=2", "rd_fixedv/res_blocks=0",
                 "lowrank/rank=16", "dlr/rank=32", "delta/res_blocks=0/rank=8"):
        assert common.run_name(common.run_settings(name)) == name
    assert common.run_settings("rd_fixedv/res_blocks=0")["fixed_value_route"] is True
    for bad in ("nope", "dlr", "attnres/rank", "standard/res_blocks=2"):
        with pytest.raises(ValueError):
            common.run_settings(bad)


def fake_gpu(monkeypatch, name="NVIDIA A100-SXM4-80GB", native_bf16=True, count=1, capabilities=None):
    """torch.cuda as it looks on a machine with `count` GPUs called `name`: compute capability 8.0
    (bfloat16 units) or 7.0 (V100: none; is_bf16_supported() still says True, as torch emulates it),
    or per GPU index as `capabilities` lists them. set_device records its argument in the list returned."""
    capabilities = capabilities or [(8, 0) if native_bf16 else (7, 0)] * count
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: capabilities[torch.device(device).index or 0])
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


def test_auto_dtype_takes_bf16_only_where_the_gpu_has_it(monkeypatch):
    """dtype=auto: bfloat16 on a GPU with bfloat16 units, float16 (with train.py's scaler) on one that only
    emulates it, float32 on CPU and MPS; a dtype named explicitly is kept."""
    fake_gpu(monkeypatch, native_bf16=True)
    assert resolve_dtype("auto", "cuda") == "bfloat16" and resolve_dtype("auto", "cuda:0") == "bfloat16"
    fake_gpu(monkeypatch, "Tesla V100-SXM2-16GB", native_bf16=False)
    assert torch.cuda.is_bf16_supported()  # what torch's own check says: emulation counts
    assert resolve_dtype("auto", "cuda") == "float16"
    assert resolve_dtype("bfloat16", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == resolve_dtype("auto", "mps") == "float32"
    with pytest.raises(ValueError, match="dtype='half' is not allowed: use auto, float32, bfloat16, float16"):
        resolve_dtype("half", "cpu")


def test_auto_dtype_asks_the_gpu_named_not_the_current_one(monkeypatch):
    """On a machine with a V100 as cuda:0 and an A100 as cuda:1, each gets its own dtype."""
    fake_gpu(monkeypatch, count=2, capabilities=[(7, 0), (8, 0)])
    assert resolve_dtype("auto", "cuda:0") == "float16" and resolve_dtype("auto", "cuda:1") == "bfloat16"


def test_bind_device_gives_set_device_an_index(monkeypatch):
    """A plain "cuda" binds GPU 0 (set_device("cuda") raises); torchrun's LOCAL_RANK picks the GPU;
    a CPU binds nothing."""
    current = fake_gpu(monkeypatch, count=2)
    assert common.bind_device("cuda") == "cuda" and current == [0]
    assert common.bind_device("cuda:1") == "cuda:1" and current == [0, 1]
    assert common.bind_device("cuda", ddp=True, local_rank=1) == "cuda:1" and current == [0, 1, 1]
    assert common.bind_device("cpu", ddp=True, local_rank=1) == "cpu" and current == [0, 1, 1]


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    """LOCAL_RANK past the GPUs this process sees is a one-line error, not CUDA's "invalid device ordinal"."""
    current = fake_gpu(monkeypatch, count=2)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=2 but this process sees 2 GPU\(s\).*--nproc_per_node=2"):
        common.bind_device("cuda", ddp=True, local_rank=2)
    assert current == []


def test_process_group_waits_for_downloads_and_binds_nccl_to_its_gpu():
    """NCCL on a GPU, bound to it (device_id), gloo on a CPU; both wait far longer than NCCL's default
    10 minutes, the time rank 0 may take to download gpt2-xl while the others wait."""
    gpu, cpu = common.process_group_options("cuda:3"), common.process_group_options("cpu")
    assert gpu["backend"] == "nccl" and gpu["device_id"] == torch.device("cuda:3")
    assert cpu["backend"] == "gloo" and "device_id" not in cpu
    assert gpu["timeout"].total_seconds() >= 3600 and cpu["timeout"] == gpu["timeout"]


def test_allow_tf32_uses_the_fp32_precision_api():
    """torch >= 2.9: TF32 is set through fp32_precision, not the deprecated allow_tf32 flags."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no fp32_precision settings")
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        matmul.fp32_precision = conv.fp32_precision = "ieee"
        common.allow_tf32()
        assert matmul.fp32_precision == conv.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_device_names_are_checked_against_the_machine(monkeypatch):
    assert resolve_device("cpu") == "cpu"
    for bad in ("tpu", "cuda:x", "cpu:1", "mps:0"):
        with pytest.raises(ValueError, match="use auto, cpu, cuda, cuda:N or mps"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="torch sees no Apple GPU"):
        resolve_device("mps")
    fake_gpu(monkeypatch, count=2)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match="has 2 GPU"):
        resolve_device("cuda:2")


def test_autocast_runs_on_the_devices_own_kind():
    """sample.py's autocast used to be the CPU's on MPS; here the device's kind decides, and float32 is none."""
    assert autocast("mps", "float16").device == "mps"
    with autocast("cpu", "bfloat16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast("cpu", "float32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_mfu_peak_matches_gpu_names_exactly(monkeypatch):
    """"L4" is in "NVIDIA L40S", and an H100 PCIe is no SXM: each name gets its own datasheet peak. An
    unlisted GPU is measured like a CPU, and peak_tflops overrides both."""
    monkeypatch.setattr(common, "measured_matmul_flops", lambda device, dtype: 1.5e12)
    for name, tflops in {"NVIDIA L40S": 362, "NVIDIA L4": 121, "NVIDIA H100 PCIe": 756, "NVIDIA H100 80GB HBM3": 989,
                         "Tesla T4": 65}.items():
        fake_gpu(monkeypatch, name)
        assert peak_flops("cuda", "bfloat16") == (tflops * 1e12, f"the {name} datasheet")
    fake_gpu(monkeypatch, "NVIDIA H100 PCIe", count=2)  # torchrun's cuda:N, not only a plain "cuda"
    assert peak_flops("cuda:1", "bfloat16") == (756e12, "the NVIDIA H100 PCIe datasheet")
    fake_gpu(monkeypatch, "NVIDIA A100 Next")  # contains "A100", once enough for an A100's peak
    assert peak_flops("cuda", "bfloat16") == (1.5e12, "a bfloat16 matmul measured on cuda")
    assert peak_flops("cuda", "bfloat16", peak_tflops=400.0) == (400e12, "peak_tflops")
    assert all(name == name.strip() and 10 <= t <= 3000 for name, t in GPU_PEAK_TFLOPS.items())


def test_cpu_peak_is_measured_in_the_training_dtype():
    """On a CPU the peak is a timed matmul (train.py and bench.py share it), and it leaves torch's
    global random stream and thread count as they were: a run's numbers do not depend on it."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    flops, source = peak_flops("cpu", "float32")
    assert flops > 1e8 and source == "a float32 matmul measured on cpu"
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)


def test_cpu_peak_is_timed_on_one_thread_and_scaled_to_torchs_threads(monkeypatch):
    """One thread is timed, then torch's thread count is restored (a run kept on one thread would lose its
    cores) and the timing multiplied by it. A clock that ticks 2**-7 s a reading makes the timing exact."""
    def measure(threads):
        ticks = itertools.count()
        monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 2 ** -7)
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        set_to = []
        monkeypatch.setattr(torch, "set_num_threads", set_to.append)
        return common.measured_matmul_flops("cpu", "float32"), set_to

    (one, set_one), (four, set_four) = measure(1), measure(4)
    assert set_one == [1, 1] and set_four == [1, 4]
    assert four == 4 * one and one == 2 * 512 ** 3 * 5 / (7 * 2 ** -7)  # 5 matmuls timed over 7 ticks


def test_cannot_write_says_why_before_the_work(tmp_path):
    """Asked before an evaluation or a fold: None where write_atomic could write (the folders it would
    make included), else why not in a few words."""
    assert common.cannot_write(tmp_path / "new" / "deeper" / "ckpt.pt") is None
    assert common.cannot_write(tmp_path) == "it is a folder"
    (tmp_path / "file").write_text("x")
    assert common.cannot_write(tmp_path / "file" / "deeper" / "ckpt.pt") == f"{tmp_path / 'file'} is a file, not a folder"
    if os.name == "posix" and os.geteuid() != 0:  # root writes in a read-only folder
        (tmp_path / "ro").mkdir(mode=0o500)
        assert common.cannot_write(tmp_path / "ro" / "ckpt.pt").startswith(f"cannot create a file in {tmp_path / 'ro'}")


@pytest.mark.skipif(os.name == "nt", reason="folder locks are Unix flocks")
def test_a_folder_lock_has_one_holder_until_its_process_ends(tmp_path):
    """lock_folder: a process holding it keeps it until it ends; meanwhile another process asks in vain, and
    only asking (hold=False) takes nothing, so asking twice finds the folder free twice."""
    with folder_locked_by_another_process(tmp_path):
        assert common.lock_folder(tmp_path, hold=False) is False
    assert common.lock_folder(tmp_path, hold=False) is True and common.lock_folder(tmp_path, hold=False) is True
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_synchronize_waits_for_the_named_gpu(monkeypatch):
    """bench.py timed cuda:1 while synchronising cuda:0 (torch's current device)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    synchronize("cuda:1")
    synchronize("cpu")
    assert calls == ["cuda:1"]


def simulate_nodes(fn_for, nodes=2, per_node=2, late_rank=None, then=None):
    """Run once_per_node in one thread per rank (rank = node * per_node + local rank), with a real barrier.
    fn_for(rank) is the rank's fn. late_rank starts only once rank 0 is done. then(rank), if given, runs in
    each rank once once_per_node has returned there. Returns the ranks that ran fn."""
    world = nodes * per_node
    barrier = threading.Barrier(world, timeout=20)  # a rank that skipped a barrier breaks it: no silent hang
    ran, rank0_done, errors = [], threading.Event(), []

    def rank_main(rank):
        try:
            if rank == late_rank:
                rank0_done.wait(20)

            def fn():
                ran.append(rank)
                fn_for(rank)
                if rank == 0:
                    rank0_done.set()
            once_per_node(fn, rank, rank % per_node, barrier.wait)
            if then:
                then(rank)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return sorted(ran)


def test_one_rank_per_node_downloads_and_every_rank_waits(tmp_path):
    """Under torchrun every rank used to download GPT-2 into one .part file. Now one rank per node runs the
    download (rank 0 first), the others wait; where the nodes share a filesystem, the other nodes find the
    file and download nothing, and without one each node fetches its own copy."""
    fetched = []

    def fetch(path):
        def fn(rank):
            if not path(rank).exists():  # download() does nothing for a file that is there
                fetched.append(rank)
                path(rank).write_text("weights")
        return fn

    shared = tmp_path / "shared.safetensors"
    assert simulate_nodes(fetch(lambda rank: shared)) == [0, 2] and fetched == [0]
    fetched.clear()
    assert simulate_nodes(fetch(lambda rank: tmp_path / f"node{rank // 2}.safetensors")) == [0, 2] and fetched == [0, 2]


def test_every_rank_waits_for_its_nodes_slow_download(tmp_path):
    """A download takes a while: a rank of another node that started its own before rank 0 had finished
    would fetch the shared file a second time, and a rank that returned before its node's download was
    done would read a file that is not there yet."""
    fetched = []

    def slow_fetch(path):
        def fn(rank):
            if not path(rank).exists():
                fetched.append(rank)
                time.sleep(0.2)
                path(rank).write_text("weights")
        return fn

    def found(path):
        def then(rank):
            assert path(rank).read_text() == "weights", f"rank {rank} went on before its node had the file"
        return then

    shared = lambda rank: tmp_path / "shared.safetensors"  # noqa: E731
    assert simulate_nodes(slow_fetch(shared), then=found(shared)) == [0, 2] and fetched == [0]
    fetched.clear()
    per_node = lambda rank: tmp_path / f"node{rank // 2}.safetensors"  # noqa: E731
    assert simulate_nodes(slow_fetch(per_node), then=found(per_node)) == [0, 2] and fetched == [0, 2]


def test_a_late_rank_passes_the_same_barriers(tmp_path):
    """First-run pydocs: a rank that looked for meta.json after rank 0 had written it skipped the barrier
    rank 0 waited in, and the run hung. Every rank now passes the same barriers whatever is on disk."""
    meta = tmp_path / "meta.json"
    assert simulate_nodes(lambda rank: meta.exists() or meta.write_text("{}"), nodes=1, per_node=2, late_rank=1) == [0]
    assert once_per_node(lambda: "ran", 0, 0) == "ran"  # a single process just runs it


def test_float16_stops_only_after_several_nonfinite_losses_in_a_row():
    """float16's scaler skips an overflowing step, so one is survived; float32 and bfloat16 stop at the first."""
    inf = float("inf")
    fp16 = NonFiniteLosses(limit=3)
    assert [fp16.count(x) for x in (2.0, inf, inf, 1.9, float("nan"), inf)] == [False] * 6  # never 3 in a row
    assert fp16.count(inf) and fp16.in_a_row == 3
    fp32 = NonFiniteLosses(limit=1)
    assert not fp32.count(2.0) and fp32.count(float("nan"))


def test_checkpoints_are_read_into_cpu_memory_then_moved(tmp_path, monkeypatch):
    """sample.py and fold.py (checkpoint.load_model) read a checkpoint, AdamW state and all, into CPU
    memory and move only the model: here to the meta device, where nothing can be read to."""
    model = GPT(tiny_config())
    path = tmp_path / "ckpt.pt"
    save_checkpoint(dict(model=model.state_dict(), model_args=model_args(model)), path)
    seen = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k["map_location"]) or load(*a, **k))
    moved, _ = load_model(path, "meta")
    assert seen == ["cpu"] and next(moved.parameters()).device.type == "meta"


def test_cpu_peak_is_the_best_of_its_windows(monkeypatch):
    """A window that another process slows does not lower the peak: the best of the five counts. The clock
    here ticks 2**-7 s a reading for four windows (5 matmuls over 7 ticks each, as above) and 2**-5 s in the
    last (1 matmul over 3 ticks, 8.6x slower)."""
    clock = {"t": 0.0, "readings": 0}

    def perf_counter():
        now = clock["t"]
        clock["t"] += 2 ** -7 if clock["readings"] < 4 * 8 else 2 ** -5  # a window reads the clock 8 times
        clock["readings"] += 1
        return now
    monkeypatch.setattr(time, "perf_counter", perf_counter)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert common.measured_matmul_flops("cpu", "float32") == 2 * 512 ** 3 * 5 / (7 * 2 ** -7)
    assert clock["readings"] == 4 * 8 + 4  # the slow window read it 4 times: the clock ran as described
