"""
The papers' protocols (config/*_fineweb_edu_*.py; README, "Reproducing the papers"): each config is
read by train.py's configurator, its model has the stated size (built on the meta device: no memory),
its iterations make the stated token budget on 1 GPU and under torchrun on 8, its compare.py command
pairs the runs as the paper does, and, shrunk, it trains end to end on a CPU.
"""

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import compare
import configurator
from model import GPT, GPTConfig
from test_train import events, make_dataset, train

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "train.py"
GPT2_VOCAB = 50304  # FineWeb-Edu's GPT-2 tokens (50257), rounded up to a multiple of 64 as train.py does
# per config: the paper's size, the size stated in the README (all parameters, embeddings included),
# the token budget, and what compare.py pairs
PROTOCOLS = {
    "rd_fineweb_edu_120m": dict(paper=120e6, params_m=124.5, tokens=2_000_158_720, pair=("rd/res_blocks=8", "attnres/res_blocks=8")),
    "rd_fineweb_edu_343m": dict(paper=343e6, params_m=354.9, tokens=2_000_158_720, pair=("rd/res_blocks=8", "attnres/res_blocks=8")),
    "delta_fineweb_edu_220m": dict(paper=220e6, params_m=228.9, tokens=4_587_520_000,
                                   pair=("delta/res_blocks=0", "attnres/res_blocks=0")),
    "dlr_fineweb_edu_130m": dict(paper=130e6, params_m=124.5, tokens=2_490_368_000, pair=("dlr/rank=192", "lowrank/rank=192")),
}


def settings(name, *overrides):
    return configurator.configure(configurator.script_defaults(TRAIN), [str(REPO / "config" / f"{name}.py"), *overrides],
                                  str(TRAIN))[0]


def meta_model(config, **overrides):
    """The config's model on the meta device: its parameter count without allocating a byte."""
    args = {f.name: config[f.name] for f in fields(GPTConfig)}
    with torch.device("meta"):
        return GPT(GPTConfig.from_dict({**args, "vocab_size": GPT2_VOCAB, **overrides}))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_protocol_model_size_and_token_budget(name):
    """The stated size (within 10% of the paper's), the stated budget in tokens, one GPU's batch that
    torchrun on 8 GPUs keeps, and the learning rate decaying over the whole run."""
    config, protocol = settings(name), PROTOCOLS[name]
    assert config["dataset"] == "finewebedu10B" and config["block_size"] == 1024 and config["vocab_size"] == 0
    dense = meta_model(config, lowrank_rank=0, dlr=False).get_num_params(non_embedding=False)
    assert round(dense / 1e6, 1) == protocol["params_m"]
    assert abs(dense - protocol["paper"]) <= 0.1 * protocol["paper"]
    tokens_per_iter = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
    assert config["max_iters"] * tokens_per_iter == protocol["tokens"]
    assert tokens_per_iter == 2 ** 19 and config["gradient_accumulation_steps"] % 8 == 0  # ~0.5M, on 1 or 8 GPUs
    assert config["lr_decay_iters"] == config["max_iters"] and config["warmup_iters"] < config["max_iters"] // 10
    if name.startswith("delta"):
        assert protocol["tokens"] >= 20 * dense  # Chinchilla's tokens per parameter
    if name.startswith("dlr"):  # rank n_embd / 4; DLR adds no parameter
        assert config["lowrank_rank"] == config["n_embd"] // 4 and config["dlr"]
        assert round(meta_model(config).get_num_params(non_embedding=False) / 1e6, 1) == 67.9


@pytest.mark.parametrize("name", PROTOCOLS)
def test_protocol_compare_command_pairs_runs_as_the_paper(name):
    """The `Run:` line of the config's header: compare.py reads it, and pairs the run with its parent."""
    header = (REPO / "config" / f"{name}.py").read_text()
    argv = re.search(r"# Run: +python compare.py (.*)", header).group(1).split()
    config, options, passthrough = compare.parse_args(argv)
    assert config == f"config/{name}.py" and not passthrough
    run, parent = PROTOCOLS[name]["pair"]
    names = compare.select_runs(options["runs"])
    assert compare.references(run, names) == ["standard", parent]
    assert options["seeds"] == (5 if name.startswith("rd") else 3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("syn"))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_protocol_config_trains_on_a_cpu_when_shrunk(name, data, tmp_path):
    """The config as it is but for the model's size, the iterations, the data and the device."""
    shrink = ["--n_layer=4", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=2", "--max_iters=2",
              "--eval_interval=2", "--eval_iters=1", "--log_interval=1", "--compile=False", "--device=cpu",
              f"--dataset={data}", f"--out_dir={tmp_path}"] + (["--lowrank_rank=8"] if name.startswith("dlr") else [])
    train(REPO / "config" / f"{name}.py", *shrink, cwd=tmp_path)
    start = events(tmp_path, "start")[0]["config"]
    assert start["gradient_accumulation_steps"] == settings(name)["gradient_accumulation_steps"]
    assert start["residual"] == settings(name)["residual"] and start["dtype"] == "float32"
    assert [e["iter"] for e in events(tmp_path, "eval")] == [0, 2]
