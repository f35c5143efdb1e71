"""Every ```python block of docs/*.md and README.md runs.

The blocks of one file run in order in one namespace (a later block may use what an earlier one defined). A block
opts out only with an HTML comment ``<!-- skip: reason -->`` on the last non-blank line before its fence; the
reason is mandatory. The blocks run with the repository root as the working directory.
"""

import pathlib
import re
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
README = ROOT / "README.md"

FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*$")
SKIP = re.compile(r"^<!--\s*skip:\s*(\S.*?)\s*-->\s*$")


def python_blocks(text):
    """[(first line number, source, skip reason or None)] of the ```python blocks of a Markdown text."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i].strip()) if lines[i].startswith("```") else None
        if not match:
            i += 1
            continue
        language, start = match.group(1).lower(), i + 1
        j = start
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"unclosed code fence opened at line {i + 1}")
        if language in ("python", "py"):
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            skip = SKIP.match(lines[k].strip()) if k >= 0 else None
            blocks.append((start + 1, "\n".join(lines[start:j]) + "\n", skip.group(1) if skip else None))
        i = j + 1
    return blocks


def test_the_block_parser():
    text = "x\n```python\na = 1\n```\n<!-- skip: needs a GPU -->\n\n```python\nb = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n", None), (8, "b = 2\n", "needs a GPU")]


def test_there_are_docs_to_run():
    names = {p.name for p in DOCS}
    assert {"index.md", "guide.md", "api.md", "semantics.md", "limitations.md", "faq.md"} <= names
    assert sum(len(python_blocks(p.read_text(encoding="utf-8"))) for p in DOCS) >= 10


def test_skips_are_rare_and_explained():
    skipped = [(p.name, line) for p in DOCS for line, _, reason in python_blocks(p.read_text(encoding="utf-8"))
               if reason is not None]
    assert len(skipped) <= 3, skipped


@pytest.mark.parametrize("path", DOCS + [README], ids=lambda p: p.name)
def test_python_blocks_run(path, monkeypatch):
    if not path.exists():
        pytest.skip(f"{path.name} does not exist (yet)")
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": f"docs_{path.stem}"}
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    for line, source, skip in blocks:
        if skip is not None:
            continue
        code = compile(source, f"{path.name}:{line}", "exec")
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            try:
                exec(code, namespace)
            except BaseException as error:  # SystemExit too: a block must not end the interpreter
                raise AssertionError(f"{path.name}, block at line {line} failed: {type(error).__name__}: "
                                     f"{error}\n---\n{source}") from error


def test_environment_table_lists_exactly_the_variables_mmaemu_reads():
    """The guide's table, mmaemu.environment.VARIABLES and the MMAEMU_* names in the package's code agree."""
    from mmaemu import environment

    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    section = guide.split("\n## Environment variables\n")[1].split("\n## ")[0]
    documented = re.findall(r"^\| `(MMAEMU_[A-Z0-9_]+)` \|", section, re.M)
    assert documented == list(environment.NAMES)
    in_code = {name for path in (ROOT / "mmaemu").rglob("*.py")
               for name in re.findall(r"MMAEMU_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))}
    assert in_code == set(environment.NAMES), "a variable read in mmaemu/ is missing from mmaemu/environment.py"
