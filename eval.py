"""
Score a checkpoint on lm-evaluation-harness tasks, the downstream numbers the papers report.

    python eval.py --out_dir=out --tasks=hellaswag,arc_easy,piqa,lambada_openai
    python eval.py --ckpt=out-dlr/folded.pt --tasks=hellaswag --limit=500 --batch_size=32
    python eval.py --init_from=gpt2 --tasks=hellaswag
    python eval.py --out_dir=out --tasks=my_task --include_path=my_tasks/     # task YAMLs of your own

Any checkpoint of this project (every residual mode; dense, low-rank, DLR or folded) or OpenAI's GPT-2,
in the tokenizer its training data used (GPT-2 BPE, or bytes: a byte-level model is scored like any
other). lm-evaluation-harness (pip install lm-eval) asks a model three things; this one answers them
as the harness's own Hugging Face model does:

    loglikelihood          log p(continuation | context) and whether greedy decoding gives the continuation;
                           a context longer than block_size loses its beginning
    loglikelihood_rolling  log p(text), over consecutive windows of block_size tokens
    generate_until         greedy decoding (sampling where the task asks) with the key-value cache, cut at the
                           task's stop sequences

It prints the harness's table and writes the harness's results, with the checkpoint, settings and
commit, next to the checkpoint: out/ckpt.pt -> out/ckpt.eval.json (GPT-2: OUT_DIR/gpt2.eval.json),
replacing an earlier run's. When the checkpoint's training logged to Weights & Biases the scores go
there too, as eval/<task>/<metric>. A task whose dataset lives on the Hugging Face hub downloads it
once (the datasets library keeps a copy).
"""

import argparse
import difflib
import inspect
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from checkpoint import GPT2_CONFIGS, load_for_inference
from common import (DTYPES, autocast, cannot_write, die, first_line, provenance, resolve_device_and_dtype, sampling_problem,
                    task_scores, write_atomic)
from download import DownloadError

try:
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.utils import normalize_gen_kwargs
    from lm_eval.utils import handle_non_serializable, make_table
    from tqdm import tqdm  # the harness's own progress bars
except ImportError:
    lm_eval, TemplateLM = None, object  # main() says how to install it before anything needs it

INSTALL = "pip install lm-eval (or pip install -r requirements-dev.txt)"
NEWLINE = 10  # the byte "\n": byte-level documents begin after the blank line that ends the one before


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: die(f"{message} (python eval.py --help)", 2)  # one line, like every error here
    p.add_argument("--out_dir", default="out", help="where train.py wrote ckpt.pt")
    p.add_argument("--ckpt", default=None, help="a checkpoint file (default: OUT_DIR/ckpt.pt), e.g. out-dlr/folded.pt")
    p.add_argument("--init_from", default="resume", choices=("resume", *GPT2_CONFIGS),
                   help="resume: the checkpoint; gpt2*: OpenAI's GPT-2 weights")
    p.add_argument("--cache_dir", default="cache", help="where downloaded GPT-2 weights are kept (as in train.py)")
    p.add_argument("--tasks", required=True, help="comma-separated harness task (or group) names")
    p.add_argument("--limit", type=int, default=None, help="score only the first N examples of each task")
    p.add_argument("--batch_size", type=int, default=16, help="windows per forward pass")
    p.add_argument("--device", default="auto", help="auto (cuda, mps, then cpu) | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                   help="autocast dtype (weights stay float32); auto as in train.py")
    p.add_argument("--include_path", default=None, help="a folder of task YAMLs outside the harness")
    args = p.parse_args(argv)
    args.tasks = list(dict.fromkeys(t for t in args.tasks.split(",") if t))  # each once: the harness refuses repeats
    if not args.tasks:
        p.error("--tasks names no task: give one or more, e.g. --tasks=hellaswag,piqa")
    if args.limit is not None and args.limit <= 0:
        p.error(f"--limit={args.limit}: give a positive number of examples per task, or leave it out for all")
    if args.batch_size <= 0:
        p.error(f"--batch_size={args.batch_size}: give a positive number")
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        p.error(str(e))
    return args


# -----------------------------------------------------------------------------
# the model as the harness sees it

def score_windows(context, continuation, block_size):
    """The forward passes that score `continuation` (token ids) after `context` (at least one token), as
    (input, targets, n): a window of at most block_size inputs, its targets (the inputs shifted by one),
    and n, how many of the last targets are continuation tokens. The continuation is cut into pieces of
    block_size tokens from its start, and each piece reads as much of what precedes it as fits, so a long
    context loses its beginning. For a text after one prefix token these are the harness's rolling
    windows (lm_eval.utils.get_rolling_token_windows with context_len=1, made disjoint), so perplexities
    compare with the harness's Hugging Face models'."""
    if not context:
        raise ValueError("score_windows needs a context of at least one token (an empty one reads the prefix token)")
    tokens = context + continuation
    windows = []
    for start in range(len(context), len(tokens), block_size):
        end = min(start + block_size, len(tokens))
        first = max(0, end - 1 - block_size)
        windows.append((tokens[first:end - 1], tokens[first + 1:end], end - start))
    return windows


class HarnessLM(TemplateLM):
    """A GPT of this project as an lm-eval model. TemplateLM (the harness's base for its own models)
    turns text requests into token ids, context and continuation encoded together and split, as its
    Hugging Face model does; this class scores the ids."""

    def __init__(self, model, tokenizer, device, dtype, batch_size):
        super().__init__()
        self.model, self.tok, self._device = model, tokenizer, device  # the harness's LM reads ._device as .device
        self.ctx = autocast(device, dtype)
        self.batch_size = batch_size
        self.block_size = model.config.block_size

    @property
    def eot_token_id(self):
        # what an empty context (and a text scored from its first token) is conditioned on: the token
        # that starts every document in training, <|endoftext|> for gpt2, a newline for bytes
        return self.tok.eot if self.tok.eot is not None else NEWLINE

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tok.encode(string)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        # a context of spaces alone reaches here empty (the harness moves a context's trailing spaces into the
        # continuation): it reads the prefix token, as an empty context does
        return self.score([(context or [self.prefix_token_id], continuation) for _, context, continuation in requests],
                          disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        texts = [self.tok_encode(request.args[0]) for request in requests]
        return [logprob for logprob, _ in self.score([([self.prefix_token_id], t) for t in texts], disable_tqdm)]

    def generate_until(self, requests, disable_tqdm=False):
        # one request at a time: the model has no padding mask, and the stop sequences differ per request
        return [self.generate(context, kwargs) for context, kwargs in
                tqdm([r.args for r in requests], desc="generating", disable=disable_tqdm)]

    @torch.no_grad()
    def score(self, requests, disable_tqdm=False):
        """(log p(continuation | context), whether greedy decoding gives the continuation) for each
        (context, continuation) pair of token ids, in their order. Windows (score_windows) go through
        the model batch_size at a time, longest first, as the harness's models sort them: a batch pads
        only to its own longest window, and a batch_size too large for memory fails at the first batch.
        Padding goes on the right, where causal attention keeps it from every real position (and
        routing mixes depths, never positions). Ids the tokenizer cannot decode (a vocabulary padded for
        speed) are no text: the softmax leaves them out, as generation does."""
        windows = [(i, *w) for i, (context, continuation) in enumerate(requests)
                   for w in score_windows(context, continuation, self.block_size)]
        windows.sort(key=lambda w: -len(w[1]))
        logprob, misses = [0.0] * len(requests), [0] * len(requests)
        for b in tqdm(range(0, len(windows), self.batch_size), desc="scoring", disable=disable_tqdm):
            batch = windows[b:b + self.batch_size]
            x = torch.zeros(len(batch), len(batch[0][1]), dtype=torch.long)
            y = torch.full_like(x, -1)
            scored = torch.zeros_like(x, dtype=torch.bool)
            for row, (_, inputs, targets, n) in enumerate(batch):
                x[row, :len(inputs)] = torch.tensor(inputs)
                y[row, :len(targets)] = torch.tensor(targets)
                scored[row, len(targets) - n:len(targets)] = True
            x, y, scored = x.to(self.device), y.to(self.device), scored.to(self.device)
            with self.ctx:
                logits, _ = self.model(x, targets=y)  # with targets, the logits of every position
            logp = logits[scored][:, :self.tok.vocab_size].float().log_softmax(dim=-1)  # [scored tokens, vocab]
            target = y[scored]
            # per scored token: its log-prob, whether it is not the argmax, its row; one copy to the host per batch
            token_logp, miss, rows = torch.stack([logp.gather(1, target[:, None])[:, 0], (logp.argmax(dim=-1) != target).float(),
                                                 scored.nonzero()[:, 0].float()]).cpu()
            row_logp = torch.zeros(len(batch), dtype=torch.float64).index_add_(0, rows.long(), token_logp.double()).tolist()
            row_misses = torch.zeros(len(batch)).index_add_(0, rows.long(), miss).tolist()
            for (i, *_), lp, n_missed in zip(batch, row_logp, row_misses):
                logprob[i] += lp
                misses[i] += int(n_missed)
        return [(lp, miss == 0) for lp, miss in zip(logprob, misses)]

    @torch.no_grad()
    def generate(self, context, gen_kwargs):
        """The continuation of context, greedy unless the task samples (do_sample, at its temperature, 1 if
        it names none, and its top_k and top_p where it names them), up to the first of the task's stop sequences (or
        the end of text token), at most max_gen_toks tokens (or the limit under another of the names the
        harness reads, 256 where the task sets none).
        The context keeps its last block_size - max_gen_toks tokens, as the harness's Hugging Face model
        cuts it, so that the new tokens fit in the window, each one a one-token step with the key-value
        cache; but at least half the window: where max_gen_toks passes block_size / 2 (the 256-token
        default at a small block_size) that cut would leave a token or none (the Hugging Face model
        refuses), and the window slides once full, as in sample.py."""
        until = gen_kwargs.get("until")
        kwargs = normalize_gen_kwargs({**gen_kwargs, "until": list(until) if isinstance(until, tuple) else until})
        until = [s for s in kwargs["until"] if s]
        temperature = float(kwargs.get("temperature", 1.0)) if kwargs["do_sample"] else 0
        keep = self.block_size - min(kwargs["max_gen_toks"], self.block_size // 2)
        ids = (self.tok_encode(context) or [self.prefix_token_id])[-keep:]
        new = []
        with self.ctx:
            for token in self.model.generate_tokens(torch.tensor([ids], device=self.device), kwargs["max_gen_toks"],
                                                    temperature=temperature, top_k=int(kwargs.get("top_k") or 0) or None,
                                                    top_p=kwargs.get("top_p"), vocab_size=self.tok.vocab_size):
                if token.item() == self.tok.eot:
                    break
                new.append(token.item())
                if any(s in self.tok.decode(new) for s in until):
                    break
        text = self.tok.decode(new)
        for s in until:
            text = text.split(s, 1)[0]  # cut at the earliest stop sequence
        return text


# -----------------------------------------------------------------------------
# tasks

def task_manager(names, include_path):
    """A harness TaskManager that knows every task in names; ValueError for the first name it does not
    know (the harness's list is the judge), with the nearest names it has."""
    from lm_eval.tasks import TaskManager
    if include_path:
        if not Path(include_path).is_dir():
            raise ValueError(f"--include_path={include_path}: no such folder")
        # indexing the harness's own ~15,000 task files takes 10-20 s: tasks that are all in include_path skip it
        local = TaskManager(include_path=include_path, include_defaults=False)
        if set(names) <= set(local.all_tasks):
            return local
    manager = TaskManager(include_path=include_path)
    for name in names:
        if name not in manager.all_tasks:
            broken = include_path and (skipped_yaml(include_path, name) or invalid_yaml(include_path, name))
            if broken:  # the harness skips a YAML it cannot load without a word: the task may be in it
                raise ValueError(f"unknown task {name!r}, and {broken}: fix it")
            near = difflib.get_close_matches(name, manager.all_tasks, n=3)
            raise ValueError(f"unknown task {name!r}" + (f" (did you mean {', '.join(near)}?)" if near else "")
                             + ": `lm-eval ls tasks` lists the harness's tasks"
                             + (f", and {include_path} has no such YAML" if include_path else
                                "; --include_path=DIR adds task YAMLs of your own"))
    return manager


def task_yamls(folder, name):
    """The task YAMLs under folder, as the harness finds them, NAME.yaml first: the likeliest home of a task NAME."""
    files = [p for p in Path(folder).glob("**/*.yaml") if not {"__pycache__", ".ipynb_checkpoints"} & set(p.parts)]
    return sorted(files, key=lambda p: (p.stem != name, p.as_posix()))


def skipped_yaml(folder, name):
    """'FILE parses, but lm-eval skips it (why)' for the first YAML under folder that is the task's (NAME.yaml,
    or one whose top-level task: or group: is NAME), parses, and yet is left out of the harness's task index:
    an include: of a file that is not there, say. The harness skips it with a debug log line alone; its own
    loader, run again on the file, says why (harness_refusal). None where there is no such file."""
    import yaml  # (the harness's own dependency)
    for path in task_yamls(folder, name):
        try:
            document = yaml.compose(path.read_bytes(), Loader=yaml.SafeLoader)
        except (yaml.YAMLError, OSError):
            continue  # (invalid_yaml names it)
        names = {value.value for key, value in (document.value if isinstance(document, yaml.MappingNode) else [])
                 if key.value in ("task", "group") and isinstance(value, yaml.ScalarNode)}
        why = harness_refusal(path) if path.stem == name or name in names else None
        if why:
            return f"{path} parses, but lm-eval skips it ({why})"
    return None


def harness_refusal(path):
    """Why the harness's task index leaves out the YAML at path, or None where it takes it: its own reading of
    a task file (lm-eval 0.4.13's, includes followed, !function tags not run), the error it skips the file
    for. An lm-eval without that reader, or with one called otherwise (private modules: they may change in any
    release), does not say why: its error would be about this call, not about the file."""
    try:
        from lm_eval.tasks._index import TaskIndex
        from lm_eval.tasks._yaml_loader import load_yaml
        inspect.signature(load_yaml).bind(path, resolve_func=False)
        inspect.signature(TaskIndex.process_cfg).bind({}, path, {})
    except (ImportError, AttributeError, TypeError):
        return "lm-eval does not say why"
    try:
        TaskIndex.process_cfg(load_yaml(path, resolve_func=False), path, {})
    except Exception as e:  # (the index skips a file for any error)
        return first_line(e)
    return None


def invalid_yaml(folder, name):
    """'FILE is not valid YAML (its error)' for the first task YAML under folder (task_yamls) that does not
    parse or cannot be read, or None where all parse."""
    import yaml  # (the harness's own dependency)
    for path in task_yamls(folder, name):
        try:
            # the syntax alone: composing builds no objects, so the harness's own tags (!function) need no constructor
            yaml.compose(path.read_bytes(), Loader=yaml.SafeLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{e.problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else first_line(e)
            return f"{path} is not valid YAML ({where})"
        except OSError as e:
            return f"{path} cannot be read ({e.strerror})"
    return None


def load_tasks(manager, names):
    """The harness's task (or group) objects for names, their datasets loaded: downloaded from the
    Hugging Face hub once, then read from the datasets cache. A dataset that cannot be had is a
    ValueError that names it."""
    loaded = []
    for name in names:
        try:
            built = manager.load([name])
        except ConnectionError as e:  # what the datasets library raises when it cannot reach the hub
            config = manager.task_index[name].cfg or {}
            dataset = " ".join(filter(None, (config.get("dataset_path"), config.get("dataset_name"))))
            raise ValueError(f"task {name} needs the dataset {dataset or 'of one of its tasks'} from the Hugging Face "
                             f"hub, which cannot be reached ({e}): run it once where huggingface.co can be reached "
                             "(the datasets library keeps a copy), or set HF_ENDPOINT to a mirror") from None
        except Exception as e:  # a task YAML or data file of one's own that is wrong, a dataset that is gone
            raise ValueError(f"task {name} does not load: {type(e).__name__}: {' '.join(str(e).split())}") from None
        for task_name, task in built["tasks"].items():  # (a group's tasks too)
            settings = getattr(task.config, "generation_kwargs", None) or {}
            problem = sampling_problem(*(settings.get(k) for k in ("temperature", "top_k", "top_p")))
            if problem:  # found at its first generation, the scores of the tasks before it would be lost
                raise ValueError(f"task {task_name} samples with {problem}: fix its generation_kwargs")
        # a group stays one (the harness aggregates it); a tag is its tasks
        loaded += [built["groups"][name]] if name in built["groups"] else list(built["tasks"].values())
    return loaded


# -----------------------------------------------------------------------------
# results

def results_path(args, ckpt_path):
    """Next to the checkpoint: out/ckpt.pt -> out/ckpt.eval.json; GPT-2: OUT_DIR/gpt2.eval.json."""
    if args.init_from == "resume":
        return ckpt_path.with_name(ckpt_path.stem + ".eval.json")
    return Path(args.out_dir) / f"{args.init_from}.eval.json"


def writable_results_path(args, ckpt_path):
    """results_path, checked before the evaluation: found unwritable after it, hours of scores would be
    lost. ValueError that names the file where it cannot be written."""
    out = results_path(args, ckpt_path)
    problem = cannot_write(out)
    if problem:
        fix = ("eval.py writes them next to the checkpoint: copy it into a folder you can write" if args.init_from == "resume"
               else "choose another --out_dir")
        raise ValueError(f"cannot write the results to {out}: {problem}; {fix}")
    return out


def log_to_wandb(ckpt, scores, out):
    """The scores into Weights & Biases when the checkpoint's training logged there (train.py's
    wandb_log=True): into its very run where the checkpoint records the run's id, else into a new run
    of the same project, group and name."""
    config = (ckpt or {}).get("config") or {}
    if not config.get("wandb_log"):
        return
    try:
        import wandb
    except ImportError:  # the scores are in the JSON already: not worth an error
        print("note: the checkpoint's training logged to wandb, but wandb is not installed here, so its scores "
              f"are in {out} only (pip install wandb)", file=sys.stderr)
        return
    run_id = ckpt.get("wandb_run_id")
    name = config.get("wandb_run_name") or Path(config.get("out_dir", "out")).resolve().name
    try:
        run = wandb.init(project=config.get("wandb_project"), id=run_id, resume="allow" if run_id else None,
                         name=name, group=config.get("wandb_group") or None, job_type=None if run_id else "eval")
        run.summary.update({f"eval/{key}": value for key, (value, _) in scores.items()})
        run.finish()
    except Exception as e:  # (wandb's own kinds: no login, no network) the scores are saved: a note, as above
        print(f"note: wandb could not log the scores ({first_line(e)}), so they are in {out} only: "
              "run `wandb login` or set WANDB_MODE=offline, and evaluate again to log them", file=sys.stderr)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parse_args(argv)
    if lm_eval is None:
        die(f"eval.py runs lm-evaluation-harness, which is not installed: {INSTALL}")
    path = Path(args.ckpt) if args.ckpt else Path(args.out_dir) / "ckpt.pt"
    try:
        out = writable_results_path(args, path)
        manager = task_manager(args.tasks, args.include_path)
        model, tokenizer, ckpt = load_for_inference(args.init_from, path, args.device, args.cache_dir)
        tasks = load_tasks(manager, args.tasks)
    except (FileNotFoundError, ValueError, DownloadError) as e:  # a missing checkpoint, an unknown task, no network, ...
        die(e)
    lm = HarnessLM(model, tokenizer, args.device, args.dtype, args.batch_size)
    results = simple_evaluate(lm, tasks=tasks, task_manager=manager, limit=args.limit, log_samples=False)
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))

    scores = task_scores(results)
    record = dict(checkpoint=str(path) if args.init_from == "resume" else args.init_from,
                  iter_num=(ckpt or {}).get("iter_num"), model_args=asdict(model.config), tokenizer=tokenizer.name,
                  tasks=args.tasks, limit=args.limit, batch_size=args.batch_size, dtype=args.dtype,
                  command=" ".join(["python eval.py", *argv]), **provenance(args.device),
                  scores={k: v for k, (v, _) in scores.items()}, harness=results)
    text = json.dumps(record, indent=1, default=handle_non_serializable) + "\n"
    try:
        write_atomic(out, lambda f: f.write(text.encode()))
    except OSError as e:  # a full disk, or the folder changed during the evaluation: the table above has the scores
        die(f"cannot write the results to {out} ({e.strerror or e}); the table above holds the scores")
    print(f"wrote {out}")
    log_to_wandb(ckpt, scores, out)
    return record


if __name__ == "__main__":
    main()
