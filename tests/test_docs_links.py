"""Issue #31, item 9: the documentation's cross-references resolve, and the operators' documents speak to users.

Checked in README.md, CONTRIBUTING.md, CHANGELOG.md and every docs/*.md:

- every relative markdown link (inline or a reference definition) names an existing file, and its ``#anchor`` a
  heading of that file, by GitHub's anchor rules (lower case; punctuation but ``-`` and ``_`` dropped; a space is a
  ``-``; a repeated heading gets ``-1``, ``-2``, ...);
- every path a document mentions in its text (``docs/foo.md``, ``benchmarks/README.md``, ``CHANGELOG.md``, in
  backticks or not; with ``#anchor`` too) exists;
- every section reference, a document followed by a quoted heading or a section number (``docs/x.md, "Final
  table"``, ``[docs/x.md](docs/x.md) ("Release by release")``, ``README, "Supported SGLang releases"``,
  ``reliability.md, section 0``), names a heading that exists in that document: a heading that starts with the quoted
  words (``"Release by release"`` matches ``## Release by release (0.5.15.post1 to ...)``).

And: docs/production.md covers rollout, parity, rollback, metrics and troubleshooting; the package index page
(README.pypi.md, rendered from README.md) carries install, parity, rollback and metrics as text, not as links; the
operators' documents (README.md, docs/production.md, docs/host-notes.md, CHANGELOG.md) name no development runs,
sessions, issue numbers, development machines or files outside the repository.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
)
#: Documents for operators and users: no development story in them.
USER_DOCS = ("README.md", "docs/production.md", "docs/host-notes.md", "CHANGELOG.md")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
#: ``[text](target "title")`` and ``![alt](src)``; the text may hold one level of brackets.
_INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
#: A repository path of a markdown document named in the text.
_PATH = re.compile(
    r"(?<![\w./-])((?:docs|benchmarks|tests|examples|sglang_moe_plugins)/[\w./-]*?\.md|(?:README|CHANGELOG|CONTRIBUTING)\.md)"
    r"(#[\w-]+)?(?![\w/-])"
)
#: A document, then a quoted heading (or several) or ``section N``.
_SECTION_REF = re.compile(
    r"(?<![\w/.-])(?P<doc>(?:[\w.-]+/)*[\w.-]+\.md|README|CHANGELOG|CONTRIBUTING)(?:'s)?\)?"
    r"(?:\s*,\s*|\s*:\s*|\s+\(|\s*\(|\s+)(?:section\s+(?:(?P<num>\d+)\b|(?P<q1>\"[^\"]+\"))|(?P<quotes>\"[^\"]+\"(?:\s*(?:,|and)\s*\"[^\"]+\")*))"
)


@dataclass(frozen=True)
class Doc:
    path: Path
    #: Lines outside fenced code blocks, with their line numbers.
    prose: tuple[tuple[int, str], ...]
    #: Every line, fenced code included.
    lines: tuple[str, ...]
    headings: tuple[str, ...]
    anchors: frozenset[str]

    @property
    def name(self) -> str:
        return _rel(self.path)


def _rel(path: Path) -> str:
    """``path`` as the repository names it (or as given, for a file outside it)."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the ``-N`` of a repeated heading)."""
    text = _INLINE_LINK.sub(lambda m: m.group(1), heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _plain(heading: str) -> str:
    text = _INLINE_LINK.sub(lambda m: m.group(1), heading)
    return re.sub(r"\s+", " ", text.replace("`", "").replace("*", "")).strip()


def load(path: Path) -> Doc:
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[tuple[int, str]] = []
    headings: list[str] = []
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence: str | None = None
    for number, line in enumerate(lines, 1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        prose.append((number, line))
        anchors.update(_HTML_ANCHOR.findall(line))
        found = _HEADING.match(line)
        if found:
            headings.append(_plain(found.group(2)))
            base = github_anchor(found.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return Doc(path, tuple(prose), tuple(lines), tuple(headings), frozenset(anchors))


_LOADED: dict[Path, Doc] = {}


def doc_at(path: Path) -> Doc:
    path = path.resolve()
    if path not in _LOADED:
        _LOADED[path] = load(path)
    return _LOADED[path]


def _resolve(base: Path, target: str) -> Path | None:
    """``target`` relative to the document's folder, or else to the repository root (how the docs write paths)."""
    for folder in (base.parent, ROOT):
        candidate = (folder / target).resolve()
        if candidate.exists():
            return candidate
    return None


def _check_anchor(where: str, target: Path, anchor: str) -> list[str]:
    if target.suffix != ".md" or target.is_dir():
        return [f"{where}: #{anchor} points into {_rel(target)}, which has no headings"]
    found = doc_at(target)
    if anchor not in found.anchors:
        return [f"{where}: no heading with anchor #{anchor} in {found.name} (anchors: {sorted(found.anchors)})"]
    return []


def link_problems(doc: Doc) -> list[str]:
    """Every relative link of ``doc`` that does not resolve (file, then anchor)."""
    problems: list[str] = []
    for number, line in doc.prose:
        text = _CODE_SPAN.sub("", line)
        targets = [m.group(2) for m in _INLINE_LINK.finditer(text)]
        definition = _REF_DEF.match(text)
        if definition:
            targets.append(definition.group(1))
        for target in targets:
            where = f"{doc.name}:{number}: link ({target})"
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = doc.path.resolve() if not path else _resolve(doc.path, path)
            if resolved is None:
                problems.append(f"{where}: no file {path}")
            elif anchor:
                problems += _check_anchor(where, resolved, anchor)
    return problems


def path_problems(doc: Doc) -> list[str]:
    """Every repository path of a markdown file named in ``doc``'s text (code included) that does not exist."""
    problems: list[str] = []
    for number, line in enumerate(doc.lines, 1):
        for match in _PATH.finditer(line):
            path, anchor = match.group(1), (match.group(2) or "")[1:]
            where = f"{doc.name}:{number}: mention {match.group(0)}"
            target = (ROOT / path).resolve()
            if not target.exists():
                problems.append(f"{where}: no file {path} in the repository")
            elif anchor:
                problems += _check_anchor(where, target, anchor)
    return problems


def _paragraphs(doc: Doc) -> list[tuple[int, str]]:
    """Prose joined into paragraphs (a reference may span lines), links replaced by their targets."""
    out: list[tuple[int, str]] = []
    start, buf = 0, []
    for number, line in [*doc.prose, (0, "")]:
        if line.strip():
            if not buf:
                start = number
            buf.append(line.strip())
            continue
        if buf:
            text = " ".join(buf)
            text = _INLINE_LINK.sub(lambda m: m.group(2).partition("#")[0] or m.group(1), text)
            out.append((start, text.replace("`", "")))
        buf = []
    return out


def section_problems(doc: Doc) -> list[str]:
    """Every section reference in ``doc`` naming a heading its document lacks."""
    problems: list[str] = []
    for number, text in _paragraphs(doc):
        for match in _SECTION_REF.finditer(text):
            name = match.group("doc")
            where = f"{doc.name}:{number}: {match.group(0)!r}"
            target = _resolve(doc.path, name if name.endswith(".md") else f"{name}.md")
            if target is None:
                problems.append(f"{where}: no file {name}")
                continue
            if target.suffix != ".md":
                continue
            headings = [h.lower() for h in doc_at(target).headings]
            unnumbered = [re.sub(r"^\d+\.\s+", "", h) for h in headings]  # "Versioning" names "## 9. Versioning"
            if match.group("num"):
                if not any(re.match(rf"{match.group('num')}[.)\s]", h) for h in headings):
                    problems.append(f"{where}: no section {match.group('num')} in {doc_at(target).name}")
                continue
            for quoted in re.findall(r"\"([^\"]+)\"", match.group("q1") or match.group("quotes")):
                wanted = re.sub(r"\s+", " ", quoted.replace("`", "")).strip().lower()
                if not any(h.startswith(wanted) for h in headings + unnumbered):
                    problems.append(f"{where}: no heading starting {quoted!r} in {doc_at(target).name}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(path):
    problems = link_problems(doc_at(path))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_mentioned_paths_exist(path):
    problems = path_problems(doc_at(path))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_section_references_resolve(path):
    problems = section_problems(doc_at(path))
    assert not problems, "\n".join(problems)


#: Scripts whose comments point into the documentation.
SCRIPTS = [p for p in (ROOT / "dev.sh", ROOT / ".ci" / "run") if p.exists()]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_script_comments_point_at_existing_sections(path):
    """The development scripts' comments name documents and sections too (``README, "..."``)."""
    text = path.read_text(encoding="utf-8")
    doc = Doc(path, tuple(enumerate(text.splitlines(), 1)), tuple(text.splitlines()), (), frozenset())
    problems = section_problems(doc) + path_problems(doc)
    assert not problems, "\n".join(problems)


def test_the_checker_finds_what_it_must(tmp_path):
    """The checks themselves: each catches its kind of broken reference, and accepts the working forms."""
    target = tmp_path / "target.md"
    target.write_text(
        "# Title\n\n## Release by release (0.5.16 to 0.5.23)\n\n## 0. Failure policy\n\n## Notes\n\n## Notes\n"
        "\n## 9. Versioning\n"
    )
    source = tmp_path / "source.md"
    source.write_text(
        "[ok](target.md#release-by-release-0516-to-0523) [ok](target.md#notes-1) [ok](#here)\n"
        '[target.md](target.md) ("Release by release"), target.md, section 0; target.md, "Notes"; target.md, "Versioning"\n'
        "\n# Here\n\n"
        "[bad](missing.md) [bad](target.md#nope) `[code](missing2.md)`\n\n"
        'target.md, "Supported releases"; target.md,\nsection 7\n\n'
        "```\n[fenced](missing3.md)\n```\n"
    )
    doc = load(source)
    links = link_problems(doc)
    assert len(links) == 2 and "no file missing.md" in links[0] and "#nope" in links[1], links
    sections = section_problems(doc)
    assert len(sections) == 2 and "'Supported releases'" in sections[0] and "no section 7" in sections[1], sections
    assert github_anchor("`SGLANG_MOE_PLUGINS_STOCK`: the *rollback* switch (per op)") == (
        "sglang_moe_plugins_stock-the-rollback-switch-per-op"
    )


# -- the operators' documents -------------------------------------------------------------------------------------
PRODUCTION_SECTIONS = ("rollout", "parity", "rollback", "metrics", "troubleshooting")


def test_production_page_covers_operations():
    page = ROOT / "docs" / "production.md"
    assert page.exists(), "docs/production.md, the operators' page, is missing"
    headings = " | ".join(h.lower() for h in doc_at(page).headings)
    missing = [s for s in PRODUCTION_SECTIONS if s not in headings]
    assert not missing, f"docs/production.md has no section on {missing}; headings: {headings}"
    text = page.read_text()
    for needed in (
        "SGLANG_MOE_PLUGINS_STOCK",
        "SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR=stock",
        "SGLANG_MOE_PLUGINS_ALLOW",
        "SGLANG_PLUGINS",
        "sglang_moe_plugins_calls_total",
        "sglang_moe_plugins_fallbacks_total",
        "sglang_moe_plugins_delegations_total",
        "rate(",
        "doctor",
        "explain",
        "stats()",
    ):
        assert needed in text, f"docs/production.md does not mention {needed}"
    for marker in ("<!-- rollback-all -->", "<!-- metric-labels -->", "<!-- parity -->"):
        assert marker in text, f"docs/production.md lacks the marker {marker}"
    assert len(text.splitlines()) <= 260, "docs/production.md is meant to be read in one sitting (~250 lines)"


def test_metric_names_in_the_docs_are_the_exported_ones():
    """Every ``sglang_moe_plugins_*`` name the operators' documents give is one the package exports, and none gives
    the earlier names under SGLang's ``sglang:`` namespace."""
    from sglang_moe_plugins.metrics import METRIC_NAMES

    for name in ("README.md", "docs/production.md", "docs/configuration.md"):
        text = (ROOT / name).read_text()
        assert "sglang:moe_plugins" not in text, f"{name} gives a metric name under SGLang's sglang: namespace"
        used = set(re.findall(r"sglang_moe_plugins_\w+", text))
        assert used, f"{name} names no metric"
        assert used <= set(METRIC_NAMES), (
            f"{name} names metrics the package does not export: {used - set(METRIC_NAMES)}"
        )


def test_index_page_is_self_sufficient():
    """The package index page (README.md as tests/readme_for_index.py renders it) carries install, parity, rollback
    and metrics in its own text: the index turns links into plain text, so none of these may be only a link."""
    sys.path.insert(0, str(ROOT / "tests"))
    from readme_for_index import render

    page = render((ROOT / "README.md").read_text())
    headings = [h.lower() for h in re.findall(r"^#{1,6}\s+(.*)$", page, flags=re.MULTILINE)]
    for section in ("install", "parity", "rollback", "metrics"):
        assert any(section in h for h in headings), f"the index page has no {section} section: {headings}"
    for needed in (
        "pip install sglang-moe-plugins",
        "SGLANG_MOE_PLUGINS_STOCK=",
        "SGLANG_PLUGINS",
        "SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR=stock",
        "sglang_moe_plugins_calls_total",
        "sglang_moe_plugins_fallbacks_total",
        "sglang_moe_plugins_delegations_total",
        "--enable-metrics",
        "rate(",
    ):
        assert needed in page, f"the index page does not say {needed!r}"
    relative = [link for link in re.findall(r"\]\(([^)]+)\)", page) if not re.match(r"https?://", link)]
    assert not relative, relative


#: Development words an operator's document must not use: runs and sessions of the development, issue numbers,
#: the development machines, files outside the repository.
_DEV_WORDS = re.compile(
    r"\b(?:issue\s*#?\s*\d+|issues?\s+\d+|finding\s+\d+|run\s+(?:\d+|(?-i:[A-Z]))\b|runs\s+\d+|development\s+sessions?|"
    r"sessions?\b|the\s+GPU\s+machine|the\s+CPU\s+machine|this\s+machine's\s+torch|H200\s+machine|"
    r"HOST-FACTS|\.\./shared|no\s+2-GPU\s+machine\s+was\s+lent|the\s+lead\b|red[- ]team)",
    re.IGNORECASE,
)


@pytest.mark.parametrize("name", USER_DOCS)
def test_user_docs_speak_to_users(name):
    path = ROOT / name
    assert path.exists(), name
    problems = [
        f"{name}:{number}: {match.group(0)!r} in: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in _DEV_WORDS.finditer(line)
    ]
    assert not problems, "development language in an operators' document:\n" + "\n".join(problems)


def test_development_notes_exist_for_what_moved():
    """What the GPU test machine needs, and the notes on the development set-up, live in docs/development-notes.md."""
    notes = ROOT / "docs" / "development-notes.md"
    assert notes.exists()
    text = notes.read_text()
    for fact in ("checkout_dist_info.py", "SGLANG_MOE_PLUGINS_COMMIT", "CUDA_HOME=/usr/local/cuda", "zz_base_venv.pth"):
        assert fact in text, f"docs/development-notes.md lacks {fact}"
