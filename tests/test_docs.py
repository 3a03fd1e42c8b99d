"""The README is a first screen and docs/ holds the rest: its links resolve (files and #anchors),
its first 40 lines give the two commands the Makefile really has, and it stays short."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FIRST_SCREEN = 40
MAX_README_BYTES = 12_500

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a bracket is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (but - and _), spaces -> -."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    text = FENCE.sub("", path.read_text())
    seen: dict = {}
    out = set(HTML_ID.findall(text))
    for h in HEADING.findall(text):
        s = _slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def _relative_links(path: Path) -> list:
    return [t for t in LINK.findall(_prose(path.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not files


def _broken(path: Path) -> list:
    broken = []
    for target in _relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading or id #{anchor} in {dest.name})")
    return broken


def test_slug_and_link_finder_match_github_on_known_cases(tmp_path):
    assert _slug("The `cpu` study") == "the-cpu-study"
    assert _slug("Router variants (notebook 12)") == "router-variants-notebook-12"
    assert _slug("Dask: the study's runs on a cluster") == "dask-the-studys-runs-on-a-cluster"
    page = tmp_path / "p.md"
    page.write_text("# A\n## A\n[x](p.md#a-1) [y](#b) `[z](nowhere.md)`\n```\n[w](gone.md)\n```\n")
    assert _relative_links(page) == ["p.md#a-1", "#b"]
    assert _broken(page) == ["#b (no heading or id #b in p.md)"]


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert _broken(path) == []


def test_readme_links_into_every_docs_file():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _relative_links(README)}
    assert DOCS and [d.name for d in DOCS if d.resolve() not in linked] == []


def test_the_first_screen_gives_both_commands_and_the_makefile_has_them():
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    commands = {m.group(1) for line in first for m in [re.match(r"^make (\w+)\b", line)] if m}
    assert {"study", "test"} <= commands, first
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert commands <= targets


def test_readme_is_short():
    assert README.stat().st_size < MAX_README_BYTES


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_numbers(path):
    assert re.findall(r"(?i)\bsessions? \d+", path.read_text()) == []


def test_the_readme_answer_is_the_glance_sentences_within_150_words():
    """issue #40: the README's answer was 285 words; it is now the report's first-screen sentences
    (outputs/<preset>/answer.md, pasted between the markers), at most 150 words."""
    from studylib.study.comparisons.glance import README_WORDS, words

    m = re.search(r"<!-- answer: outputs/\w+/answer\.md -->\n(.*?)\n<!-- /answer -->", README.read_text(), re.S)
    assert m, "the README's answer sits between <!-- answer: outputs/<preset>/answer.md --> and <!-- /answer -->"
    assert 0 < words(m.group(1)) <= README_WORDS, words(m.group(1))
