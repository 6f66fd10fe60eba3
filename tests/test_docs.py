"""The code's citations of ``MATH.md §N`` point at sections that docs/MATH.md has."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"MATH\.md §(\d+)(?:\.(\d+))?")


def _sections() -> set[str]:
    text = (ROOT / "docs" / "MATH.md").read_text(encoding="utf-8")
    numbers = set(re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE))
    items = {f"{a}.{b}" for a, b in re.findall(r"^\*\*(\d+)\.(\d+) ", text, flags=re.MULTILINE)}
    return numbers | items


def test_every_cited_section_exists():
    sections = _sections()
    assert {str(n) for n in range(1, 10)} <= sections
    missing = []
    for folder in ("src", "docs", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".md", ".toml"} or not path.is_file():
                continue
            for match in CITATION.finditer(path.read_text(encoding="utf-8")):
                cited = match.group(1) + (f".{match.group(2)}" if match.group(2) else "")
                if cited not in sections:
                    missing.append(f"{path.relative_to(ROOT)}: §{cited}")
    assert missing == []
