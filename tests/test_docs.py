"""
The documentation as tests: every relative link and image in README.md and docs/ points at a file
that exists (and a #heading at a heading of that file), and every test they name exists; every
heading the code cites by name exists; the README's quick start is what CI runs, or is run here as written, in a copy of the
repository.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI = REPO / ".ci" / "run"


def markdown_files():
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


# -----------------------------------------------------------------------------
# reading markdown

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)


def blocks_removed(text):
    """The text with fenced and indented code blocks and HTML comments blanked out, lines kept."""
    blank = lambda m: "\n" * m.group(0).count("\n")
    out, in_code, after_blank = [], False, True
    for line in COMMENT.sub(blank, FENCE.sub(blank, text)).split("\n"):
        if not line.strip():
            out.append("")
            after_blank = True  # a blank line keeps an indented block open
            continue
        in_code = line.startswith(("    ", "\t")) and (in_code or after_blank)
        after_blank = False
        out.append("" if in_code else line)
    return "\n".join(out)


def prose(text):
    """The text outside code: code blocks, inline code and HTML comments blanked out."""
    return re.sub(r"`[^`\n]*`", lambda m: "x" * len(m.group(0)), blocks_removed(text))


def slug(heading):
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"`|\*\*?", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path):
    """The headings of a markdown file, in order (code blocks left out)."""
    text = blocks_removed(path.read_text())
    return [m.group(2).strip() for m in re.finditer(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*$", text, re.M)]


def anchors(path):
    """Every #anchor a link to path may use, numbered for repeats as GitHub does."""
    seen, out = {}, set()
    for h in headings(path):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href|srcset)\s*=\s*[\"']([^\"']+)[\"']", re.I)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def links(path):
    """(line number, target) of every link and image of a markdown file, outside code."""
    text = prose(path.read_text())
    found = []
    for pattern in (LINK, HTML, REFERENCE):
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return sorted(found)


def broken_links(path):
    """'file:line: target (why)' for each relative link of path that points at nothing."""
    bad = []
    for line, target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # a URL (https:, mailto:, ...): not a file of this repository
        file, _, anchor = target.partition("#")
        file = unquote(file)
        dest = path if not file else (REPO / file.lstrip("/") if file.startswith("/") else path.parent / file).resolve()
        where = f"{path.relative_to(REPO)}:{line}: {target}"
        if not target.strip("#"):
            bad.append(f"{where} (empty)")
        elif REPO.resolve() not in (dest, *dest.parents):
            bad.append(f"{where} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            bad.append(f"{where} (no heading #{anchor} in {dest.relative_to(REPO.resolve())})")
    return bad


def section(path, title):
    """The text of the '## title' section of a markdown file, up to the next '## '."""
    text = path.read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{path.name} has no '## {title}' section"
    return m.group(1)


# -----------------------------------------------------------------------------
# links and images

def test_every_relative_link_and_image_points_at_a_file():
    files = markdown_files()
    assert {"README.md", "docs/speed.md", "docs/results.md"} <= {str(p.relative_to(REPO)) for p in files}
    bad = [b for path in files for b in broken_links(path)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_check_sees_what_it_should(tmp_path, monkeypatch):
    """The checker itself: it finds links, images and anchors, and ignores code, comments and URLs."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "fig.png").write_bytes(b"png")
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "# Doc", "## The `math`: one (route)", "",
        "[ok](fig.png) ![ok](./fig.png) [ok](#the-math-one-route) [ok](doc.md#doc) [web](https://x.org/a.png)",
        '<img src="fig.png" width="49%"> `[code](gone.png)` <!-- ![comment](gone.png) -->',
        "", "    ![indented code](gone.png)", "", "```", "![fenced](gone.png)", "```", "",
        "[missing](gone.png) ![missing](sub/gone.png) [anchor](#nowhere) <img src=\"gone.svg\"> [up](../x.md) [e]()",
    ]))
    bad = broken_links(doc)
    assert sorted(b.split(": ", 1)[1] for b in bad) == sorted([
        "gone.png (no such file)", "sub/gone.png (no such file)", "#nowhere (no heading #nowhere in doc.md)",
        "gone.svg (no such file)", "../x.md (outside the repository)", " (empty)"])
    assert all(b.startswith("doc.md:13: ") for b in bad)


def test_each_summary_links_the_page_it_expands():
    for title, page in (("Results", "docs/results.md"), ("Speed", "docs/speed.md"),
                        ("Reliability", "docs/reliability.md")):
        assert f"]({page})" in section(README, title), f"README's {title} does not link {page}"


def test_the_tests_the_docs_name_exist():
    """Every test file and test function README.md and docs/ name in code (`test_x.py`, `test_x.py::test_y`,
    `test_y`) exists, in that file where one is named: a renamed test leaves the claim it backs unchecked.
    A file the text says was "then named" so is a former name."""
    tests = {p.name: re.findall(r"^def (test_\w+)", p.read_text(), re.M) for p in (REPO / "tests").glob("test_*.py")}
    every = {name for names in tests.values() for name in names}
    named = re.compile(r"`(?:tests/)?(?:(test_\w+\.py)(?:::(test_\w+))?|(test_\w+))`")
    bad, seen = [], 0
    for path in markdown_files():
        text = path.read_text()
        for m in named.finditer(text):
            file, function = m.group(1), m.group(2) or m.group(3)
            if text[max(0, m.start() - 11):m.start()] == "then named ":
                continue
            seen += 1
            if (file and file not in tests) or (function and function not in (tests.get(file) if file else every)):
                bad.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert seen > 20 and not bad, "named tests that do not exist:\n" + "\n".join(bad)


def test_headings_the_code_cites_exist():
    """Docstrings and comments cite the docs by heading, e.g. (README, "Exact equivalences"): each
    cited heading must exist (a heading that starts with the cited words) in the file it names."""
    cite = re.compile(r"\b(README|docs/[\w/.-]+\.md)(?:'s)?,?\s+\"([^\"]+)\"")
    sources = [*REPO.glob("*.py"), *(REPO / "tests").glob("*.py"), *(REPO / "config").glob("*.py")]
    cited, missing = 0, []
    for source in sources:
        for m in cite.finditer(source.read_text()):
            doc = README if m.group(1) == "README" else REPO / m.group(1)
            name = " ".join(re.sub(r"\n\s*#?", " ", m.group(2)).split())
            cited += 1
            if not doc.exists() or not any(" ".join(h.replace("`", "").split()).startswith(name) for h in headings(doc)):
                missing.append(f"{source.name}: {m.group(1)} \"{name}\"")
    assert cited >= 5 and not missing, "cited headings that do not exist:\n" + "\n".join(missing)


# -----------------------------------------------------------------------------
# the quick start

def commands(text):
    """The shell commands of a script or code block, each as its words: one per &&, || or ;,
    comments and line continuations dropped, python3 read as python and `python -m pip` as pip."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = []
        for word in [*lexer, "&&"]:
            if word not in ("&&", "||", ";"):
                words.append("python" if word == "python3" else word)
                continue
            if words[:3] == ["python", "-m", "pip"]:
                words = ["pip", *words[3:]]
            if words and not re.match(r"^\w+=", words[0]) and words[0] not in ("set", "cd", "export"):
                out.append(words)
            words = []
    return out


def quick_start():
    blocks = re.findall(r"^```(?:bash|sh|shell)?\n(.*?)^```", section(README, "Quick start"), re.S | re.M)
    assert blocks, "README's quick start has no code block"
    return [c for block in blocks for c in commands(block)]


def requirements(words):
    """What a `pip install` installs: ('spec', torch==2.13.0) and ('file', requirements.txt) items, the
    files' own -r includes followed."""
    items, args = set(), [w for w in words[2:] if w not in ("-q", "--quiet", "-U", "--upgrade")]
    while args:
        word = args.pop(0)
        if word in ("-r", "--requirement"):
            items |= requirement_file(args.pop(0))
        elif not word.startswith("-"):
            items.add(("spec", word))
    return items


def requirement_file(name):
    items = {("file", name)}
    for line in (REPO / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            items |= requirement_file(line.split(None, 1)[1])
        elif line:
            items.add(("spec", line))
    return items


# Quick-start commands that CI does not run are run here, as written, plus these cheap overrides
# (the run's length only). A script without an entry makes test_quick_start_is_exercised fail.
CHEAP = {"train.py": ["--max_iters=2", "--eval_iters=2", "--log_interval=1"]}


def test_quick_start_is_exercised():
    """Each quick-start command is one that .ci/run runs (a pip install: every requirement it names
    is one CI installs), or one that test_quick_start_runs_as_written runs."""
    ci = commands(CI.read_text())
    ci_installs = set().union(*(requirements(c) for c in ci if c[:2] == ["pip", "install"]))
    qs = quick_start()
    assert any(c[:2] == ["pip", "install"] for c in qs) and any(c[0] == "python" for c in qs)
    for words in qs:
        if words[:2] == ["pip", "install"]:
            assert requirements(words) <= ci_installs, f"{shlex.join(words)}: .ci/run does not install {requirements(words) - ci_installs}"
        elif words not in ci:
            assert words[0] == "python" and words[1] in CHEAP, (
                f"quick start `{shlex.join(words)}` is neither in .ci/run nor run by a test (add its script to CHEAP)")


def test_quick_start_runs_as_written(tmp_path):
    """`python train.py` with no arguments, on a fresh copy of the repository (no data/, no out/):
    it prepares pydocs itself, trains, saves out/ckpt.pt and prints how to sample from it."""
    for file in REPO.glob("*.py"):
        shutil.copy(file, tmp_path)
    shutil.copytree(REPO / "config", tmp_path / "config")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    ran = 0
    for words in quick_start():
        if words[0] != "python" or words[1] not in CHEAP:
            continue  # run by CI
        result = subprocess.run([sys.executable, *words[1:], *CHEAP[words[1]]], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{shlex.join(words)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        ran += 1
        if words[1:] == ["train.py"]:
            assert (tmp_path / "data" / "pydocs" / "meta.json").exists() and (tmp_path / "out" / "ckpt.pt").exists()
            assert "sample from it: python sample.py --out_dir=out" in result.stdout
    assert ran
