"""The docs' own rules: pages short enough to read, no work history in them, relative links that resolve,
and benchmark results named by benchmark and date."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"

LINE_LIMITS = {"README.md": 150, "docs/performance.md": 300, "docs/scheduling.md": 400}

# Pages: the README files and docs/*.md. Results: every file in docs/results/ that is text.
PAGES = sorted({REPO / "README.md", REPO / "realparts" / "README.md", REPO / "gpuaware" / "bench" / "README.md",
                *(REPO / "docs").glob("*.md")})
RESULT_FILES = sorted(p for p in RESULTS.iterdir() if p.suffix == ".json")

# Work history: who did what when belongs to git, not to a page that says what is. Each pattern names a piece
# of project bookkeeping, so that ordinary English ("stops the broker", "a round trip", "rounds of recovery")
# does not match.
HISTORY = [
    re.compile(r"\bissues?[ _-]?#?\d+", re.I),
    re.compile(r"\b(?:this|last|next|previous|earlier|that|the) round\b(?! trip)", re.I),
    re.compile(r"\bround[ _-]?\d+", re.I),
    re.compile(r"\bclosing note\b", re.I),
    re.compile(r"\b(?:this|last|next|previous|earlier) session\b", re.I),
    re.compile(r"\bstop \d+\b", re.I),
    re.compile(r'"s\d\d_'),  # result keys named after a numbered stop
]

RESULT_NAME = re.compile(r"[a-z][a-z0-9-]*-\d{4}-\d{2}-\d{2}(?:-[a-z0-9_-]+)?\.(?:json|png)")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("name", sorted(LINE_LIMITS))
def test_pages_fit_their_line_limits(name):
    lines = len((REPO / name).read_text().splitlines())
    assert lines <= LINE_LIMITS[name], f"{name}: {lines} lines, limit {LINE_LIMITS[name]}"


@pytest.mark.parametrize("path", [pytest.param(p, id=_rel(p)) for p in PAGES + RESULT_FILES])
def test_no_work_history(path):
    found = [f"{_rel(path)}:{n}: {m.group(0)!r}" for n, line in enumerate(path.read_text().splitlines(), 1)
             for pattern in HISTORY for m in pattern.finditer(line)]
    assert not found, "work history belongs to git:\n" + "\n".join(found)


def test_history_patterns_catch_bookkeeping_and_spare_english():
    said = ["This round: one worker", "Closing note (issue 22)", "raw JSON: pipeline-round12.json",
            "the round's code", "after stop 27's scheduler", "on this session's machine", '"s27_raised": {']
    english = ["Ctrl-C stops the broker", "a round trip to the apiserver", "--rounds 4", "the session's broker",
               "once per test session", "stops 3 workers", "rounds_4_rocksdb"]
    for text in said:
        assert any(p.search(text) for p in HISTORY), text
    for text in english:
        assert not any(p.search(text) for p in HISTORY), text


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_relative_links_resolve(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(path)}:\n" + "\n".join(broken)


def test_slugs_follow_github():
    assert _slug("What the stream changes") == "what-the-stream-changes"
    assert _slug("The stream: `gpuaware bench stream --json`") == "the-stream-gpuaware-bench-stream---json"
    assert _slug("Stream recovery: `python -m gpuaware.bench.stream_recovery`") == \
        "stream-recovery-python--m-gpuawarebenchstream_recovery"


def test_results_are_named_by_benchmark_and_date():
    wrong = [p.name for p in RESULTS.iterdir() if not RESULT_NAME.fullmatch(p.name)]
    assert not wrong, f"name docs/results files BENCHMARK-YYYY-MM-DD[-WHAT].json: {wrong}"


def test_every_result_file_is_cited():
    """A results file no page names is history nobody can find: say what it is, or leave it to git."""
    text = "\n".join(p.read_text() for p in PAGES)
    uncited = [p.name for p in RESULTS.iterdir()
               if p.name not in text and not re.search(re.escape(p.name.rsplit("-", 1)[0]) + r"-\*", text)]
    assert not uncited, f"named by no page: {uncited}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_code_fences_open_and_close_on_lines_of_their_own(page):
    """A fence with text after it (```` ``` The exporter ... ````) leaves the block open: the rest of the page
    renders as code."""
    open_at = None
    for n, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("```"):
            continue
        if open_at is None:
            assert re.fullmatch(r"```[\w+-]*", stripped), f"{_rel(page)}:{n}: an opening fence names a language only"
            open_at = n
        else:
            assert stripped == "```", f"{_rel(page)}:{n}: the block opened at line {open_at} closes with text after it"
            open_at = None
    assert open_at is None, f"{_rel(page)}: the block opened at line {open_at} never closes"
