"""
eval.py: a checkpoint scored by lm-evaluation-harness through HarnessLM, offline.

The tasks are the harness's own custom-task format (a YAML per task over a JSONL file, found with
--include_path), written here into a temporary folder: nothing is downloaded. The models are tiny, with
random LayerNorms, biases and pseudo-queries, so that a misplaced position, window or route shows.

Tolerance. The reference scores run one sequence per forward; HarnessLM runs windows in padded batches.
Other batch shapes make float32 matmuls sum in another order, which moves each token's log-prob by
float32 rounding (~1e-7 relative); a score sums up to 75 of them, up to ~180 nats here, so it may move
by ~1e-5. Measured: at most 1.8e-5 over these requests, every model and batch sizes 1 to 64. We allow
1e-4 absolute. The same window in the same batch is bitwise the same, and is tested so.
"""

import dataclasses
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="eval.py runs lm-evaluation-harness: pip install lm-eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

import eval as evaluate  # noqa: E402  (as `evaluate`: `eval` is a builtin)
import fold  # noqa: E402
from checkpoint import model_args, save_checkpoint  # noqa: E402
from helpers import DOCS, perturb_norms_and_biases, randomise_queries, write_tasks  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from shards import Tokenizer, get_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = dict(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
MODELS = {"standard": dict(residual="standard"), "rd": dict(residual="rd"),
          "folded_dlr": dict(residual="delta", lowrank_rank=8, dlr=True, dlr_alpha=1.3)}
TOL = 1e-4  # see the module docstring
# one character per byte and back (bytes decoded as UTF-8 turn most of a random model's output into U+FFFD):
# generated text compares token for token
LATIN1 = Tokenizer("latin1", 256, None, encode=lambda text: list(text.encode("latin-1")),
                   decode=lambda ids: bytes(ids).decode("latin-1"))

@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The local tasks of helpers.write_tasks, in a folder for --include_path."""
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """The datasets library's cache in tmp_path: the tests leave nothing in the user's."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


def tiny_model(kind, seed=0, **overrides):
    """A tiny GPT with non-trivial weights; folded_dlr is a DLR model with its DLR folded into B."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **MODELS[kind], **overrides}))
    model = randomise_queries(perturb_norms_and_biases(model), seed=seed).eval()
    if kind == "folded_dlr":
        model.fold_dlr()
    return model


def lively_model(kind, seed=0, **overrides):
    """tiny_model with its matrices 20 times larger: at N(0, 0.02) a tiny model's greedy output is one token
    repeated whatever the prompt, so a prompt cut at the wrong end would not show; this one's depends on it."""
    model = tiny_model(kind, seed, **overrides)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() >= 2:
                weight.mul_(20)
    return model


def write_ckpt(path, model, tokenizer="bytes", **extra):
    save_checkpoint({"model": model.state_dict(), "model_args": model_args(model), "iter_num": 5,
                     "config": {}, "dataset_meta": {"tokenizer": tokenizer}, **extra}, path)
    return path


def harness_lm(model, tokenizer="bytes", batch_size=4, dtype="float32"):
    """HarnessLM on the CPU; tokenizer a name or a Tokenizer."""
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    return evaluate.HarnessLM(model, tok, "cpu", dtype, batch_size)


@torch.no_grad()
def direct(model, context, continuation, vocab=256):
    """log p(continuation | context) and whether it is the greedy one, from GPT.forward on one sequence:
    context and continuation as one input, its beginning cut so that it fits the model. A continuation
    longer than block_size goes in block_size pieces, each after all that precedes it."""
    block_size = model.config.block_size
    if len(continuation) > block_size:
        head = direct(model, context, continuation[:block_size], vocab)
        rest = direct(model, context + continuation[:block_size], continuation[block_size:], vocab)
        return head[0] + rest[0], head[1] and rest[1]
    tokens = (context + continuation)[-(block_size + 1):]
    logits, _ = model(torch.tensor([tokens[:-1]]), targets=torch.tensor([tokens[1:]]))
    logp = logits[0, -len(continuation):, :vocab].log_softmax(dim=-1)
    target = torch.tensor(continuation)
    return logp.gather(1, target[:, None]).sum().item(), bool((logp.argmax(dim=-1) == target).all())


@torch.no_grad()
def greedy_continuation(model, context, n, vocab=None):
    """The n tokens that greedy decoding gives after context (context and them within block_size), among
    the first vocab ids (all by default)."""
    tokens = list(context)
    for _ in range(n):
        logits, _ = model(torch.tensor([tokens]))
        tokens.append(logits[0, -1, :vocab].argmax().item())
    return tokens[len(context):]


def assert_same_scores(got, want):
    """Lists of (log-prob, greedy) pairs: log-probs within TOL (see the module docstring), greedy flags equal.
    Not pytest.approx on the pairs themselves: on a list of tuples it falls back to plain ==, no tolerance."""
    assert [greedy for _, greedy in got] == [greedy for _, greedy in want]
    assert [logprob for logprob, _ in got] == pytest.approx([logprob for logprob, _ in want], abs=TOL)


def direct_rolling(model, tokens, prefix, vocab=256):
    """log p(text) over the harness's own rolling windows (as its Hugging Face models make them)."""
    windows = map(make_disjoint_window, get_rolling_token_windows(tokens, prefix, model.config.block_size, 1))
    return sum(direct(model, context, piece, vocab)[0] for context, piece in windows)


def requests(seed=0, n=12):
    """(context, continuation) token pairs of mixed lengths: contexts from 1 to 3 x block_size tokens."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda high: int(torch.randint(1, high, (1,), generator=g))
    tokens = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()
    lengths = [(1, 1), (5, 3), (31, 1), (32, 32), (40, 6), (96, 10)] + [(draw(70), draw(20)) for _ in range(n - 6)]
    return [(tokens(c), tokens(k)) for c, k in lengths]


def run_main(argv, capsys):
    """(exit code, stdout, stderr, eval.py's record) of eval.main(argv)."""
    try:
        record, code = evaluate.main([str(a) for a in argv]), 0
    except SystemExit as e:
        record, code = None, e.code
    out, err = capsys.readouterr()
    return code, out, err, record


# -----------------------------------------------------------------------------
# the wrapper's scores are the model's

@pytest.mark.parametrize("kind", list(MODELS))
def test_loglikelihoods_equal_a_direct_forward(kind):
    """For a standard, a routed (rd, random pseudo-queries) and a folded-DLR model, HarnessLM's
    log-likelihoods and greedy flags are GPT.forward's, contexts longer than block_size included."""
    model = tiny_model(kind)
    pairs = requests()
    scores = harness_lm(model).score(pairs)
    for (context, continuation), (logprob, greedy) in zip(pairs, scores):
        want, want_greedy = direct(model, context, continuation)
        assert logprob == pytest.approx(want, abs=TOL) and greedy == want_greedy
    # a greedy continuation is one: the model's own argmax tokens
    assert harness_lm(model).score([([1, 2, 3], greedy_continuation(model, [1, 2, 3], 4))])[0][1] is True


@pytest.mark.parametrize("kind", ["standard", "rd"])
def test_rolling_loglikelihood_is_the_harness_windows(kind):
    """loglikelihood_rolling of a text (from requests as the harness sends them) equals the sum of
    GPT.forward's log-probs over the harness's own rolling block_size windows, for texts from 1 to 3.5 windows."""
    model = tiny_model(kind)
    texts = ["a", "Hello, world.", "x" * 32, "The quick brown fox jumps over the lazy dog. " * 2 + "!" * 23]
    lm = harness_lm(model)
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)],
                                   disable_tqdm=True)
    for text, logprob in zip(texts, got):
        assert logprob == pytest.approx(direct_rolling(model, list(text.encode()), ord("\n")), abs=TOL)


def test_text_requests_with_the_gpt2_tokenizer(gpt2_offline):
    """Text requests through the harness's own tokenization (TemplateLM: context and continuation encoded
    together, the context's trailing space moved to the continuation; an empty context reads <|endoftext|>)
    score as GPT.forward does on the same GPT-2 tokens."""
    tok = get_tokenizer("gpt2")
    model = tiny_model("rd", vocab_size=50304)
    pairs = [("The capital of France is", " Paris"), ("Question: what is 2 + 2? Answer: ", "4"), ("", "Hello"),
             (" ".join(["word"] * 40), " end")]  # 40 words: more than block_size=32 tokens of context
    got = harness_lm(model, "gpt2").loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)],
                                                  disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        if context:
            context, continuation = context.rstrip(" "), context[len(context.rstrip(" ")):] + continuation
            whole, head = tok.encode(context + continuation), tok.encode(context)
            ids = (head, whole[len(head):])
        else:
            ids = ([tok.eot], tok.encode(continuation))
        assert (logprob, greedy) == pytest.approx(direct(model, *ids, vocab=tok.vocab_size), abs=TOL)


def test_a_context_of_spaces_reads_the_prefix_token():
    """The harness moves a context's trailing spaces into the continuation, so a context of spaces alone
    reaches the model empty: it reads the prefix token, as an empty context does, in any batch size."""
    model = tiny_model("rd")
    pair = Instance("loglikelihood", {}, (" ", " abc"), 0)
    want = direct(model, list(b"\n"), list(b"  abc"))
    for batch_size in (1, 4):
        got = harness_lm(model, batch_size=batch_size).loglikelihood([pair], disable_tqdm=True)
        assert got[0] == pytest.approx(want, abs=TOL)
    with pytest.raises(ValueError, match="at least one token"):
        evaluate.score_windows([], [1, 2], 32)


def test_batching_and_sorting_change_no_score():
    """The same requests in batches of 1, 3 and 64, and in reverse order: the same scores (within TOL) and
    greedy flags, each in its request's place."""
    model = tiny_model("rd")
    pairs = requests(seed=1, n=20)
    pairs += [(context[-20:], greedy_continuation(model, context[-20:], 5)) for context, _ in pairs[4:6]]
    one = harness_lm(model, batch_size=1).score(pairs)
    assert [greedy for _, greedy in one] == [False] * 20 + [True] * 2  # both flags, to be kept in place
    logprobs = sorted(logprob for logprob, _ in one)
    assert min(b - a for a, b in zip(logprobs, logprobs[1:])) > 2 * TOL  # a score out of its place shows
    for batch_size in (3, 64):
        assert_same_scores(harness_lm(model, batch_size=batch_size).score(pairs), one)
    assert_same_scores(harness_lm(model, batch_size=3).score(pairs[::-1]), one[::-1])


def test_long_contexts_lose_their_beginning_and_long_continuations_go_in_pieces():
    """A context longer than block_size scores as its last tokens alone (the ones that fit beside the
    continuation); a continuation longer than block_size scores as its block_size pieces, each after what
    precedes it, cut the same way; it is greedy only where every piece is."""
    model = tiny_model("rd")
    lm = harness_lm(model, batch_size=1)
    g = torch.Generator().manual_seed(2)
    context, continuation = torch.randint(0, 256, (100,), generator=g).tolist(), torch.randint(0, 256, (5,), generator=g).tolist()
    fits = context[-(32 + 1 - 5):]
    assert lm.score([(context, continuation)]) == lm.score([(fits, continuation)])  # bitwise: the same forward
    assert lm.score([(context, continuation)])[0][0] != lm.score([(context[-10:], continuation)])[0][0]
    long = torch.randint(0, 256, (75,), generator=g).tolist()  # 32 + 32 + 11 tokens
    assert lm.score([(context, long)])[0][0] == pytest.approx(direct(model, context, long)[0], abs=TOL)
    # the layout: context [1], continuation 2..69 -> pieces 2..33, 34..65, 66..69, each after the tokens before it
    assert evaluate.score_windows([1], list(range(2, 70)), 32) == [
        (list(range(1, 33)), list(range(2, 34)), 32), (list(range(33, 65)), list(range(34, 66)), 32),
        (list(range(37, 69)), list(range(38, 70)), 4)]
    # 33 tokens after [7]: a piece of 32, then one token read after the 32 before it (both windows 32 long)
    greedy = greedy_continuation(model, [7], 32)
    wrong_first = [(greedy[0] + 1) % 256] + greedy[1:]  # a miss in the first piece only
    pairs = [([7], greedy + greedy_continuation(model, greedy, 1)), ([7], wrong_first + greedy_continuation(model, wrong_first, 1))]
    for batch_size in (1, 4):  # the pieces in batches of their own, and in one batch
        got = harness_lm(model, batch_size=batch_size).score(pairs)
        assert [flag for _, flag in got] == [True, False]
        assert_same_scores(got, [direct(model, *pair) for pair in pairs])


def test_generation_is_greedy_with_the_cache_and_stops(monkeypatch):
    """generate_until: the model's greedy tokens (as generate without the key-value cache makes them),
    cut at the first stop sequence (a list, a string or a tuple of them, in any order; an empty one stops
    nothing), drawing no token past it; at most max_gen_toks tokens (or max_new_tokens, a name the harness
    also reads). A long prompt keeps its last block_size - max_gen_toks tokens, as the harness's Hugging
    Face model cuts it, but at least half the window: with the 256-token default at block_size 32, 16 (the
    window then slides). An empty prompt reads the prefix token."""
    model = lively_model("rd")
    lm = harness_lm(model, LATIN1)
    prompt = "A prompt longer than the block size of this tiny model: Q: hi\nA:"
    ids = LATIN1.encode(prompt)

    def greedy(kept, n):
        return LATIN1.decode(model.generate(torch.tensor([kept]), n, temperature=0, use_cache=False)[0, len(kept):].tolist())

    drawn = []
    generate_tokens = model.generate_tokens

    def counted(*args, **kwargs):
        for token in generate_tokens(*args, **kwargs):
            drawn.append(token.item())
            yield token
    monkeypatch.setattr(model, "generate_tokens", counted)

    text = greedy(ids[-(32 - 12):], 12)  # room for the 12 new tokens in the window
    assert text != greedy(ids[:32 - 12], 12)  # (the end of the prompt kept shows)
    assert lm.generate(prompt, {"max_gen_toks": 12}) == lm.generate(prompt, {"max_new_tokens": 12}) == text
    stop = text[5:7]
    assert text.index(stop) == 5
    drawn.clear()
    got = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": until, "max_gen_toks": 12}), i)
                             for i, until in enumerate(([stop, "never"], (stop,), ["never", "", stop]))], disable_tqdm=True)
    assert got == [text[:5]] * 3 and len(drawn) == 3 * 7  # each stops drawing at its stop's last token
    text = greedy(ids[-16:], 40)  # the default limit: half the window for the prompt
    assert text != greedy(ids[-17:], 40)
    stop = text[30:32]
    assert lm.generate(prompt, {"until": stop}) == text[:text.index(stop)]
    assert lm.generate("", {"max_gen_toks": 6}) == greedy(list(b"\n"), 6)


def test_generation_stops_at_the_end_of_text_token():
    """The tokenizer's end-of-text token ends a generation, and is no part of its text."""
    model = lively_model("rd")
    prompt = "A prompt longer than the block size of this tiny model: Q: hi\nA:"
    kept = LATIN1.encode(prompt)[-(32 - 12):]
    tokens = model.generate(torch.tensor([kept]), 12, temperature=0, use_cache=False)[0, len(kept):].tolist()
    eot = tokens[4]
    assert eot not in tokens[:4]
    lm = harness_lm(model, dataclasses.replace(LATIN1, eot=eot))
    assert lm.generate(prompt, {"max_gen_toks": 12}) == LATIN1.decode(tokens[:4])


def test_ids_past_the_tokenizer_are_never_scored_or_generated():
    """A vocabulary padded past the tokenizer's (320 ids over 256 bytes, as GPT-2's 50304 over 50257) whose
    padded ids win every argmax here: the log-softmax, the greedy flags and generation leave them out."""
    model = lively_model("rd", vocab_size=320)
    with torch.no_grad():
        model.lm_head.weight[256:] *= 3  # (tied to wte: ids never read, only scored)
    x = torch.tensor([list(range(40, 72))])
    assert (model(x, targets=x)[0].argmax(dim=-1) >= 256).all()
    pairs = requests()[:6] + [([1, 2, 3], greedy_continuation(model, [1, 2, 3], 5, vocab=256))]
    got = harness_lm(model, LATIN1).score(pairs)
    assert got[-1][1] is True
    assert_same_scores(got, [direct(model, *pair, vocab=256) for pair in pairs])
    prompt = "Q: hi\nA:"
    want = model.generate_tokens(torch.tensor([LATIN1.encode(prompt)]), 12, temperature=0, use_cache=False, vocab_size=256)
    assert harness_lm(model, LATIN1).generate(prompt, {"max_gen_toks": 12}) == LATIN1.decode([t.item() for t in want])


def test_the_dtype_is_the_forward_passes():
    """dtype=bfloat16 (on the CPU here): every forward, scoring and generating, runs in bfloat16 autocast,
    and log-softmaxes its logits in float32, as a direct bfloat16 forward and a float32 log-softmax do."""
    model = tiny_model("rd")
    pairs = requests()
    lm = harness_lm(model, dtype="bfloat16")
    dtypes = []
    model.register_forward_hook(lambda module, args, output: dtypes.append(output[0].dtype))

    @torch.no_grad()
    def direct_bf16(context, continuation):
        tokens = (context + continuation)[-(32 + 1):]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(torch.tensor([tokens[:-1]]), targets=torch.tensor([tokens[1:]]))
        logp = logits[0, -len(continuation):].float().log_softmax(dim=-1)
        return logp.gather(1, torch.tensor(continuation)[:, None]).sum().item()

    got = [logprob for logprob, _ in lm.score(pairs)]
    float32 = [logprob for logprob, _ in harness_lm(model).score(pairs)]
    assert max(abs(a - b) for a, b in zip(got, float32)) > 10 * TOL  # (bfloat16 shows)
    # measured: within 1e-5 of the direct bfloat16 forward; a bfloat16 log-softmax is off by ~1e-2
    assert got == pytest.approx([direct_bf16(*pair) for pair in pairs], abs=TOL)
    dtypes.clear()
    lm.generate("Q: hi\nA:", {"max_gen_toks": 3})
    assert dtypes == [torch.bfloat16] * 3


def test_generation_samples_where_the_task_asks():
    """do_sample: the model's sampled tokens at the task's temperature, or 1 where it names none, and
    its top_k and top_p where it names them (the same generator state)."""
    model = tiny_model("rd")
    prompt = "A prompt longer than the block size of this tiny model: Q: hi\nA:"
    kept = torch.tensor([list(prompt.encode())[-(32 - 12):]])
    greedy = harness_lm(model).generate(prompt, {"max_gen_toks": 12})
    for temperature, top_k, top_p in ((2.0, None, None), (None, None, None), (2.0, 20, 0.9)):
        torch.manual_seed(0)
        options = {"do_sample": True, "max_gen_toks": 12, **({"temperature": temperature} if temperature else {}),
                   **({"top_k": top_k, "top_p": top_p} if top_k else {})}
        got = harness_lm(model).generate(prompt, options)
        torch.manual_seed(0)
        ref = model.generate(kept, 12, temperature=temperature or 1.0, top_k=top_k, top_p=top_p)  # (the cached path, as eval)
        assert got == bytes(ref[0, kept.size(1):].tolist()).decode("utf-8", errors="replace") != greedy


# -----------------------------------------------------------------------------
# eval.py end to end

def test_local_tasks_end_to_end(tasks, tmp_path):
    """python eval.py on a checkpoint whose training logged to wandb, with three local tasks (one per kind
    of request): the harness's table, the JSON next to the checkpoint, numbers that come from GPT.forward
    (accuracy from direct scores of the choices, bits per byte from direct rolling log-likelihoods), and
    the scores in the training's own wandb run (offline here), found by the id train.py stored."""
    model = tiny_model("rd")
    config = dict(wandb_log=True, wandb_project="eval-test", wandb_run_name="rd-seed7", wandb_group="g", out_dir=str(tmp_path))
    ckpt = write_ckpt(tmp_path / "ckpt.pt", model, config=config, wandb_run_id="evaltest7")
    result = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--ckpt={ckpt}", "--tasks=tiny_choice,tiny_rolling,tiny_gen",
                             f"--include_path={tasks}", "--batch_size=3", "--device=cpu"], capture_output=True, text=True,
                            env={**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "|tiny_choice |" in result.stdout and "|bits_per_byte  |" in result.stdout
    assert f"wrote {tmp_path / 'ckpt.eval.json'}" in result.stdout
    record = json.loads((tmp_path / "ckpt.eval.json").read_text())
    assert record["checkpoint"] == str(ckpt) and record["tasks"] == ["tiny_choice", "tiny_rolling", "tiny_gen"]
    assert record["model_args"]["residual"] == "rd" and record["commit"] and record["harness"]["n-samples"]["tiny_gen"]["effective"] == 2
    scores = record["scores"]
    assert set(scores) == {"tiny_choice/acc", "tiny_choice/acc_norm", "tiny_rolling/word_perplexity",
                           "tiny_rolling/byte_perplexity", "tiny_rolling/bits_per_byte", "tiny_gen/exact_match"}
    # the harness asks for " " + choice after the question (its default target delimiter)
    picks = [max(range(len(d["choices"])), key=lambda c: direct(model, list(d["question"].encode()),
                                                                    list((" " + d["choices"][c]).encode()))[0])
             for d in DOCS["tiny_choice"]]
    assert scores["tiny_choice/acc"] == sum(p == d["answer"] for p, d in zip(picks, DOCS["tiny_choice"])) / 4
    texts = [d["text"] for d in DOCS["tiny_rolling"]]
    nats = -sum(direct_rolling(model, list(t.encode()), ord("\n")) for t in texts)
    assert scores["tiny_rolling/bits_per_byte"] == pytest.approx(nats / sum(len(t.encode()) for t in texts) / math.log(2), rel=1e-5)
    if importlib.util.find_spec("wandb"):
        (run,) = (tmp_path / "wandb").glob("offline-run-*-evaltest7/run-evaltest7.wandb")
        assert b"eval/tiny_choice/acc" in run.read_bytes() and b"eval/tiny_rolling/bits_per_byte" in run.read_bytes()


def test_wandb_that_cannot_log_is_a_note_after_the_scores_are_saved(tmp_path, monkeypatch, capsys):
    """A wandb that fails to start (no login, no network) leaves a note naming the saved results, not a
    traceback after them; a training that did not log to wandb never touches it."""
    def refuse(**_):
        raise RuntimeError("api_key not configured (no-tty)\ncall wandb.login(key=[your_api_key])")
    monkeypatch.setitem(sys.modules, "wandb", type(sys)("wandb"))
    monkeypatch.setattr(sys.modules["wandb"], "init", refuse, raising=False)
    out = tmp_path / "ckpt.eval.json"
    scores = {"tiny_choice/acc": (0.5, None)}
    evaluate.log_to_wandb(dict(config=dict(wandb_log=True, wandb_project="p")), scores, out)
    err = capsys.readouterr().err
    assert err == (f"note: wandb could not log the scores (RuntimeError: api_key not configured (no-tty)), so they are "
                   f"in {out} only: run `wandb login` or set WANDB_MODE=offline, and evaluate again to log them\n")
    evaluate.log_to_wandb(dict(config=dict(wandb_log=False)), scores, out)
    evaluate.log_to_wandb(None, scores, out)  # (gpt2 weights: no training config)
    assert capsys.readouterr().err == ""


def test_folded_and_unfolded_dlr_score_the_same(tasks, tmp_path, capsys):
    """A DLR checkpoint and fold.py's folding of it give the same scores on every task (the fold keeps
    the logits bitwise), each on the first --limit examples of each task."""
    torch.manual_seed(0)
    model = randomise_queries(perturb_norms_and_biases(GPT(GPTConfig(**TINY, **MODELS["folded_dlr"]))))
    ckpt = write_ckpt(tmp_path / "ckpt.pt", model.eval())
    fold.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "folded.pt")])
    common = ["--tasks=tiny_choice,tiny_rolling,tiny_gen", f"--include_path={tasks}", "--device=cpu", "--limit=3"]
    code, _, err, dlr = run_main([f"--ckpt={ckpt}", *common], capsys)
    assert code == 0, err
    code, _, err, folded = run_main([f"--ckpt={tmp_path / 'folded.pt'}", *common], capsys)
    assert code == 0, err
    assert dlr["model_args"]["dlr"] is True and folded["model_args"]["dlr"] is False
    assert folded["scores"] == dlr["scores"]
    # --limit: the first 3 examples of each task (tiny_gen has 2)
    assert {task: n["effective"] for task, n in dlr["harness"]["n-samples"].items()} == dict(tiny_choice=3, tiny_rolling=3, tiny_gen=2)
    assert (dlr["limit"], dlr["iter_num"], dlr["batch_size"], dlr["dtype"]) == (3, 5, 16, "float32")
    assert (tmp_path / "folded.eval.json").exists() and (tmp_path / "ckpt.eval.json").exists()


def test_the_example_task_runs_offline(tmp_path, capsys, monkeypatch):
    """The README's command: docs/tasks/python_words, scored from the repository root with nothing downloaded."""
    monkeypatch.chdir(REPO)  # the task's YAML names its data relative to where eval.py runs
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    code, out, err, record = run_main([f"--ckpt={ckpt}", "--tasks=python_words", "--include_path=docs/tasks", "--device=cpu"], capsys)
    assert code == 0, err
    assert "|python_words|" in out and record["harness"]["n-samples"]["python_words"]["effective"] == 8
    assert set(record["scores"]) == {"python_words/acc", "python_words/acc_norm"}


def test_init_from_gpt2(tasks, tmp_path, capsys, monkeypatch, gpt2_offline):
    """--init_from=gpt2 scores OpenAI's GPT-2 as train.py's init_from loads it (checkpoint.load_gpt2: a tiny
    stand-in here, no download), in GPT-2 tokens, and writes OUT_DIR/gpt2.eval.json."""
    import checkpoint
    model = tiny_model("standard", vocab_size=50257)
    calls = []
    monkeypatch.setattr(checkpoint, "load_gpt2", lambda *args: calls.append(args) or (model_args(model), model.state_dict()))
    code, _, err, record = run_main(["--init_from=gpt2", f"--out_dir={tmp_path}", "--tasks=tiny_choice",
                                     f"--include_path={tasks}", "--device=cpu"], capsys)
    assert code == 0, err
    assert calls == [("gpt2", "cache")] and record["checkpoint"] == "gpt2" and record["tokenizer"] == "gpt2"
    assert json.loads((tmp_path / "gpt2.eval.json").read_text())["scores"] == record["scores"]


# -----------------------------------------------------------------------------
# bad input: one line that says what to do

def test_each_task_is_named_once():
    """--tasks names each task once, in its order (the harness refuses repeats), empty names dropped."""
    assert evaluate.parse_args(["--tasks=tiny_gen,tiny_choice,tiny_gen,,", "--device=cpu"]).tasks == ["tiny_gen", "tiny_choice"]


def test_one_line_errors(tasks, tmp_path, capsys):
    """An unknown task (the harness's list is the judge), a checkpoint that does not load, --limit not
    positive, a folder that is not there: each one line on stderr, no traceback."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    local = [f"--include_path={tasks}", "--device=cpu"]
    cases = [
        ([f"--ckpt={ckpt}", "--tasks=tiny_choice", "--limit=0", *local], 2, "--limit=0: give a positive number"),
        ([f"--ckpt={ckpt}", "--tasks=,", *local], 2, "--tasks names no task"),
        ([f"--ckpt={ckpt}", "--tasks=tiny_choice", "--include_path=/no/such/folder"], 1, "--include_path=/no/such/folder: no such folder"),
        ([f"--out_dir={tmp_path / 'nowhere'}", "--tasks=tiny_choice", *local], 1, "no checkpoint at"),
        ([f"--ckpt={tmp_path / 'broken.pt'}", "--tasks=tiny_choice", *local], 1, "broken.pt is not a checkpoint (not a file torch.save writes)"),
        ([f"--ckpt={ckpt}", "--tasks=hellaswagg", *local], 1, "unknown task 'hellaswagg' (did you mean hellaswag"),
    ]
    for argv, want_code, message in cases:
        code, out, err, _ = run_main(argv, capsys)
        assert (code, err.count("\n")) == (want_code, 1) and message in err and "Traceback" not in err, (argv, err)
    assert "`lm-eval ls tasks` lists the harness's tasks" in err


def test_a_task_yaml_that_does_not_parse_is_named(tasks, tmp_path, capsys):
    """The harness skips a task YAML it cannot parse without a word, so its task read as unknown and the folder
    as having no such YAML: the error names the file and where its YAML breaks (or why it cannot be read).
    The file named after the task is named first; a file that parses (the harness's !function tag included)
    never is; a broken file stops no task that loads."""
    folder = shutil.copytree(tasks, tmp_path / "tasks")  # (the YAMLs name their data files by their full paths)
    (folder / "a_tagged.yaml").write_text("task: a_tagged\nprocess_docs: !function utils.process_docs\n")
    (folder / "a_broken.yaml").write_text("task: [a_broken\n")
    (folder / "broken.yaml").write_text("task: broken\ndataset_path: json\n  output_type: loglikelihood\n")
    assert evaluate.invalid_yaml(folder, "broken") == (f"{folder / 'broken.yaml'} is not valid YAML (mapping values "
                                                       "are not allowed here at line 3, column 14)")
    assert evaluate.invalid_yaml(folder, "brokn").startswith(f"{folder / 'a_broken.yaml'} is not valid YAML (")
    assert evaluate.invalid_yaml(tasks, "broken") is None
    gone = tmp_path / "gone" / "gone.yaml"  # a link to no file
    gone.parent.mkdir()
    gone.symlink_to(tmp_path / "nowhere.yaml")
    assert evaluate.invalid_yaml(gone.parent, "x") == f"{gone} cannot be read (No such file or directory)"
    assert "tiny_choice" in evaluate.task_manager(["tiny_choice"], folder).all_tasks

    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    code, _, err, _ = run_main([f"--ckpt={ckpt}", "--tasks=broken", f"--include_path={folder}", "--device=cpu"], capsys)
    assert code == 1 and err == (f"error: unknown task 'broken', and {folder / 'broken.yaml'} is not valid YAML "
                                 "(mapping values are not allowed here at line 3, column 14): fix it\n")


def test_a_task_yaml_that_parses_but_that_lm_eval_skips_says_why(tasks, tmp_path, capsys, monkeypatch):
    """The harness also skips, without a word, a YAML that parses but that it cannot load (here an include: of a
    file that is not there): the task's YAML (named after it, or naming it as its task) is named with the
    harness's own reason, not the folder as having no such YAML. A YAML that is not the task's (a template
    for include:, which the harness skips by design) never is; one the harness loads neither."""
    folder = shutil.copytree(tasks, tmp_path / "tasks")  # (the YAMLs name their data files by their full paths)
    (folder / "a_template.yaml").write_text("dataset_path: json\n")
    (folder / "mine.yaml").write_text("task: mine\ninclude: missing.yaml\n")
    (folder / "elsewhere.yaml").write_text("include: gone.yaml\ntask: other\n")
    gone = lambda file: f"(FileNotFoundError: [Errno 2] No such file or directory: '{(folder / file).resolve()}')"
    mine = f"{folder / 'mine.yaml'} parses, but lm-eval skips it {gone('missing.yaml')}"
    assert evaluate.skipped_yaml(folder, "mine") == mine
    assert evaluate.skipped_yaml(folder, "other") == f"{folder / 'elsewhere.yaml'} parses, but lm-eval skips it {gone('gone.yaml')}"
    assert evaluate.skipped_yaml(folder, "nothing") is None and evaluate.skipped_yaml(folder, "tiny_choice") is None
    with monkeypatch.context() as m:  # an lm-eval without 0.4.13's reader of a task file
        m.setitem(sys.modules, "lm_eval.tasks._yaml_loader", None)
        assert evaluate.skipped_yaml(folder, "mine") == f"{folder / 'mine.yaml'} parses, but lm-eval skips it (lm-eval does not say why)"
    from lm_eval.tasks._index import TaskIndex
    for changed in (None, staticmethod(lambda config: None)):  # a reader gone, or called otherwise, in another release
        with monkeypatch.context() as m:  # (its error would be about the call, not about the file)
            if changed is None:
                m.delattr(TaskIndex, "process_cfg")
            else:
                m.setattr(TaskIndex, "process_cfg", changed)
            assert evaluate.skipped_yaml(folder, "mine").endswith("(lm-eval does not say why)")

    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    code, _, err, _ = run_main([f"--ckpt={ckpt}", "--tasks=mine", f"--include_path={folder}", "--device=cpu"], capsys)
    assert code == 1 and err == f"error: unknown task 'mine', and {mine}: fix it\n"


@pytest.mark.parametrize("setting, problem", [("top_p: 1.5", "top_p=1.5 (a probability mass, from 0 to 1)"),
                                              ("top_k: -3", "top_k=-3 (a count of tokens, 0 for all)"),
                                              ("temperature: -1.0", "temperature=-1.0 (0 for greedy, more to sample)")])
def test_bad_sampling_settings_stop_before_any_task_is_scored(tasks, tmp_path, capsys, setting, problem):
    """A task's sampling settings are checked as the tasks load: found at its first generation (a traceback
    from the sampler, or for a negative temperature no error at all, the least likely tokens drawn), the tasks
    scored before it were lost."""
    folder = shutil.copytree(tasks, tmp_path / "tasks")  # (the YAMLs name their data files by their full paths)
    (folder / "tiny_gen_bad.yaml").write_text((tasks / "tiny_gen.yaml").read_text().replace("task: tiny_gen", "task: tiny_gen_bad")
                                              .replace("  max_gen_toks: 8\n", f"  max_gen_toks: 8\n  do_sample: true\n  {setting}\n"))
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    code, out, err, _ = run_main([f"--ckpt={ckpt}", "--tasks=tiny_choice,tiny_gen_bad", f"--include_path={folder}",
                                  "--device=cpu"], capsys)
    # (the datasets library may show its progress first, as it reads a task's data file the first time)
    assert code == 1 and err.splitlines()[-1] == f"error: task tiny_gen_bad samples with {problem}: fix its generation_kwargs"
    assert "Traceback" not in err and "tiny_choice" not in out  # nothing was scored
    assert not (tmp_path / "ckpt.eval.json").exists()


def test_results_that_cannot_be_written_stop_before_the_evaluation(tasks, tmp_path, capsys, monkeypatch):
    """A results file that cannot be written (here a folder in its place: the tests run as root, whom no
    permission stops) is one line naming it before anything is scored, not a traceback after it all; a
    write that fails after all (a full disk) is one line that points at the table printed above."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    (tmp_path / "ckpt.eval.json").mkdir()
    argv = [f"--ckpt={ckpt}", "--tasks=tiny_choice", f"--include_path={tasks}", "--device=cpu"]
    real = evaluate.simple_evaluate
    monkeypatch.setattr(evaluate, "simple_evaluate", lambda *a, **k: pytest.fail("evaluated before checking the results path"))
    code, _, err, _ = run_main(argv, capsys)
    assert code == 1 and err.count("\n") == 1 and err.startswith(
        f"error: cannot write the results to {tmp_path / 'ckpt.eval.json'}: it is a folder; eval.py writes them next to")
    (tmp_path / "ckpt.eval.json").rmdir()

    def disk_full(path, write):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(evaluate, "simple_evaluate", real)
    monkeypatch.setattr(evaluate, "write_atomic", disk_full)
    code, out, err, _ = run_main(argv, capsys)
    assert code == 1 and "|tiny_choice|" in out.replace(" ", "") and "Traceback" not in err  # (err: the harness's log too)
    assert err.endswith(f"\nerror: cannot write the results to {tmp_path / 'ckpt.eval.json'} (No space left on device); "
                        "the table above holds the scores\n")


def test_no_network_names_the_dataset(tasks, tmp_path):
    """A task whose dataset must come from the Hugging Face hub, with the hub out of reach (offline mode:
    no retries), stops in one line that names the dataset."""
    ckpt = write_ckpt(tmp_path / "ckpt.pt", tiny_model("standard"))
    result = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--ckpt={ckpt}", "--tasks=tiny_hub", f"--include_path={tasks}"],
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1 and result.stderr.splitlines()[-1].startswith(
        "error: task tiny_hub needs the dataset nanoattnres-test/not-here from the Hugging Face hub, which cannot be reached")


def test_missing_harness_says_how_to_install(tmp_path):
    """Without lm-eval, eval.py says in one line how to install it."""
    fake = tmp_path / "no_lm_eval" / "lm_eval"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named lm_eval')\n")
    result = subprocess.run([sys.executable, str(REPO / "eval.py"), "--tasks=hellaswag"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(fake.parent), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: eval.py runs lm-evaluation-harness, which is not installed: pip install lm-eval")
