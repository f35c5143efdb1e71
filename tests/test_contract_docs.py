"""The contract ships with the code: every section of ``semantics.md`` / ``platform.md`` that the package, the tests
or the scripts cite exists in docs/contract/.

A citation is the file name followed by one or more section references: ``semantics.md b.1``, ``semantics.md (e)``,
``semantics.md f.2.11`` (rule 11 of f.2), ``semantics.md f.1-f.6``, ``semantics.md d.1/d.2``, ``platform.md 3.9``,
``platform.md section 1``, ``platform.md sections 2-4``.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract"
CITING = sorted([*(ROOT / "mmaemu").rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "scripts").glob("*.py"),
                 *(ROOT / "docs").glob("*.md"), ROOT / "README.md"])

_SEMANTICS_REF = r"(?:\([a-z]\)|[a-z](?:\.\d+)*|conventions)"
_PLATFORM_REF = r"\d+(?:\.\d+)*"
_JOIN = r"(?:\s*[-–/]\s*|,\s+(?:and\s+)?|\s+and\s+)"
CITATION = {
    kind: re.compile(rf"{kind}\.md`?,?\s+(?:sections?\s+)?({ref}(?!\w)(?:{_JOIN}{ref}(?!\w))*)")
    for kind, ref in (("semantics", _SEMANTICS_REF), ("platform", _PLATFORM_REF))
}


def sections(text, numbered):
    """{section id: body} of a contract file: "a".."h", "b.1", ... for semantics.md; "1", "3.9", ... for platform.md."""
    header = re.compile(r"^##\s+(\d+)\.\s" if numbered else r"^##\s+\(([a-h])\)\s")
    sub = re.compile(r"^###\s+(\d+\.\d+)\s" if numbered else r"^###\s+([a-h]\.\d+)\s")
    found, current = {}, None
    for line in text.splitlines():
        match = header.match(line) or sub.match(line)
        if match:
            current = match.group(1)
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


SEMANTICS = sections((CONTRACT / "semantics.md").read_text(encoding="utf-8"), numbered=False)
PLATFORM = sections((CONTRACT / "platform.md").read_text(encoding="utf-8"), numbered=True)


def exists(kind, ref):
    """Whether the section ``ref`` of ``kind`` ("semantics"/"platform") is in the shipped contract."""
    ref = ref.strip("()")
    if kind == "semantics" and ref == "conventions":
        return "Conventions used throughout" in (CONTRACT / "semantics.md").read_text(encoding="utf-8")
    table = SEMANTICS if kind == "semantics" else PLATFORM
    parts = ref.split(".")
    if ref in table:
        return True
    if kind == "semantics" and len(parts) >= 2:  # f.2.11: rule 11 of f.2; e.4: rule 4 of (e)
        body = table.get(".".join(parts[:-1]), "")
        return re.search(rf"(?:^|\s){parts[-1]}\.\s", body) is not None
    return False


def references(match_text):
    return [r for r in re.split(_JOIN, match_text) if r]


def citations():
    found = []
    for path in CITING:
        text = path.read_text(encoding="utf-8")
        for kind, pattern in CITATION.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", kind, match.group(1)))
    return found


def test_the_contract_has_its_sections():
    assert set("abcdefgh") <= set(SEMANTICS) and {"b.1", "d.3", "f.2", "f.9"} <= set(SEMANTICS)
    assert {str(n) for n in range(1, 10)} <= set(PLATFORM) and {"3.1", "3.10", "4.4", "6.1"} <= set(PLATFORM)
    assert exists("semantics", "f.2.11") and exists("semantics", "f.2.14") and not exists("semantics", "f.2.15")
    assert exists("semantics", "e.4") and not exists("semantics", "e.9")
    assert not exists("semantics", "b.9") and not exists("platform", "3.11") and not exists("platform", "10")


def test_the_citation_parser():
    text = ("(semantics.md b.1, b.2) semantics.md (c)/(d) semantics.md f.1-f.6 platform.md sections 2-4 "
            "platform.md 3.9: semantics.md, sections a-e semantics.md c.4, applied semantics.md is")
    got = [(kind, references(m.group(1))) for kind, p in CITATION.items() for m in p.finditer(text)]
    assert got == [("semantics", ["b.1", "b.2"]), ("semantics", ["(c)", "(d)"]), ("semantics", ["f.1", "f.6"]),
                   ("semantics", ["a", "e"]), ("semantics", ["c.4"]), ("platform", ["2", "4"]), ("platform", ["3.9"])]


def test_there_are_citations_to_check():
    assert len(citations()) >= 80


@pytest.mark.parametrize("kind", ["semantics", "platform"])
def test_every_cited_section_exists(kind):
    missing = [(where, ref) for where, k, text in citations() if k == kind for ref in references(text)
               if not exists(kind, ref)]
    assert not missing, missing
