"""
sample.py and fold.py: sampling from any checkpoint, and folding DLR away.

The checkpoints are tiny models written here with checkpoint.save_checkpoint, with the keys
train.py writes. The scripts run in-process through their main(argv) (a CLI run costs seconds of
start-up); one test runs both as real commands.

Tolerances. A fold stores in B the very float32 tensor B + sR that the DLR forward forms on every
call (LowRankLinear.up_weight), and every later operation is the same: the logits are bitwise
equal, so the fold tests ask for equality. --dense stores W = B A, multiplied in float64 and rounded
to float32 (relative error 2^-24 = 6e-8 per weight); compared in float64, where the forward's own
rounding is negligible, the logits move by 1e-7 (measured) on a logit scale of 0.5; we allow 1e-5.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checkpoint
import fold
import sample
from checkpoint import load_checkpoint, load_model, model_args, save_checkpoint
from helpers import perturb_norms_and_biases, randomise_queries
from model import GPT, GPTConfig, LowRankLinear, choose_next_token, keep_likeliest
from shards import get_tokenizer

REPO = Path(__file__).resolve().parents[1]
TINY = dict(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
DLR = dict(lowrank_rank=8, dlr=True, dlr_alpha=1.3)


def tiny_model(seed=0, **overrides):
    """A tiny GPT with non-trivial weights: random LayerNorms, biases and pseudo-queries."""
    torch.manual_seed(seed)
    model = randomise_queries(perturb_norms_and_biases(GPT(GPTConfig(**dict(TINY, **overrides)))), seed=seed)
    return model.eval()


def write_ckpt(path, tokenizer="bytes", **overrides):
    model = tiny_model(**overrides)
    save_checkpoint({"model": model.state_dict(), "model_args": model_args(model), "optimizer": {"state": {}},
                     "iter_num": 7, "best_val_loss": 3.2, "config": {"dataset": "tiny"},
                     "dataset_meta": {"tokenizer": tokenizer, "vocab_size": 256}}, path)
    return path


def run(script, argv, capsys):
    """(exit code, stdout, stderr) of script.main(argv)."""
    try:
        script.main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def all_logits(model, idx):
    logits, _ = model(idx, targets=torch.zeros_like(idx))  # with targets: logits at every position
    return logits


def tokens(seed=0, b=3, t=32):
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: a second intra-op thread costs more than it saves, and on a loaded machine the
    threads' waiting makes these tests many times slower (docs/speed.md, "Measurements behind the code")."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# on the CPU in float32 wherever the tests run: auto would take CUDA's bfloat16 on a GPU machine, where
# near-tied logits can flip a greedy token between two otherwise equal runs
GREEDY = ["--temperature=0", "--num_samples=1", "--max_new_tokens=40", "--start=To be or not", "--device=cpu"]


# -----------------------------------------------------------------------------
# fold.py

@pytest.mark.parametrize("mode,res_blocks", [("delta", 2), ("rd", 0)])
def test_fold_keeps_logits_and_greedy_samples(tmp_path, capsys, mode, res_blocks):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual=mode, res_blocks=res_blocks, **DLR)
    code, report, _ = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt"], capsys)
    assert code == 0 and "max |logit diff| 0 " in report
    original, _ = load_model(ckpt)
    folded, folded_ckpt = load_model(tmp_path / "folded.pt")
    assert folded_ckpt["model_args"]["dlr"] is False and original.config.dlr
    assert "optimizer" not in folded_ckpt  # it belongs to the unfolded weights
    assert folded_ckpt["dataset_meta"] == {"tokenizer": "bytes", "vocab_size": 256} and folded_ckpt["iter_num"] == 7
    with torch.no_grad():
        assert torch.equal(all_logits(original.eval(), tokens()), all_logits(folded.eval(), tokens()))  # see the module docstring
    samples = [run(sample, ["--ckpt", path] + GREEDY, capsys)[1] for path in (ckpt, tmp_path / "folded.pt")]
    assert samples[0] == samples[1] and len(samples[0]) > len("To be or not") + 10


def test_folded_size_equals_plain_lowrank(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="attnres", **DLR)
    code, report, _ = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt"], capsys)
    assert code == 0
    folded, _ = load_model(tmp_path / "folded.pt")
    plain = GPT(GPTConfig(**dict(TINY, residual="attnres", lowrank_rank=8)))
    assert folded.get_num_params() == plain.get_num_params()
    assert folded.flops_per_token() == plain.flops_per_token()
    assert {k: v.shape for k, v in folded.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert not any(m.dlr for m in folded.modules() if isinstance(m, LowRankLinear))
    # the report: before and after, the same size (a plain low-rank model's)
    rows = [line.split()[-2:] for line in report.splitlines() if line.startswith(("before", "after"))]
    assert len(rows) == 2 and rows[0] == rows[1] == [f"{plain.get_num_params():,}", f"{plain.flops_per_token():,}"]


@pytest.mark.parametrize("dlr", [True, False])
def test_dense_export_is_a_standard_gpt(tmp_path, capsys, dlr):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", lowrank_rank=8, dlr=dlr, lowrank_act="identity")
    code, _, _ = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "dense.pt", "--dense"], capsys)
    assert code == 0
    dense, dense_ckpt = load_model(tmp_path / "dense.pt")
    assert dense_ckpt["model_args"]["lowrank_rank"] == 0 and dense.config.residual == "standard"
    plain = GPT(GPTConfig(**TINY))  # GPT-2's layout: the same names and shapes
    assert {k: v.shape for k, v in dense.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert dense.state_dict()["transformer.h.0.attn.c_attn.weight"].shape == (3 * 32, 32)
    # B A is multiplied in float64 but stored as the model's float32: not a file of twice the size
    assert {k: v.dtype for k, v in dense_ckpt["model"].items()} == {k: torch.float32 for k in plain.state_dict()}
    original, _ = load_model(ckpt)
    # each weight is B A (B with DLR folded in) exact to float64, then rounded once to float32
    for name, linear in original.named_modules():
        if isinstance(linear, LowRankLinear):
            product = (linear.up_weight().double() @ linear.A.weight.double()).float()
            assert torch.equal(dense_ckpt["model"][f"{name}.weight"], product), name
    with torch.no_grad():
        diff = (all_logits(original.double().eval(), tokens()) - all_logits(dense.double().eval(), tokens())).abs().max().item()
    assert diff < 1e-5  # float32 storage of B A: see the module docstring


def test_dense_export_needs_identity_activation(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", lowrank_act="silu", **DLR)
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "dense.pt", "--dense"], capsys)
    assert code == 1 and err.startswith("error: --dense needs lowrank_act=identity") and "not a linear map" in err
    assert not (tmp_path / "dense.pt").exists()


@pytest.mark.parametrize("overrides", [dict(lowrank_rank=8), dict()], ids=["lowrank-no-dlr", "dense"])
def test_fold_refuses_nothing_to_fold(tmp_path, capsys, overrides):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **overrides)
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt"], capsys)
    assert code == 1 and "nothing to fold" in err and err.count("\n") == 1
    assert not (tmp_path / "folded.pt").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_fold_checks_the_device_before_loading(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **DLR)
    for device, message in (("cuda", "torch sees no CUDA GPU"), ("gpu", "is not allowed")):
        code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt", f"--device={device}"], capsys)
        assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "folded.pt").exists()


def test_fold_never_overwrites_its_input(tmp_path, capsys):
    """Not by its path, another spelling of it, a symbolic link or a hard link (another name of the same
    file, which only os.path.samefile sees), --overwrite or not."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **DLR)
    before = ckpt.read_bytes()
    (tmp_path / "link.pt").symlink_to(ckpt)
    os.link(ckpt, tmp_path / "hardlink.pt")
    for out in (ckpt, tmp_path / "sub" / ".." / "ckpt.pt", tmp_path / "link.pt", tmp_path / "hardlink.pt"):
        for overwrite in ([], ["--overwrite"]):
            code, _, err = run(fold, ["--ckpt", ckpt, "--out", out, *overwrite], capsys)
            assert code == 1 and err == f"error: --out {out} is the input checkpoint; write the folded one next to it, " \
                                        f"e.g. --out={tmp_path / 'folded.pt'}\n"
    named_folded = shutil.copyfile(ckpt, tmp_path / "folded.pt")  # the suggestion must not be the input again
    code, _, err = run(fold, ["--ckpt", named_folded, "--out", named_folded], capsys)
    assert code == 1 and err.endswith(f"e.g. --out={tmp_path / 'folded_folded.pt'}\n")
    assert ckpt.read_bytes() == before and os.path.samefile(ckpt, tmp_path / "hardlink.pt")


def test_fold_keeps_an_existing_out_unless_told_to_overwrite(tmp_path, capsys):
    """--out naming another run's checkpoint (optimizer state, iteration: resumable) is refused before any
    work, the file untouched; --overwrite replaces it with the fold."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **DLR)
    other = write_ckpt(tmp_path / "other" / "ckpt.pt", **DLR)
    before = other.read_bytes()
    code, out, err = run(fold, ["--ckpt", ckpt, "--out", other], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: --out {other} already exists") and "pass --overwrite to replace it" in err
    assert other.read_bytes() == before
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", other, "--overwrite"], capsys)
    assert code == 0, err
    assert load_checkpoint(other)["model_args"]["dlr"] is False and "optimizer" not in load_checkpoint(other)


def test_fold_refuses_an_out_it_cannot_write_before_folding(tmp_path, capsys, monkeypatch):
    """A folder, or a path under a file, is one line naming it, before the fold (nothing printed); a write
    that fails after all (a full disk) is one line too, with nothing left behind."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **DLR)
    (tmp_path / "a_folder").mkdir()
    for out, problem in ((tmp_path / "a_folder", "it is a folder"),
                         (ckpt / "folded.pt", f"{ckpt} is a file, not a folder"),
                         (ckpt / "sub" / "folded.pt", f"{ckpt} is a file, not a folder")):
        for overwrite in ([], ["--overwrite"]):
            code, printed, err = run(fold, ["--ckpt", ckpt, "--out", out, *overwrite], capsys)
            assert (code, printed, err) == (1, "", f"error: cannot write --out {out}: {problem}; choose another --out\n")

    def disk_full(obj, path):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fold, "save_checkpoint", disk_full)
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt"], capsys)
    assert code == 1 and err == f"error: cannot write --out {tmp_path / 'folded.pt'} (No space left on device); choose another --out\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_folder", "ckpt.pt"]


def nan_at_0(v):
    v = v.clone()
    v[0, 0] = float("nan")
    return v


@pytest.mark.parametrize("key,wrong", [
    ("c_fc.bias", torch.zeros_like),  # the biases lost
    ("h.0.mlp.c_fc.weight", nan_at_0),  # NaN logits: a NaN difference is no pass
    # the queries of layer 0 negated: at position 0 attention has one key, its weight 1 whatever the query,
    # so only later positions see it; there the logits move by 0.24 (measured), the check allows 0.01
    ("h.0.attn.c_attn.weight", lambda v: torch.cat([-v[:TINY["n_embd"]], v[TINY["n_embd"]:]])),
], ids=["lost-bias", "nan", "queries"])
def test_fold_check_catches_a_wrong_fold(tmp_path, capsys, monkeypatch, key, wrong):
    """The verification is real: a wrong dense export is not written."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", lowrank_rank=8, lowrank_act="identity")
    right = fold.dense_state_dict
    monkeypatch.setattr(fold, "dense_state_dict",
                        lambda model: {k: (wrong(v) if k.endswith(key) else v) for k, v in right(model).items()})
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "dense.pt", "--dense"], capsys)
    assert code == 1 and err.startswith("error: the logits changed by ") and err.endswith(f"not writing {tmp_path / 'dense.pt'}\n")
    assert not (tmp_path / "dense.pt").exists()


def test_fold_check_catches_a_wrong_dlr_fold(tmp_path, capsys, monkeypatch):
    """The verification holds the fold itself to the model before it: a fold that absorbs R without its scale
    alpha / sqrt(K) (B + R, not B + (alpha / sqrt K) R) is not written. It moves this model's logits by 0.5
    (measured), where the check allows 0.01 (CHECK_RTOL of a logit scale under 1)."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", **DLR)

    @torch.no_grad()
    def unscaled_fold(layer):
        if layer.dlr:
            layer.B.weight.add_(layer.dlr_matrix)
            layer.dlr = False
            del layer.dlr_matrix, layer.dlr_scale
    monkeypatch.setattr(LowRankLinear, "fold_dlr", unscaled_fold)
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt"], capsys)
    assert code == 1 and err.startswith("error: the logits changed by ") and err.endswith(f"not writing {tmp_path / 'folded.pt'}\n")
    assert not (tmp_path / "folded.pt").exists()


# -----------------------------------------------------------------------------
# sample.py: generation

@pytest.mark.parametrize("linear", [{}, DLR], ids=["dense", "dlr"])
@pytest.mark.parametrize("mode,res_blocks", [("standard", 0), ("attnres", 0), ("attnres", 2),
                                             ("delta", 0), ("delta", 2), ("rd", 0), ("rd", 2)])
def test_cached_sampling_equals_uncached(mode, res_blocks, linear):
    model = tiny_model(residual=mode, res_blocks=res_blocks, **linear)
    prompt = tokens(b=2, t=5)
    # 40 new tokens after 5 run past block_size=32: the window slides, every step a full forward
    cached = torch.cat(list(model.generate_tokens(prompt, 40, temperature=0, use_cache=True)), dim=1)
    uncached = torch.cat(list(model.generate_tokens(prompt, 40, temperature=0, use_cache=False)), dim=1)
    assert torch.equal(cached, uncached)
    assert torch.equal(torch.cat([prompt, cached], dim=1), model.generate(prompt, 40, temperature=0))


def test_cache_makes_each_new_token_one_position():
    """N new tokens: one forward over the prompt, then N - 1 forwards of a single position. Once the
    context is full, each step is a full forward over the last block_size tokens, with no cache (one
    would be written and never read)."""
    model = tiny_model(residual="delta", **DLR)
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append((args[0].size(1), kwargs.get("cache") is not None)),
                                    with_kwargs=True)
    list(model.generate_tokens(tokens(b=1, t=5), 20, temperature=0.8, top_k=10))
    assert calls == [(5, True)] + [(1, True)] * 19
    block_size = model.config.block_size
    calls.clear()
    list(model.generate_tokens(tokens(b=1, t=block_size - 2), 5, temperature=0.8, top_k=10))
    assert calls == [(block_size - 2, True), (1, True), (1, True)] + [(block_size, False)] * 2


def test_sampling_skips_padded_vocabulary(tmp_path, capsys, monkeypatch):
    """A vocabulary padded past the tokenizer's has ids no tokenizer can decode: they are never drawn."""
    model = tiny_model(vocab_size=320)
    drawn = torch.cat(list(model.generate_tokens(tokens(b=4, t=4), 60, temperature=2.0, vocab_size=64)), dim=1)
    assert drawn.max().item() < 64 and drawn.unique().numel() > 20
    # sample.py limits a bytes checkpoint padded to 320 to the tokenizer's 256 (else bytes() of an id >= 256 fails);
    # unlimited, about a fifth of this fresh model's draws at temperature 2 are padded ids (measured: 22 of 100)
    generate_tokens, sampled = GPT.generate_tokens, []

    def spy(self, *args, **kwargs):
        for token in generate_tokens(self, *args, **kwargs):
            sampled.append(token.item())
            yield token
    monkeypatch.setattr(GPT, "generate_tokens", spy)
    ckpt = write_ckpt(tmp_path / "ckpt.pt", vocab_size=320)
    code, _, err = run(sample, ["--ckpt", ckpt, "--temperature=2", "--top_k=0", "--num_samples=1", "--max_new_tokens=100",
                                "--device=cpu"], capsys)
    assert code == 0 and err == ""
    assert len(sampled) == 100 and max(sampled) < 256


def test_top_k_then_top_p_keep_what_hugging_face_keeps():
    """keep_likeliest against Hugging Face's top-k and top-p logits warpers, applied in generate's order:
    the same tokens survive (random logits have no ties, where which of two equal tokens is kept is
    arbitrary), including top_p so small that one token is left (0 too), and top_k past the vocabulary."""
    logits_process = pytest.importorskip("transformers.generation.logits_process")
    gen = torch.Generator().manual_seed(0)
    for top_k in (None, 1, 3, 50):
        for top_p in (None, 0.0, 1e-6, 0.3, 0.9, 1.0):
            logits = torch.randn(8, 40, generator=gen) * 3
            ref = logits.clone()
            if top_k is not None:
                ref = logits_process.TopKLogitsWarper(top_k)(None, ref)
            if top_p is not None:
                ref = logits_process.TopPLogitsWarper(top_p)(None, ref)
            kept = keep_likeliest(logits, top_k, top_p)
            assert torch.equal(kept.isinf(), ref.isinf()), (top_k, top_p)
            assert torch.equal(kept[~kept.isinf()], logits[~kept.isinf()])  # the kept logits are untouched
    with pytest.raises(ValueError, match="top_p=1.5 is not a probability mass"):
        keep_likeliest(logits, top_p=1.5)


def test_top_p_reached_exactly_keeps_no_more_tokens():
    """The nucleus is the fewest tokens whose mass reaches top_p: a mass equal to top_p is enough. With n equal
    logits every probability is exactly 1/n (exp(0) = 1, 1/n exact for n = 4) and so is every partial sum,
    so top_p = k/n keeps exactly k tokens (random logits never land on the boundary)."""
    for k in (1, 2, 3):
        kept = keep_likeliest(torch.zeros(2, 4), top_p=k / 4)
        assert (~kept.isinf()).sum(dim=-1).tolist() == [k, k]


def test_top_p_takes_its_nucleus_after_the_temperature():
    """The nucleus is cut from the tempered distribution (Hugging Face's order: temperature, top-k, top-p)."""
    # probabilities [0.5, 0.3, 0.2] with top_p = 0.6. At temperature 1 the nucleus is tokens 0 and 1 (0.5 alone
    # is short of 0.6). At temperature 0.5 they are squared and renormalised: [0.25, 0.09, 0.04] / 0.38 =
    # [0.658, 0.237, 0.105], and token 0 alone reaches 0.6. Cut before the temperature, token 1 would stay in
    # and be drawn with probability 0.09 / 0.34 = 0.26: in 2000 draws, always some of them.
    logits = torch.tensor([0.5, 0.3, 0.2]).log().expand(2000, 3)
    torch.manual_seed(0)
    assert choose_next_token(logits, temperature=0.5, top_p=0.6).unique().tolist() == [0]
    # and the other way: at temperature 2, [0.415, 0.322, 0.263], the first two hold 0.737, short of top_p = 0.75,
    # so all three are in; untempered they hold 0.8 and token 2 would be out
    assert choose_next_token(logits, temperature=2.0, top_p=0.75).unique().tolist() == [0, 1, 2]


def test_top_p_below_the_likeliest_token_is_greedy(tmp_path, capsys):
    """A nucleus smaller than the most likely token's probability holds that token alone: sampling at
    any temperature then writes the greedy text."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="rd")
    greedy = run(sample, ["--ckpt", ckpt] + GREEDY, capsys)
    nucleus = run(sample, ["--ckpt", ckpt] + GREEDY + ["--temperature=1.5", "--top_p=1e-6"], capsys)
    assert nucleus == greedy and greedy[0] == 0
    code, _, err = run(sample, ["--ckpt", ckpt, "--top_p=1.5"], capsys)
    assert code == 2 and err.endswith("error: --top_p=1.5 (a probability mass, from 0 to 1)\n")


def test_top_k_of_one_is_greedy_at_any_temperature(tmp_path, capsys):
    """--top_k=K samples among the K most likely tokens: K = 1 at any temperature writes the greedy text."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="rd")
    greedy = run(sample, ["--ckpt", ckpt] + GREEDY, capsys)
    assert run(sample, ["--ckpt", ckpt] + GREEDY + ["--temperature=1.5", "--top_k=1"], capsys) == greedy and greedy[0] == 0
    # with two tokens to choose from, the same draws leave the greedy text (so one token more would show)
    assert run(sample, ["--ckpt", ckpt] + GREEDY + ["--temperature=1.5", "--top_k=2"], capsys) != greedy


def test_cache_and_compile_flags_give_the_same_greedy_text(tmp_path, capsys, monkeypatch):
    """--cache=False makes no key-value cache; --compile decodes with compile_decoding's step (a spy here,
    stepping eagerly: test_compiled_decoding_gives_the_same_greedy_text compiles for real)."""
    make_cache, calls = GPT.make_cache, []
    monkeypatch.setattr(GPT, "make_cache", lambda self: calls.append("make_cache") or make_cache(self))

    def compile_decoding(self):
        calls.append("compile_decoding")

        def step(idx, cache):
            calls.append("step")
            return self(idx, cache=cache)[0]
        return step
    monkeypatch.setattr(GPT, "compile_decoding", compile_decoding)
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="rd", res_blocks=2, **DLR)
    runs = {}
    for flags in ([], ["--cache=False"], ["--compile"]):
        calls.clear()
        runs[tuple(flags)] = run(sample, ["--ckpt", ckpt] + GREEDY + flags, capsys), list(calls)
    assert runs[()][0] == runs[("--cache=False",)][0] == runs[("--compile",)][0] and runs[()][0][0] == 0
    # 40 tokens after the 12 of "To be or not", block_size 32: one forward over the prompt that fills a cache,
    # 32 - 12 one-token steps (to a full cache), then the window slides (full forwards, no cache)
    assert runs[()][1] == ["make_cache"]
    assert runs[("--cache=False",)][1] == []
    assert runs[("--compile",)][1] == ["compile_decoding", "make_cache"] + ["step"] * (TINY["block_size"] - len("To be or not"))


def test_seed_makes_sampling_repeatable(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt")
    sampled = lambda seed: run(sample, ["--ckpt", ckpt, "--temperature=1", "--num_samples=1", "--max_new_tokens=30",
                                        "--start=To be", "--device=cpu", f"--seed={seed}"], capsys)
    first = sampled(5)
    assert first[0] == 0 and len(first[1]) > len("To be") + 10
    assert sampled(5) == first and sampled(6) != first


def test_compile_without_the_cache_is_a_usage_error(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt")
    code, _, err = run(sample, ["--ckpt", ckpt, "--compile", "--cache=False"], capsys)
    assert code == 2 and "--compile compiles the one-token step over the key-value cache: drop --cache=False" in err


def test_compiled_decoding_gives_the_same_greedy_text(tmp_path, capsys):
    """--compile (Inductor's one-token step over the fixed-size cache) writes the eager text."""
    torch._dynamo.reset()
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="rd", res_blocks=2)
    eager = run(sample, ["--ckpt", ckpt, "--max_new_tokens=20", "--num_samples=1"] + GREEDY, capsys)
    code, text, err = run(sample, ["--ckpt", ckpt, "--max_new_tokens=20", "--num_samples=1", "--compile"] + GREEDY, capsys)
    # (a CUDA build of torch on a machine without a GPU says so on stderr as Inductor starts: torch's notice, not ours)
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("No CUDA runtime is found"))
    assert (code, text, err) == eager and eager[0] == 0


# -----------------------------------------------------------------------------
# sample.py: decoding as tokens stream in

def test_stream_decoder_holds_back_incomplete_utf8():
    text = "héllo wörld ✓ 🤗"
    decoder = sample.StreamDecoder(get_tokenizer("bytes"))
    pieces = [decoder.push(b) for b in text.encode("utf-8")]
    assert pieces[1:3] == ["", "é"]  # 0xC3 alone is half a character
    assert "".join(pieces) + decoder.flush() == text and not any("\ufffd" in p for p in pieces)


def test_a_sample_that_ends_inside_a_character_prints_what_it_has(tmp_path, capsys, monkeypatch):
    """The bytes held back for an incomplete UTF-8 character end the sample (as U+FFFD) rather than vanish."""
    # "A", then 0xC3, the first of the two bytes of "é", and no second: the sample ends inside a character
    drawn = [torch.tensor([[65]]), torch.tensor([[0xC3]])]
    monkeypatch.setattr(GPT, "generate_tokens", lambda self, *args, **kwargs: iter(drawn))
    code, out, _ = run(sample, ["--ckpt", write_ckpt(tmp_path / "ckpt.pt"), "--start=x", "--num_samples=1",
                                "--max_new_tokens=2", "--device=cpu"], capsys)
    assert code == 0 and out == "xA\ufffd\n---------------\n"


def test_stream_decoder_gpt2(gpt2_offline):
    tok = get_tokenizer("gpt2")
    text = "Emoji 🤗 and 漢字 split across tokens"
    decoder = sample.StreamDecoder(tok)
    pieces = [decoder.push(t) for t in tok.encode(text)]
    assert "" in pieces  # some token ended inside a character
    assert "".join(pieces) + decoder.flush() == text and not any("\ufffd" in p for p in pieces)


# -----------------------------------------------------------------------------
# sample.py: --routing and errors

def test_routing_table_has_a_row_per_route(tmp_path, capsys, monkeypatch):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="rd")
    routing_table, reported = sample.routing_table, []
    monkeypatch.setattr(sample, "routing_table", lambda model, stats, n: reported.append(stats) or routing_table(model, stats, n))
    # on the CPU in float32, as the forward below that the table is checked against (auto: CUDA's bfloat16 on a GPU)
    code, out, _ = run(sample, ["--ckpt", ckpt, "--routing", "--num_samples=0", "--start=The routing of a prompt",
                                "--device=cpu"], capsys)
    assert code == 0
    model, _ = load_model(ckpt)
    model.eval()(torch.tensor([list(b"The routing of a prompt")]), collect_routing=True)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:-1]}
    assert list(rows) == model.route_names() == ["L0.attn", "L0.mlp", "L1.attn", "L1.mlp", "L0.attn.v", "L1.attn.v", "out"]
    for name, s in model.last_routing.items():
        row = rows[name]  # route, m, top, max, entropy, js, |bar|
        assert int(row[1]) == s["sources"] and float(row[3]) == pytest.approx(max(s["weights"]), abs=0.006)
        assert row[4] == (f"{s['entropy']:.2f}" if "entropy" in s else "-")
        assert row[5] == (f"{s['js_qk_v']:.2f}" if "js_qk_v" in s else "-")
        assert len(row[6]) == s["sources"] + 2
    # top and the bar, exactly, from the weights the table was made of: the top source is the argmax (here 0,
    # 1 and 2 all occur, so neither a fixed source nor the argmin passes), the ramp is scaled to the row's max,
    # so the max is "@" (here rows have max 0.58 to 1: unscaled, 0.58 would not be "@")
    rows_tops = set()
    for name, s in reported[0].items():
        w = s["weights"]
        top = max(range(len(w)), key=lambda i: w[i])
        rows_tops.add(top)
        assert rows[name][2] == str(top)
        assert rows[name][6] == "|" + "".join("_.:-=+*#%@"[round(9 * x / max(w))] for x in w) + "|"
    assert len(rows_tops) > 1 and min(max(s["weights"]) for s in reported[0].values()) < 0.9


def test_routing_of_a_standard_model(tmp_path, capsys):
    code, out, _ = run(sample, ["--ckpt", write_ckpt(tmp_path / "ckpt.pt"), "--routing", "--num_samples=0"], capsys)
    assert code == 0 and out.startswith("routing: none")


def test_init_from_gpt2_decodes_with_gpt2(capsys, monkeypatch, gpt2_offline):
    """--init_from=gpt2 loads checkpoint.load_gpt2's weights (a tiny stand-in here: no download)."""
    model = tiny_model(vocab_size=50257)
    calls = []
    monkeypatch.setattr(checkpoint, "load_gpt2", lambda *args: calls.append(args) or (model_args(model), model.state_dict()))
    code, out, _ = run(sample, ["--init_from=gpt2", "--start=Hello, world", "--temperature=0",
                                "--num_samples=1", "--max_new_tokens=8", "--device=cpu"], capsys)  # as model.generate below
    assert code == 0 and calls == [("gpt2", "cache")]
    ids = model.generate(torch.tensor([get_tokenizer("gpt2").encode("Hello, world")]), 8, temperature=0)
    assert out == get_tokenizer("gpt2").decode(ids[0].tolist()) + "\n---------------\n"


def test_missing_checkpoint_is_one_line(tmp_path, capsys):
    """The line says how to make the checkpoint it looked for: train.py writes OUT_DIR/ckpt.pt, so a --ckpt
    of another name is a path to check, not an out_dir to train into."""
    code, out, err = run(sample, ["--out_dir", tmp_path / "nowhere"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err == f"error: no checkpoint at {tmp_path / 'nowhere' / 'ckpt.pt'}: check the path, or train one first " \
                  f"(python train.py --out_dir={tmp_path / 'nowhere'} writes it)\n"
    code, out, err = run(sample, ["--ckpt", tmp_path / "nothere.pt"], capsys)
    assert code == 1 and err == f"error: no checkpoint at {tmp_path / 'nothere.pt'}: check the path, or train one " \
                                "first (python train.py --out_dir=DIR writes DIR/ckpt.pt)\n"
    run_dir = tmp_path / "run"  # a run's folder where its checkpoint file goes
    write_ckpt(run_dir / "ckpt.pt")
    code, out, err = run(sample, ["--ckpt", run_dir], capsys)
    assert code == 1 and err == f"error: {run_dir} is a folder, not a checkpoint file: pass its checkpoint, " \
                                f"{run_dir / 'ckpt.pt'}\n"


def test_weights_that_are_not_finite_are_one_line(tmp_path, capsys):
    """A checkpoint holding a nan (or inf) weight is refused as it loads, naming one such weight, at any temperature:
    not NUL bytes printed at temperature 0, nor torch.multinomial's error when sampling."""
    path = write_ckpt(tmp_path / "ckpt.pt")
    ckpt = load_checkpoint(path)
    ckpt["model"]["transformer.h.1.mlp.c_fc.weight"][3, 5] = float("inf")
    save_checkpoint(ckpt, path)
    for temperature in ("0", "1.0"):
        code, out, err = run(sample, ["--ckpt", path, f"--temperature={temperature}", "--num_samples=1",
                                      "--max_new_tokens=4"], capsys)
        assert code == 1 and out == "" and err == (
            f"error: {path} holds weights that are not finite (transformer.h.1.mlp.c_fc.weight, maybe more): the run "
            "that wrote it diverged, or the file was changed; use another checkpoint\n"), err


def test_a_checkpoint_without_its_shape_is_one_line_and_one_from_before_a_field_loads(tmp_path, capsys):
    """A checkpoint whose model_args lack a field of the model's shape is refused in one line naming it, by sample.py
    and fold.py alike: here n_head, at a width (48) that GPTConfig's default of 12 heads divides too, where it would
    load silently as another model. A field added to GPTConfig since (fixed_value_route) takes its default."""
    path = write_ckpt(tmp_path / "ckpt.pt", n_embd=48, n_head=4, **DLR)
    ckpt = load_checkpoint(path)
    del ckpt["model_args"]["fixed_value_route"]
    save_checkpoint(ckpt, path)
    code, _, err = run(sample, ["--ckpt", path, "--num_samples=1", "--max_new_tokens=2"], capsys)
    assert code == 0, err
    del ckpt["model_args"]["n_head"]
    save_checkpoint(ckpt, path)
    for script, argv in ((sample, ["--ckpt", path, "--num_samples=1", "--max_new_tokens=2"]),
                         (fold, ["--ckpt", path, "--out", tmp_path / "folded.pt"])):
        code, out, err = run(script, argv, capsys)
        assert code == 1 and out == "" and err == (
            f"error: {path} has no n_head in its model_args: the model's shape, which no default can stand for; use a "
            "checkpoint written by train.py, fold.py or nanoGPT (or add the value to its model_args)\n"), (script.__name__, err)


def test_unknown_tokenizer_is_one_line(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tokenizer="klingon")
    code, _, err = run(sample, ["--ckpt", ckpt], capsys)
    assert code == 1 and err.startswith("error: unknown tokenizer 'klingon'") and err.count("\n") == 1


def test_bad_options_and_prompt_files_are_one_line(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt")
    for option, problem in (("--temperature=nan", "--temperature=nan (0 for greedy, more to sample)"),
                            ("--temperature=inf", "--temperature=inf (0 for greedy, more to sample)"),
                            ("--top_k=-3", "--top_k=-3 (a count of tokens, 0 for all)"),
                            ("--num_samples=-1", "--num_samples and --max_new_tokens must be 0 or more")):
        code, _, err = run(sample, ["--ckpt", ckpt, option], capsys)
        assert code == 2 and err.endswith(f"error: {problem}\n"), option
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    code, _, err = run(sample, ["--ckpt", ckpt, f"--start=FILE:{tmp_path / 'latin1.txt'}"], capsys)
    assert code == 1 and err == f"error: the prompt file {tmp_path / 'latin1.txt'} is not UTF-8 text: save it as UTF-8\n"
    latin1_argv = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python's argv holds a Latin-1 terminal's bytes
    code, _, err = run(sample, ["--ckpt", ckpt, f"--start={latin1_argv}"], capsys)
    assert code == 1 and err == ("error: --start is not UTF-8 text (a terminal in another encoding?): set a UTF-8 "
                                 "locale, or save the prompt as UTF-8 and pass --start=FILE:path\n")
    # the bytes tokenizer has no end-of-text token to start an empty prompt with
    assert run(sample, ["--ckpt", ckpt, "--start="], capsys) == (1, "", "error: the prompt is empty; give some text with --start\n")
    code, _, err = run(fold, ["--ckpt", ckpt, "--out", tmp_path / "folded.pt", "--check_batch=0"], capsys)
    assert code == 2 and "--check_batch is the number of sequences the fold is checked on: at least 1" in err
    # a seed past 64 bits was torch's traceback (fold's after the model had loaded)
    for script, args in ((sample, ["--seed=18446744073709551616"]), (fold, ["--out", tmp_path / "folded.pt", "--seed=-1"])):
        code, _, err = run(script, ["--ckpt", ckpt, *args], capsys)
        assert code == 2 and f"--seed must be from 0 to {2**63 - 1}" in err and "Traceback" not in err, err
    code, _, err = run(sample, ["--ckpt", ckpt, "--temperature=1e-40", "--num_samples=1", "--max_new_tokens=3"], capsys)
    assert code == 0, err  # (at that temperature the greedy draw: test_model's test_a_tiny_temperature_draws...)


def test_a_reader_that_stops_early_stops_sampling_quietly(tmp_path):
    """python sample.py | head: once head has its lines, the next print finds the pipe closed; sample.py then
    stops without a BrokenPipeError traceback."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt")
    proc = subprocess.Popen([sys.executable, str(Path(sample.__file__)), f"--ckpt={ckpt}", "--num_samples=1000",
                             "--max_new_tokens=20", "--device=cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout.read(100)  # what head reads, then it exits
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b""


def test_an_empty_prompt_starts_a_new_document(gpt2_offline):
    """An empty --start is GPT-2's <|endoftext|> (50256), which begins every training document; bytes have none: refused."""
    assert sample.read_prompt("", get_tokenizer("gpt2"), 32) == [50256]
    with pytest.raises(ValueError, match="the prompt is empty"):
        sample.read_prompt("", get_tokenizer("bytes"), 32)


def test_long_prompt_is_cropped_with_a_note(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="delta")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("".join(chr(ord("a") + i % 26) for i in range(50)))  # 50 bytes, block_size 32
    code, out, err = run(sample, ["--ckpt", ckpt, f"--start=FILE:{prompt}", "--num_samples=1",
                                  "--max_new_tokens=5", "--temperature=0"], capsys)
    assert code == 0 and "note: the prompt has 50 tokens, more than block_size=32; using its last 32" in err
    assert out.startswith(prompt.read_text()[-32:]) and not out.startswith(prompt.read_text()[-33:])
    prompt.write_text(prompt.read_text()[:32])  # exactly block_size tokens: all of them, no note
    code, out, err = run(sample, ["--ckpt", ckpt, f"--start=FILE:{prompt}", "--num_samples=1",
                                  "--max_new_tokens=5", "--temperature=0"], capsys)
    assert (code, err) == (0, "") and out.startswith(prompt.read_text())


# -----------------------------------------------------------------------------
# both scripts as commands

def test_fold_then_sample_commands(tmp_path):
    ckpt = write_ckpt(tmp_path / "ckpt.pt", residual="attnres", res_blocks=2, **DLR)
    env = dict(os.environ, OMP_NUM_THREADS="1")  # as the one_thread fixture
    cmd = lambda *args: subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env,
                                       capture_output=True, text=True, timeout=120)
    folded = cmd("fold.py", f"--ckpt={ckpt}", f"--out={tmp_path / 'folded.pt'}")
    assert folded.returncode == 0, folded.stderr
    assert load_checkpoint(tmp_path / "folded.pt")["model_args"]["dlr"] is False
    sampled = cmd("sample.py", f"--ckpt={tmp_path / 'folded.pt'}", "--routing", *GREEDY)
    assert sampled.returncode == 0, sampled.stderr
    assert "L3" not in sampled.stdout and "\nout " in sampled.stdout and "To be or not" in sampled.stdout
