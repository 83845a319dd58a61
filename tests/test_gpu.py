"""
The CUDA paths on a GPU: bfloat16 autocast, torch.compile, the KV cache, fold, training every mode
(bfloat16 and float16 with its scaler), per-row memory in bench.py, and torchrun over NCCL. Each is
skipped, with the reason, where torch sees no GPU; what a CPU can show of them (the dtype choice,
the GPU name table, the rank that downloads, the non-finite count) is in test_common.py.

Tolerances, all relative to the scale of what is compared:
- bfloat16 keeps 8 significant bits: every rounding is up to 2^-9 = 2e-3 relative, and routes that
  choose sharply (attnres, no stream to dilute them) pass it on. Measured with CPU autocast (8 modes
  x 6 seeds, attention in bfloat16 as on a GPU): the logits' RMS error up to 1.4% of their RMS, the
  loss 5e-5 relative, the gradient's direction cos >= 0.9993. Allowed: 4%, 1e-3 and cos >= 0.995, for
  cuBLAS's and flash attention's own bfloat16 roundings; a term dropped or computed at the wrong
  place is off by tens of percent.
- torch.compile in float32 changes only the order of float32 sums (fused reductions): 1e-6 relative
  at this size. Allowed: 1e-4 of the scale, for logits and gradients; a wrong fusion is 1e-2 or more.
"""

import argparse
import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import bench
from checkpoint import model_args, save_checkpoint
from common import resolve_dtype
from helpers import perturb_norms_and_biases, randomise_queries
import model as model_module
from model import GPT, GPTConfig
from test_train import ENV, TINY, events, make_dataset, train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda"
SHAPE = dict(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=64, dropout=0.0, bias=True)
MODES = {  # every residual mode, per-sublayer and block routing, low rank with DLR
    "standard": {}, "attnres": dict(residual="attnres"), "attnres/2": dict(residual="attnres", res_blocks=2),
    "delta": dict(residual="delta"), "delta/2": dict(residual="delta", res_blocks=2), "rd": dict(residual="rd"),
    "rd/2": dict(residual="rd", res_blocks=2), "dlr": dict(residual="delta", lowrank_rank=16, dlr=True),
}
TRAIN_ON_GPU = [a for a in TINY if not a.startswith(("--device", "--dtype", "--peak_tflops"))] + [f"--device={DEVICE}"]


def gpu_model(mode, seed=0):
    """A small model on the GPU with non-trivial norms, biases and pseudo-queries (routes that choose)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**SHAPE, **MODES[mode]))
    return randomise_queries(perturb_norms_and_biases(model), seed=seed, scale=1.0).to(DEVICE)


def batch(seed=0, b=4):
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, SHAPE["vocab_size"], (b, SHAPE["block_size"]), generator=g) for _ in range(2))
    return x.to(DEVICE), y.to(DEVICE)


def logits_loss_grad(model, x, y, ctx=None):
    """All logits, the loss and the flat gradient of one forward and backward."""
    model.zero_grad(set_to_none=True)
    with ctx or nullcontext():
        logits, loss = model(x, y)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logits.float().detach(), loss.item(), grad


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 matmuls in float32, not TF32, so that a float32 reference is one (common.allow_tf32's
    setting, through the same API: torch >= 2.9 refuses to mix it with the legacy allow_tf32 flags)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if not hasattr(matmul, "fp32_precision"):
        before = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        return
    before = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision = conv.fp32_precision = "ieee"
    yield
    matmul.fp32_precision, conv.fp32_precision = before


@pytest.mark.parametrize("mode", MODES)
def test_bf16_autocast_is_close_to_float32(mode):
    """Forward and backward under bfloat16 autocast stay within bfloat16's rounding of float32 (module docstring)."""
    model, (x, y) = gpu_model(mode), batch()
    ref_logits, ref_loss, ref_grad = logits_loss_grad(model, x, y)
    logits, loss, grad = logits_loss_grad(model, x, y, torch.autocast(DEVICE, dtype=torch.bfloat16))
    assert ((logits - ref_logits).norm() / ref_logits.norm()).item() <= 0.04
    assert loss == pytest.approx(ref_loss, rel=1e-3)
    assert torch.nn.functional.cosine_similarity(grad, ref_grad, dim=0).item() >= 0.995


@pytest.mark.parametrize("mode", ["attnres", "attnres/2", "rd/2"])
def test_norms_of_bf16_mixes_keep_no_float32_copy(mode, monkeypatch):
    """Under bfloat16 autocast the fused route's mixes are bfloat16, and model.LayerNorm keeps each for the
    backward as it is, where nn.LayerNorm under autocast keeps a float32 copy: one float32 activation
    fewer per norm of a bfloat16 input, and logits, loss and every gradient the same bits. (In delta the
    norms' inputs are the float32 stream: nothing changes there.)"""
    model, (x, y) = gpu_model(mode), batch()
    calls = []
    upcast = model_module.LayerNormOfUpcast.apply
    monkeypatch.setattr(model_module.LayerNormOfUpcast, "apply", lambda *a: calls.append(1) or upcast(*a))

    def step():  # (logits, loss, grad) and how many float32 tensors of the activations' shape autograd kept
        kept = []
        def pack(t):
            if t.dtype == torch.float32 and t.shape == (*x.shape, SHAPE["n_embd"]):
                kept.append(t)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = logits_loss_grad(model, x, y, torch.autocast(DEVICE, dtype=torch.bfloat16))
        return result, len(kept)
    (logits, loss, grad), kept = step()
    assert calls  # the fused route's bf16 mixes reached model.LayerNorm's own path
    monkeypatch.setattr(model_module.LayerNorm, "forward", torch.nn.LayerNorm.forward)
    (ref_logits, ref_loss, ref_grad), ref_kept = step()
    assert kept == ref_kept - len(calls)
    assert torch.equal(logits, ref_logits) and loss == ref_loss and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("mode", ["standard", "attnres", "delta/2", "rd", "dlr"])
def test_compiled_model_equals_eager(mode):
    """torch.compile's model computes the eager model's logits, loss and gradients, to float32 reordering."""
    torch._dynamo.reset()  # a fresh cache: a model past the recompile limit would silently run eager
    model, (x, y) = gpu_model(mode), batch()
    eager = logits_loss_grad(model, x, y)
    compiled = logits_loss_grad(torch.compile(model), x, y)
    for a, b in ((eager[0], compiled[0]), (eager[2], compiled[2])):
        assert (a - b).abs().max().item() <= 1e-4 * a.abs().max().item()
    assert compiled[1] == pytest.approx(eager[1], rel=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_cached_generation_equals_uncached(mode):
    """Greedy decoding with the key-value cache gives the tokens of full forwards, past block_size too."""
    model = gpu_model(mode).eval()
    prompt = batch(b=2)[0][:, :5]
    cached = torch.cat(list(model.generate_tokens(prompt, 40, temperature=0, use_cache=True)), dim=1)
    uncached = torch.cat(list(model.generate_tokens(prompt, 40, temperature=0, use_cache=False)), dim=1)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("mode", ["standard", "attnres/2", "rd"])
def test_compiled_decoding_equals_eager(mode):
    """compile_decoding's step, replayed as a CUDA graph over the fixed-size cache, gives the eager
    step's logits at every position (float32: Inductor only reorders sums)."""
    torch._dynamo.reset()
    model = gpu_model(mode).eval()
    step = model.compile_decoding()
    x = batch()[0][:2, :12]
    with torch.no_grad():
        cache, eager_cache = model.make_cache(), model.make_cache()
        model(x[:, :4], cache=cache)
        model(x[:, :4], cache=eager_cache)
        for t in range(4, 12):
            logits = step(x[:, t:t + 1].contiguous(), cache).clone()  # the graph's output is reused by the next replay
            ref, _ = model(x[:, t:t + 1], cache=eager_cache)
            assert (logits - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_fold_keeps_logits_on_the_gpu(tmp_path):
    """model.fold_dlr on the GPU: the same logits (the very float32 sum B + sR the DLR forward forms);
    then fold.py and sample.py with --device=cuda on a checkpoint saved from the GPU."""
    model = gpu_model("dlr").eval()
    x, y = batch()
    with torch.no_grad():
        before = model(x, y)[0]
        model_copy = gpu_model("dlr").eval()
        model_copy.fold_dlr()
        after = model_copy(x, y)[0]
    assert torch.equal(before, after)
    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint({"model": model.state_dict(), "model_args": model_args(model), "optimizer": {"state": {}},
                     "iter_num": 1, "best_val_loss": 0.0, "dataset_meta": {"tokenizer": "bytes", "vocab_size": 64}}, ckpt)
    for command in ([REPO / "fold.py", f"--ckpt={ckpt}", f"--out={tmp_path / 'folded.pt'}", "--device=cuda"],
                    [REPO / "sample.py", f"--ckpt={tmp_path / 'folded.pt'}", "--device=cuda", "--num_samples=1",
                     "--max_new_tokens=8", "--start=ab"]):
        result = subprocess.run([sys.executable, *map(str, command)], cwd=tmp_path, env=ENV, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("syn"))


TRAINED_MODES = {  # train.py arguments of every mode, per sublayer and block routing, the plain route, DLR
    "standard": ["--residual=standard"], "attnres": ["--residual=attnres"], "delta/2": ["--residual=delta", "--res_blocks=2"],
    "rd": ["--residual=rd"], "rd/plain": ["--residual=rd", "--fused_route=False"],
    "dlr": ["--residual=delta", "--lowrank_rank=16", "--dlr=True"],
}


def test_every_mode_trains_on_the_gpu(data, tmp_path):
    """train.py with the default device and dtype (cuda, bfloat16 on Ampere and later) in every mode: a few
    iterations lower the loss, the log names the device, and the checkpoint loads on a CPU-only machine
    (its tensors were saved on the CPU). The runs start together: each pays Python's and CUDA's start-up."""
    runs = {mode: tmp_path / mode.replace("/", "_") for mode in TRAINED_MODES}
    args = [a for a in TRAIN_ON_GPU if not a.startswith("--device")]  # the default: auto
    procs = {mode: subprocess.Popen([sys.executable, str(REPO / "train.py"), *args, *TRAINED_MODES[mode], f"--dataset={data}",
                                     f"--out_dir={out}", "--max_iters=6", "--eval_interval=6"], cwd=tmp_path, env=ENV,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for mode, out in runs.items()}
    for mode, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{mode}:\n{output}"
    for mode, out in runs.items():
        evals = events(out, "eval")
        assert evals[1]["val_loss"] < evals[0]["val_loss"] - 0.1, mode
        start = events(out, "start")[0]
        assert start["config"]["dtype"] == resolve_dtype("auto", "cuda") and start["device"] == "cuda"
        saved = torch.load(out / "ckpt.pt", weights_only=True)  # no map_location: each tensor where it was saved
        tensors = [*saved["model"].values(), *(v for st in saved["optimizer"]["state"].values() for v in st.values())]
        assert {t.device.type for t in tensors if torch.is_tensor(t)} == {"cpu"}, mode


@pytest.mark.parametrize("dtype,compile,sublayers", [("float16", False, False), ("bfloat16", True, False),
                                                     ("bfloat16", True, True)])
def test_float16_with_its_scaler_and_compiled_training(dtype, compile, sublayers, data, tmp_path):
    """float16 (with the gradient scaler) and a compiled bfloat16 run train too, the whole model compiled or
    its sublayers (the fused routes between them); resuming on the GPU works."""
    common = [*TRAIN_ON_GPU, f"--dataset={data}", f"--out_dir={tmp_path}", "--residual=rd", f"--dtype={dtype}",
              f"--compile={compile}", f"--compile_sublayers={sublayers}", "--eval_interval=4"]
    train(*common, "--max_iters=4", cwd=tmp_path)
    train(*common, "--max_iters=8", "--init_from=resume", cwd=tmp_path)
    evals = events(tmp_path, "eval")
    assert [e["iter"] for e in evals] == [0, 4, 8] and evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.1


def test_init_from_a_checkpoint_on_the_gpu(data, tmp_path):
    """init_from=<checkpoint> reads it into CPU memory and converts it on the GPU: the step-0 loss is the source's."""
    common = [*TRAIN_ON_GPU, f"--dataset={data}", "--dtype=float32", "--eval_interval=1"]
    train(*common, f"--out_dir={tmp_path / 'source'}", "--residual=standard", "--max_iters=1", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'delta'}", "--residual=delta", f"--init_from={tmp_path / 'source' / 'ckpt.pt'}",
          "--max_iters=0", cwd=tmp_path)
    source, delta = events(tmp_path / "source", "eval")[-1]["val_loss"], events(tmp_path / "delta", "eval")[0]["val_loss"]
    assert delta == pytest.approx(source, abs=1e-2)  # a fresh init's small stream: LayerNorm's eps (README, equivalence 1)


def test_bench_counts_each_rows_memory_alone():
    """bench.py's GPU peak memory of a row does not count the other rows' models and optimizers."""
    args = argparse.Namespace(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=256, batch_size=4,
                                    device=DEVICE, compile=False, fused_route="auto", bf16_sources=True)
    ctx = nullcontext()

    def peak(row):
        row.train_step()  # AdamW's state exists from here on, as after bench.py's warm-up
        row.measure_memory()
        return row.peak_mem

    alone = peak(bench.Row("standard", "standard", {}, args, ctx))
    big = bench.Row("big", "big", {}, argparse.Namespace(**{**vars(args), "n_embd": 512, "n_head": 8}), ctx)
    big.train_step()
    beside = peak(bench.Row("standard", "standard", {}, args, ctx))
    assert beside == pytest.approx(alone, rel=0.01)
    assert peak(big) > 10 * alone


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for torchrun over NCCL")
def test_torchrun_nccl_two_ranks_match_one_process(data, tmp_path):
    """2 GPUs x 2 micro-steps see the batches of 1 GPU x 4 (test_train.py's CPU test, over NCCL). float32
    sums in another order (NCCL's ring, atomic adds in the embedding's backward): ~1e-6 per step,
    carried by Adam over 5 steps; allowed 1e-4 relative."""
    common = [*TRAIN_ON_GPU, f"--dataset={data}", "--dtype=float32", "--residual=delta", "--max_iters=5",
              "--eval_interval=5", "--gradient_accumulation_steps=4"]
    train(*common, f"--out_dir={tmp_path / 'one'}", cwd=tmp_path)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"))
    train(*common, f"--out_dir={tmp_path / 'two'}", command=torchrun, cwd=tmp_path)
    one, two = ({e["iter"]: e["loss"] for e in events(tmp_path / d, "train")} for d in ("one", "two"))
    assert list(one) == list(two) == list(range(5))
    for it in one:
        assert two[it] == pytest.approx(one[it], rel=1e-4)
    start = json.loads((tmp_path / "two" / "log.jsonl").read_text().splitlines()[0])
    assert start["device"] == "cuda:0"


def test_torchrun_nccl_on_one_gpu_trains_saves_and_resumes(data, tmp_path):
    """torchrun --nproc_per_node=1 over NCCL (the process group bound to its GPU, DDP's wrapper, the
    loss all-reduce, rank 0's checkpoint, a resume): the same losses as a plain run of the same
    settings, to float32 reordering, and a resume that continues from iter 4 where it stopped."""
    common = [*TRAIN_ON_GPU, f"--dataset={data}", "--dtype=float32", "--residual=rd", "--eval_interval=4"]
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(REPO / "train.py"))
    train(*common, f"--out_dir={tmp_path / 'plain'}", "--max_iters=8", cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'ddp'}", "--max_iters=4", command=torchrun, cwd=tmp_path)
    train(*common, f"--out_dir={tmp_path / 'ddp'}", "--max_iters=8", "--init_from=resume", command=torchrun, cwd=tmp_path)
    plain, ddp = ({e["iter"]: e["loss"] for e in events(tmp_path / d, "train")} for d in ("plain", "ddp"))
    assert list(plain) == list(ddp) == list(range(8))
    for it in plain:
        assert ddp[it] == pytest.approx(plain[it], rel=1e-4)
    assert [e["event"] for e in map(json.loads, (tmp_path / "ddp" / "log.jsonl").read_text().splitlines())
            if e["event"] in ("start", "resume")] == ["start", "resume"]
    assert events(tmp_path / "ddp", "start")[0]["device"] == "cuda:0"
