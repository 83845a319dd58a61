"""
nanoGPT-style configuration: a script's defaults, then config files, then --key=value.

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

Arguments apply left to right. A config file is Python that assigns some of the keys; a
--key=value override is parsed with ast.literal_eval (a string key takes the text as it is).
Every value must have its default's type (an int is fine where a float is expected). An unknown
key or a bad value is a one-line error and exit status 2; --help lists every key.
"""

import ast
import re
import sys
from pathlib import Path

from common import die


KINDS = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}  # what a setting of each type takes


def same_kind(value, default):
    """Whether value has default's type, an int where a float is expected too (a bool is no int here)."""
    return type(value) is type(default) or (type(default) is float and type(value) is int)


def checked(key, value, defaults, where):
    """value, if key is known and value has the default's type; else exit with a one-line error."""
    if key not in defaults:
        die(f"unknown config key {key!r}{where} (see --help)", 2)
    default = defaults[key]
    if isinstance(default, float) and type(value) is int:
        try:
            value = float(value)
        except OverflowError:  # an integer past a float's range (no repr: one of 4300+ digits cannot be printed)
            die(f"{key}{where} is too large for a float (the largest is about 1.8e308): give a number "
                f"like its default {default!r}", 2)
    if not same_kind(value, default):
        die(f"{key}={value!r}{where} should be {KINDS[type(default)]}, like its default {default!r}", 2)
    return value


def read_value(key, text, defaults):
    """The value --key=text stands for: the text itself for a string setting, else a Python literal.
    KeyError for a key defaults lacks, ValueError or SyntaxError for text that is no literal."""
    return text if isinstance(defaults[key], str) else ast.literal_eval(text)


def parse_value(key, text, defaults):
    """read_value, with a one-line error for a key or a value the script would not take."""
    if key not in defaults:
        die(f"unknown config key {key!r} (see --help)", 2)
    try:
        return read_value(key, text, defaults)
    except (ValueError, SyntaxError):
        die(f"cannot read --{key}={text}: give a Python literal like its default {defaults[key]!r}", 2)


def script_defaults(script):
    """A script's defaults read from its source, without running it: the `key = value` lines of its
    config section (the literal bools, ints, floats and strings after its imports, up to the first
    other statement), as train.py collects them. compare.py learns train.py's keys so."""
    defaults = {}
    for node in ast.parse(Path(script).read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (isinstance(node, ast.Expr) and not defaults):
            continue  # imports and the docstring come before the config section
        setting = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        try:
            value = ast.literal_eval(node.value) if setting else None
        except ValueError:  # computed: not a setting
            value = None
        if not isinstance(value, (bool, int, float, str)):
            break  # the end of the config section
        defaults[node.targets[0].id] = value
    return defaults


def help_text(defaults, script):
    """Every key with its default and the comment on its line in the script."""
    comments = {}
    with open(script) as f:
        for line in f:
            m = re.match(r"(\w+) = .*?  # (.*)$", line.rstrip())
            if m:
                comments[m.group(1)] = m.group(2)
    width = max(len(f"{k}={v!r}") for k, v in defaults.items())
    lines = [f"usage: python {script.rsplit('/', 1)[-1]} [config/file.py ...] [--key=value ...]", "", "keys (default):"]
    lines += [f"  {f'{k}={v!r}':<{width}}  {comments.get(k, '')}".rstrip() for k, v in defaults.items()]
    return "\n".join(lines)


def configure(defaults, argv, script):
    """Apply config files and --key=value overrides in argv to a copy of defaults.
    Returns (config, explicit): the final values, and the set of keys a file or override set."""
    config, explicit = dict(defaults), set()
    for arg in argv:
        if arg in ("-h", "--help"):
            print(help_text(defaults, script))
            sys.exit(0)
        if not arg.startswith("--"):  # a config file
            try:
                with open(arg, encoding="utf-8") as f:  # Python source is UTF-8
                    source = f.read()
            except OSError as e:
                key = arg.lstrip("-").split("=")[0]
                meant = f": did you mean --{arg.lstrip('-')}?" if "=" in arg and key in defaults else ""  # (n_layer=2)
                die(f"cannot read config file {arg} ({e.strerror}){meant}", 2)
            except UnicodeDecodeError:  # binary: most likely `python train.py out/ckpt.pt`, meant as init_from
                die(f"{arg} is not a Python config file (a checkpoint? pass it as --init_from={arg})", 2)
            namespace = {}
            try:
                exec(compile(source, arg, "exec"), namespace)
            except Exception as e:
                die(f"config file {arg} does not run: {type(e).__name__}: {e}", 2)
            for key, value in namespace.items():
                if not key.startswith("_") and not callable(value) and type(value).__name__ != "module":
                    config[key] = checked(key, value, defaults, f" in {arg}")
                    explicit.add(key)
        else:
            key, eq, text = arg[2:].partition("=")
            if not eq:
                die(f"expected --key=value, got {arg!r}", 2)
            config[key] = checked(key, parse_value(key, text, defaults), defaults, "")
            explicit.add(key)
    return config, explicit
