"""The docs a newcomer can hold in their head (issue 32 item 9), kept that way.

- docs/architecture.md is the map: at most MAX_ARCHITECTURE_LINES lines, and every ``app/...py``,
  ``workers/...py`` or ``bench/...py`` path it names exists.
- docs/performance.md is the current figures, not a diary: no heading names a round or a date, and every
  ``bench/...py`` (or ``bench.bench_x`` module) it names exists.
- A reference into either document by section (``docs/architecture.md, "Fair dispatch"``, ``"Fair dispatch" in
  docs/architecture.md``, ``docs/performance.md, "Latency"``) anywhere in app/, workers/, bench/, docs/, tests/
  or README.md names a heading that exists; ``invariant N`` of architecture.md is one of its numbered invariants.

Pure text checks: no servers.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
MAX_ARCHITECTURE_LINES = 650

_PATH = re.compile(r"(?<![\w/.])((?:app|workers|bench)/[\w/]*\w\.(?:py|lua))")
_BENCH_MODULE = re.compile(r"\bbench\.((?:bench|probe)_\w+)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_QUOTED_LIST = re.compile(r'^[\s,(#*]*((?:"[^"\n]+"(?:\s*(?:,|and|or)\s*)?)+)')
_QUOTED_BEFORE = re.compile(r'"([^"\n]+)"\s+in\s+docs/(architecture|performance)\.md')
_INVARIANT = re.compile(r"architecture\.md[,\s(]*\(?\s*invariants?\s+((?:\d+(?:\s*(?:,|and)\s*)?)+)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _headings(path: Path) -> list[str]:
    return _HEADING.findall(_FENCE.sub("", _text(path)))


def _flat(text: str) -> str:
    """The text with comment markers and line breaks folded, so a reference split over lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#+\s*|\*\s+|-\s+)?", " ", text)


def _sources() -> list[Path]:
    files: list[Path] = []
    for part in ("app", "workers", "bench", "tests", "docs"):
        files += [p for p in (ROOT / part).rglob("*") if p.suffix in (".py", ".md") and p.is_file()]
    files.append(ROOT / "README.md")
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def _references(doc: str) -> list[tuple[Path, str]]:
    """Every (file, section name) that names a section of docs/<doc>.md."""
    found: list[tuple[Path, str]] = []
    for path in _sources():
        text = _flat(_text(path))
        for m in re.finditer(rf"{doc}\.md", text):
            head = _QUOTED_LIST.match(text[m.end():m.end() + 200])
            if head:
                found += [(path, name) for name in re.findall(r'"([^"\n]+)"', head.group(1))]
        found += [(path, name) for name, which in _QUOTED_BEFORE.findall(text) if which == doc]
    return found


def _names_a_heading(name: str, headings: list[str]) -> bool:
    want = name.strip().rstrip(".").lower()
    return any(want in h.replace("`", "").lower() for h in headings)


def test_architecture_is_a_map_of_bounded_length():
    lines = _text(ARCHITECTURE).splitlines()
    assert len(lines) <= MAX_ARCHITECTURE_LINES, f"docs/architecture.md has {len(lines)} lines"


def test_every_path_the_map_names_exists():
    missing = sorted({p for p in _PATH.findall(_text(ARCHITECTURE)) if not (ROOT / p).exists()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_performance_is_current_figures_not_a_diary():
    diary = [h for h in _headings(PERFORMANCE) if re.search(r"round|20\d\d-\d\d-\d\d", h, re.I)]
    assert not diary, f"docs/performance.md has diary headings: {diary}"


def test_every_bench_performance_names_exists():
    text = _text(PERFORMANCE)
    named = set(_PATH.findall(text)) | {f"bench/{m}.py" for m in _BENCH_MODULE.findall(text)}
    assert any(n.startswith("bench/") for n in named), "docs/performance.md names no benchmark"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"docs/performance.md names benchmarks that do not exist: {missing}"


def test_section_references_name_existing_headings():
    bad: list[str] = []
    seen = 0
    for doc, path in (("architecture", ARCHITECTURE), ("performance", PERFORMANCE)):
        headings = _headings(path)
        for source, name in _references(doc):
            seen += 1
            if not _names_a_heading(name, headings):
                bad.append(f"{source.relative_to(ROOT)}: docs/{doc}.md, {name!r}")
    assert seen >= 20, f"only {seen} section references found: the scan itself is broken"
    assert not bad, "references to sections that do not exist:\n" + "\n".join(bad)


def test_numbered_invariants_that_code_cites_exist():
    text = _text(ARCHITECTURE)
    section = text.split("## Invariants", 1)[1].split("\n## ", 1)[0]
    numbers = {int(n) for n in re.findall(r"^(\d+)\.\s", section, re.M)}
    cited: list[tuple[Path, int]] = []
    for path in _sources():
        for m in _INVARIANT.finditer(_flat(_text(path))):
            cited += [(path, int(n)) for n in re.findall(r"\d+", m.group(1))]
    assert cited, "no invariant references found: the scan itself is broken"
    bad = [f"{p.relative_to(ROOT)}: invariant {n}" for p, n in cited if n not in numbers]
    assert not bad, f"invariants cited that docs/architecture.md does not number: {bad}"


def test_one_meaning_per_name():
    """issue 32 item 9: "outbox" named three modules and "secrets" four.  Now one module is the outbox (the
    delivery outbox), every secret-handling module has a name of its own, and each is in the Names table."""
    stems = [p.stem for p in (ROOT / "app").rglob("*.py")]
    assert [s for s in stems if "outbox" in s] == ["outbox"]
    secret = sorted(s for s in stems if "secret" in s)
    assert len(secret) == len(set(secret)) and "secrets" not in secret, secret
    names = ARCHITECTURE.read_text().split("### Names", 1)[1].split("\n## ", 1)[0]
    for path in [p for p in (ROOT / "app").rglob("*.py") if "secret" in p.stem or "outbox" in p.stem
                 or p.stem in ("handoff", "delivery_rows")]:
        assert f"`{path.relative_to(ROOT)}`" in names, path
