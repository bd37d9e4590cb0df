"""Works are cited by their bibliography key (docs/bibliography.md), and nothing links
outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A citation: a word (or two joined by &) and a locator.
CITATION = re.compile(r"([A-Za-z][\w.-]*(?: & [A-Z]\w+)?)(?:'s)? (?:§|Fig\. |Table |Listing )\d")
#: Words that read as citations but are not (a sentence's words before a locator).
NOT_CITATIONS = {"of", "and", "every", "into", "in", "see", "its"}
LINK = re.compile(r"https?://")


def _keys() -> set[str]:
    rows = (ROOT / "docs" / "bibliography.md").read_text().splitlines()
    return {r.split("|")[1].strip() for r in rows if r.startswith("| ") and not r.startswith("| key") and "---" not in r}


def _sources() -> list[Path]:
    files = [*ROOT.glob("python/tiermem/**/*.py"), *ROOT.glob("crates/*/src/**/*.rs"), *ROOT.glob("docs/*.md")]
    return files + [ROOT / n for n in ("ARCHITECTURE.md", "README.md", "CONTRIBUTING.md")]


def test_every_citation_names_a_bibliography_key() -> None:
    keys = _keys()
    assert {"thesis", "Bandana", "Arima & Schulz", "H2M", "TinyLFU"} <= keys
    unknown = []
    for f in _sources():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in CITATION.finditer(line):
                word = m.group(1)
                key = word if word in keys else word.lower() if word.lower() in keys else None
                if key is None and word.lower() not in NOT_CITATIONS:
                    unknown.append(f"{f.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    assert not unknown, "cite works by a key of docs/bibliography.md:\n" + "\n".join(unknown)


def test_nothing_links_outside_the_repository() -> None:
    links = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in _sources()
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if LINK.search(line)
    ]
    assert not links, links


def test_the_checker_catches_an_unknown_work() -> None:
    m = CITATION.search("as in Smith §3.2, and the paper's Table 2")
    assert m is not None and m.group(1) == "Smith"
    assert [x.group(1) for x in CITATION.finditer("the paper's Table 2")] == ["paper"]
