"""A report is one list of sections; two renderers write it as Markdown and as HTML.

A section is a heading (none for the part under the title) and blocks: paragraphs, tables
and figures.  The Markdown links the figures' PNG files beside it; the HTML embeds them
(base64), so it can be mailed as one file.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

_STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:2em auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
    "text-align:right}th{background:#eee}img{max-width:100%}"
)


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
            return f"### {caption}\n\n![{caption}]({path.name})"
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
            head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
            body = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                for row in rows
            )
            return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        case Figure(caption, path):
            data = base64.b64encode(path.read_bytes()).decode()
            return (
                f"<h3>{html.escape(caption)}</h3><img alt='{html.escape(caption)}' "
                f"src='data:image/png;base64,{data}'>"
            )
    raise TypeError(f"not a report block: {block!r}")
