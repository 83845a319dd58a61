"""
GPT-2 import (checkpoint.load_gpt2, train.py --init_from=gpt2) checked against Hugging Face
transformers' own GPT-2, on a tiny random model whose model.safetensors is served from 127.0.0.1.

Two notes on tolerances:
- transformers' GPT-2 uses the tanh approximation of GELU ("gelu_new"), model.py the exact GELU (as
  nanoGPT does). The tiny model here is built with activation_function="gelu" so that the two
  compute the same function and logits agree to float32 rounding (1e-5).
- Conversion into a routed mode keeps the function "up to the LayerNorm eps" (README, "Exact
  equivalences" 1). A random tiny GPT-2's stream has std ~0.03, where eps = 1e-5 is not negligible,
  so the conversion checks either set eps to 0 (in process) or give the stream GPT-2's size (std ~1,
  by scaling the position embedding) for the command-line run.
"""

import sys
from pathlib import Path

import pytest
import torch

import download as download_module
from checkpoint import download_gpt2, gpt2_state_dict, load_gpt2, load_state_into
from download import DownloadError
from localserver import LocalServer
from model import GPT, GPTConfig
from test_train import TINY, events, make_dataset, train

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HUB_PATH = "/openai-community/gpt2/resolve/main/model.safetensors"
SHAPE = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=32)


def tiny_hf_gpt2(wpe_scale=1.0):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                     activation_function="gelu", bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so that a misplaced one shows
        for name, p in hf.named_parameters():
            if "ln" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
        hf.transformer.wpe.weight.mul_(wpe_scale)
    return hf


def hub_file(hf, path):
    """model.safetensors as the hub stores GPT-2: GPT2Model's names (no 'transformer.' prefix), no
    lm_head (it is tied), and the causal-mask buffers attn.bias."""
    tensors = {k.removeprefix("transformer."): v.contiguous().clone()
               for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for layer in range(hf.config.n_layer):
        tensors[f"h.{layer}.attn.bias"] = torch.ones(32, 32).tril().view(1, 1, 32, 32)
    save_file(tensors, str(path))
    return path


def imported(state, **overrides):
    model = GPT(GPTConfig(**{**SHAPE, "bias": True, **overrides}))
    load_state_into(model, state)
    return model.eval()


def test_gpt2_import_matches_transformers(tmp_path, monkeypatch):
    hf = tiny_hf_gpt2()
    with LocalServer({HUB_PATH: hub_file(hf, tmp_path / "model.safetensors")}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model_args, state = load_gpt2("gpt2", tmp_path / "cache")
        load_gpt2("gpt2", tmp_path / "cache")  # the second time from the cache
        assert server.count(HUB_PATH) == 1
    assert model_args == dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024, bias=True,
                              dropout=0.0, residual="standard")
    assert not any(k.endswith(".attn.bias") for k in state)
    model = imported(state)
    idx = torch.randint(0, 64, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx, targets=idx)  # with targets: the logits of every position
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max() < 1e-5


def test_gpt2_converts_into_every_mode_with_the_same_function(tmp_path):
    state = gpt2_state_dict(hub_file(tiny_hf_gpt2(), tmp_path / "model.safetensors"))
    idx = torch.randint(0, 64, (3, 32), generator=torch.Generator().manual_seed(1))
    logits = {}
    for mode in ("standard", "delta", "attnres", "rd", "delta/4", "attnres/2"):
        residual, _, blocks = mode.partition("/")
        model = imported(state, residual=residual, res_blocks=int(blocks or 0))
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = 0.0  # see the module docstring
        with torch.no_grad():
            logits[mode] = model(idx, targets=idx)[0]
    for mode, value in logits.items():
        assert (value - logits["standard"]).abs().max() < 1e-5, mode


def test_train_init_from_gpt2_converts_and_fine_tunes(tmp_path):
    """python train.py --init_from=gpt2 --residual=delta: downloaded (here from 127.0.0.1 via
    HF_ENDPOINT), cached, converted with its step-0 loss unchanged, then trained."""
    data = make_dataset(tmp_path / "data", tokenizer="gpt2")
    shape = [f"--{k}={v}" for k, v in SHAPE.items()]  # a real name maps to a fixed shape: override it
    common = [*TINY, *shape, f"--dataset={data}", "--init_from=gpt2", f"--cache_dir={tmp_path / 'cache'}"]
    hf = tiny_hf_gpt2(wpe_scale=50.0)
    with LocalServer({HUB_PATH: hub_file(hf, tmp_path / "model.safetensors")}) as server:
        env = {"HF_ENDPOINT": server.url}
        train(*common, f"--out_dir={tmp_path / 'standard'}", "--residual=standard", "--max_iters=0", cwd=tmp_path, env=env)
        result = train(*common, f"--out_dir={tmp_path / 'delta'}", "--residual=delta", "--max_iters=4",
                       "--eval_interval=4", cwd=tmp_path, env=env)
        assert server.count(HUB_PATH) == 1
    assert "converted gpt2 into delta" in result.stdout
    standard, delta = events(tmp_path / "standard", "eval"), events(tmp_path / "delta", "eval")
    assert delta[0]["val_loss"] == pytest.approx(standard[0]["val_loss"], abs=1e-5)
    ckpt = torch.load(tmp_path / "delta" / "ckpt.pt", weights_only=True)  # fine-tuned for 4 iterations
    assert ckpt["iter_num"] == 4 and ckpt["model_args"]["residual"] == "delta" and len(events(tmp_path / "delta", "train")) == 4


def test_a_failed_gpt2_download_names_the_mirror_setting_of_every_entry_point(tmp_path, monkeypatch):
    """GPT-2's weights reach train.py, sample.py and eval.py, none of which has prepare.py's --url: a
    failed download says how to use a mirror there (HF_ENDPOINT), in one line."""
    with LocalServer({}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(DownloadError) as refused:
            load_gpt2("gpt2", cache_dir=tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", server.url)  # shut now: nobody answers
    monkeypatch.setattr(download_module.time, "sleep", lambda s: None)
    with pytest.raises(DownloadError) as unreachable:
        load_gpt2("gpt2", cache_dir=tmp_path)
    for e in (refused, unreachable):
        message = str(e.value)
        assert message.endswith("set HF_ENDPOINT to a mirror") and "--url" not in message and "\n" not in message


def test_torchrun_downloads_gpt2_once(tmp_path):
    """Under torchrun every rank used to download GPT-2 into the same .part file at once. Now one rank
    per node downloads (here: one node, 2 gloo ranks), the others wait for it, then all load the file."""
    data = make_dataset(tmp_path / "data", tokenizer="gpt2")
    shape = [f"--{k}={v}" for k, v in SHAPE.items()]
    hf = tiny_hf_gpt2(wpe_scale=50.0)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"))
    with LocalServer({HUB_PATH: hub_file(hf, tmp_path / "model.safetensors")}) as server:
        train(*TINY, *shape, f"--dataset={data}", "--init_from=gpt2", f"--cache_dir={tmp_path / 'cache'}",
              f"--out_dir={tmp_path / 'out'}", "--residual=delta", "--max_iters=2", "--eval_interval=2",
              "--gradient_accumulation_steps=2", command=torchrun, cwd=tmp_path, env={"HF_ENDPOINT": server.url})
        assert server.count(HUB_PATH) == 1
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["gpt2.safetensors"]  # no .part left behind
    assert events(tmp_path / "out", "done")[0]["iter"] == 2


def test_download_gpt2_takes_the_url_given_over_the_hub(tmp_path, monkeypatch):
    """download_gpt2(name, url=...) fetches that file into cache_dir/<name>.safetensors, not the hub's; an
    unknown name is refused before any download."""
    with LocalServer({"/mirror/gpt2.safetensors": b"weights", HUB_PATH: b"hub"}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        path = download_gpt2("gpt2", tmp_path, url=server.url + "/mirror/gpt2.safetensors")
        assert path == tmp_path / "gpt2.safetensors" and path.read_bytes() == b"weights"
        assert server.count("/mirror/gpt2.safetensors") == 1 and server.count(HUB_PATH) == 0
        with pytest.raises(ValueError, match="unknown GPT-2 model 'gpt3': choose one of gpt2, gpt2-medium"):
            download_gpt2("gpt3", tmp_path)
        assert len(server.requests) == 1
