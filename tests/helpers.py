"""Small helpers shared by the test files."""

import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from model import GPTConfig


def takes_ctrl_c():
    """preexec_fn for a child the test sends SIGINT: the test run itself may be a shell's background job, which
    starts with SIGINT ignored, and a child inherits that (Python then raises no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def folder_locked_by_another_process(folder):
    """Within it, another process holds folder's lock (common.lock_folder), as a running train.py holds its
    out_dir; it ends that process, which releases the lock."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, common; print(common.lock_folder(sys.argv[1]), "
                               "flush=True); sys.stdin.read()", str(folder)], cwd=Path(__file__).resolve().parents[1],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "True\n"
        yield
    finally:
        holder.communicate("")


def tiny_config(**overrides):
    """A model small enough for a test: 3 layers (6 sublayers: res_blocks 2, 3 and 6 all divide), 32 wide."""
    cfg = dict(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=32, dropout=0.0, bias=True)
    cfg.update(overrides)
    return GPTConfig(**cfg)


@torch.no_grad()
def perturb_norms_and_biases(model):
    """Make a fresh model's weights non-trivial: random LayerNorm gains and biases, random biases,
    so that equivalences cannot hold by accident."""
    for name, p in model.named_parameters():
        if "ln" in name:
            p.add_(0.3 * torch.randn_like(p))
        if name.endswith(".bias"):
            p.add_(0.1 * torch.randn_like(p))
    return model


@torch.no_grad()
def randomise_queries(model, seed=1, scale=2.0):
    """Random pseudo-queries (N(0, scale^2), from their own generator): routes that really choose."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "res_query" in name:
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# lm-evaluation-harness tasks in its custom-task format (a YAML over a JSONL file, found with --include_path),
# one per kind of request; texts, contexts and prompts longer than a tiny model's block_size=32 bytes among them
DOCS = {
    "tiny_choice": [
        {"question": "The capital of France is", "choices": ["Paris", "a fish", "blue"], "answer": 0},
        {"question": "Water freezes at zero degrees Celsius, and it boils at one hundred degrees", "choices":
         ["Celsius.", "Fahrenheit, on Mars, in a vacuum, on Tuesdays.", "loudly"], "answer": 0},
        {"question": "2 + 2 =", "choices": ["4", "5", "22"], "answer": 0},
        {"question": "def f(x):\n    return x * 2\n\nprint(f(21)) prints", "choices": ["42", "21", "x"], "answer": 0},
    ],
    "tiny_rolling": [{"text": "Hello, world."},
                     {"text": "The quick brown fox jumps over the lazy dog. " * 3},
                     {"text": "Python's documentation is the corpus these tiny models learn from."}],
    "tiny_gen": [{"prompt": "Q: 1 + 1\nA:", "answer": " 2"},
                 {"prompt": "A long prompt, longer than the block size of the tiny model: Q: say hi\nA:", "answer": " hi"}],
}
TASK_YAML = {
    "tiny_choice": 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
                   'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n',
    "tiny_rolling": 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
                    '  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n',
    "tiny_gen": 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
                'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 8\nmetric_list:\n  - metric: exact_match\n',
}


def write_tasks(folder):
    """DOCS as harness tasks in folder (read offline: the datasets library's json loader), and tiny_hub,
    a task whose dataset is on the Hugging Face hub, for the no-network error. Returns folder."""
    for name, docs in DOCS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                             f"    test: {data}\ntest_split: test\n" + TASK_YAML[name])
    (folder / "tiny_hub.yaml").write_text("task: tiny_hub\ndataset_path: nanoattnres-test/not-here\ntest_split: test\n"
                                          + TASK_YAML["tiny_choice"])
    return folder
