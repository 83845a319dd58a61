"""common.py: what the scripts share is written once, and every script uses it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402

SCRIPTS = ("train.py", "compare.py", "prepare.py", "sample.py", "fold.py", "bench.py")


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
