"""A report is one list of sections; two renderers write it as Markdown and as HTML.

A section is a heading (none for the part under the title) and blocks: paragraphs, tables
and figures.  The Markdown links the figures' PNG files beside it; the HTML embeds them
(base64), so it can be mailed as one file.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;"
    "max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.5;color:#222}"
    ".table{overflow-x:auto}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 10px;vertical-align:top}th{background:#f2f2f2}"
    ".text{text-align:left}.num{text-align:right;font-variant-numeric:tabular-nums}"
    "img{max-width:100%;height:auto}"
)
# A number, possibly signed, or inf/nan: the start of a numeric cell ("51.00 ± 1.41 (n=2)").
_NUMBER = re.compile(r"[+\-−]?(\d|\.\d|inf\b|nan\b|∞)", re.IGNORECASE)
_NO_VALUE = {"", "-", "—", "n/a"}


@dataclass
class Paragraph:
    text: str
    lead: str = ""  # a bold word before the text, e.g. "Note:"


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Figure:
    caption: str
    path: Path  # the PNG file, in the report's folder


Block = Paragraph | Table | Figure


@dataclass
class Section:
    heading: str | None  # None: the opening section, under the report's title
    blocks: list[Block] = field(default_factory=list)


# --------------------------------------------------------------------------- Markdown
def to_markdown(title: str, sections: list[Section]) -> str:
    parts = [f"# {title}"]
    for section in sections:
        if section.heading is not None:
            parts.append(f"## {section.heading}")
        parts += [_markdown_block(block) for block in section.blocks]
    return "\n\n".join(parts) + "\n"


def _markdown_block(block: Block) -> str:
    match block:
        case Paragraph(text, lead):
            return f"**{lead}** {text}" if lead else text
        case Table(header, rows):
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            return "\n".join(lines)
        case Figure(caption, path):
            vector = f"{path.stem}.pdf"
            return (f"### {caption}\n\n![{caption}]({path.name})\n\n"
                    f"Vector: [{vector}]({vector}), [{path.stem}.svg]({path.stem}.svg)")
    raise TypeError(f"not a report block: {block!r}")


# --------------------------------------------------------------------------- HTML
def to_html(title: str, sections: list[Section]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        if section.heading is not None:
            parts.append(f"<h2>{html.escape(section.heading)}</h2>")
        parts += [_html_block(block) for block in section.blocks]
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_block(block: Block) -> str:
    match block:
        case Paragraph(text, lead):
            lead_html = f"<strong>{html.escape(lead)}</strong> " if lead else ""
            return f"<p>{lead_html}{html.escape(text)}</p>"
        case Table(header, rows):
            return _html_table(header, rows)
        case Figure(caption, path):
            png = path.read_bytes()
            data = base64.b64encode(png).decode()
            # drawn at 200 dpi: shown at half its pixels, the size it was drawn for
            width = int.from_bytes(png[16:20], "big") // 2
            return (
                f"<h3>{html.escape(caption)}</h3><img alt='{html.escape(caption)}' "
                f"width='{width}' style='max-width:100%;height:auto' "
                f"src='data:image/png;base64,{data}'>"
            )
    raise TypeError(f"not a report block: {block!r}")


def column_kinds(header: list[str], rows: list[list[str]]) -> list[str]:
    """``"num"`` for a column whose every value starts with a number, else ``"text"``."""
    kinds = []
    for column in range(len(header)):
        values = [row[column].strip() for row in rows if column < len(row)]
        values = [v for v in values if v.lower() not in _NO_VALUE]
        numeric = bool(values) and all(_NUMBER.match(v) for v in values)
        kinds.append("num" if numeric else "text")
    return kinds


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    """The table, each cell classed ``text`` (left-aligned) or ``num`` (right-aligned)."""
    kinds = column_kinds(header, rows)
    head = _html_cells("th", header, kinds)
    body = "".join(f"<tr>{_html_cells('td', row, kinds)}</tr>" for row in rows)
    return (f"<div class='table'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def _html_cells(tag: str, texts: list[str], kinds: list[str]) -> str:
    return "".join(
        f"<{tag} class='{kinds[i]}'>{html.escape(text)}</{tag}>" for i, text in enumerate(texts)
    )
