"""Turning untrusted agent-written text into safe HTML for the dashboard.

Agent text is shown as text (escaped) by default. When an operator asks for Markdown, it goes
through markdown-it (raw HTML disabled) and then nh3 (an allow-list sanitiser), in that order, so
neither a parser quirk nor a crafted link can put script, event handlers or `javascript:` URLs on
the page. No `style` attributes either: the Content-Security-Policy forbids inline styles.
Images are not allowed: a Markdown image would make the browser fetch an outside host.
Code is highlighted on the server with Pygments (class-based spans; colours in app.css).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Bounds so one huge message cannot make a page slow; the rest stays readable in the API/admin.
MAX_HIGHLIGHT_CHARS = 50_000

# nowrap: we add the <pre> ourselves, so markdown-it does not wrap it in a second one.
_FORMATTER = HtmlFormatter(nowrap=True)

ALLOWED_TAGS = {
    "p",
    "br",
    "hr",
    "em",
    "strong",
    "del",
    "code",
    "pre",
    "blockquote",
    "ul",
    "ol",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "a",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "span",
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "pre": {"class"},
    "span": {"class"},
    "code": {"class"},
}


def highlight_code(code: str, language: str = "python") -> SafeString:
    """`code` as highlighted HTML (Pygments escapes every token); unknown languages stay plain."""
    if len(code) > MAX_HIGHLIGHT_CHARS:
        return mark_safe(f'<pre class="hl">{escape(code)}</pre>')  # noqa: S308 - escaped
    try:
        lexer = get_lexer_by_name(language or "text", stripnl=False)
    except ClassNotFound:
        lexer = get_lexer_by_name("text", stripnl=False)
    body = highlight(code, lexer, _FORMATTER)
    return mark_safe(f'<pre class="hl">{body}</pre>')  # noqa: S308 - Pygments escapes


def _fence_highlight(code: str, lang: str, attrs: str) -> str:
    return str(highlight_code(code, lang.strip() or "text"))


def _image_as_text(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    return escape(f"[image: {alt or token.attrGet('src')}]")


_MD = MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _fence_highlight})
_MD.enable(["table", "strikethrough"])
_MD.add_render_rule("image", _image_as_text)


def render_markdown(text: str) -> SafeString:
    """Markdown to HTML, sanitised with an allow-list after rendering."""
    html = _MD.render(text or "")
    clean = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(clean)  # noqa: S308 - nh3 output


def pretty_json(value: Any) -> str:
    """Indented JSON for display (plain text; the template escapes it)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def content_text(content: Any) -> str:
    """The text of a chat message's content: a string, or a list of blocks with `text`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(pretty_json(block))
        return "\n".join(parts)
    return pretty_json(content)


def json_text(value: Any) -> str:
    """A value written as JSON on one line (`true`, `null`, `"x"`, `[1, 2]`), for chips and
    diffs."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class FieldChange:
    """One field of an audit event's before/after: `lines` is a line diff for changed text
    (each line starts with "-", "+" or " "); otherwise `old`/`new` hold compact JSON."""

    field: str
    old: str | None = None
    new: str | None = None
    lines: tuple[str, ...] = ()


def change_diff(before: Any, after: Any) -> tuple[list[FieldChange], list[str]]:
    """The fields an audit event changed, and the names of those it left as they were.

    Text that changed becomes a line diff with one line of context, so a one-word edit in a long
    message shows as a few lines instead of two full copies.
    """
    if not isinstance(before, dict) or not isinstance(after, dict):
        if before == after:
            return [], []
        old = None if before is None else json_text(before)
        new = None if after is None else json_text(after)
        return [FieldChange(field="", old=old, new=new)], []
    changes, same = [], []
    for key in list(dict.fromkeys([*before, *after])):
        old, new = before.get(key), after.get(key)
        if key in before and key in after and old == new:
            same.append(key)
        elif isinstance(old, str) and isinstance(new, str) and "\n" in old + new:
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), n=1, lineterm="")
            lines = tuple(line for line in diff if not line.startswith(("---", "+++", "@@")))
            changes.append(FieldChange(field=key, lines=lines))
        else:
            changes.append(
                FieldChange(
                    field=key,
                    old=json_text(old) if key in before else None,
                    new=json_text(new) if key in after else None,
                )
            )
    return changes, same


@dataclass(frozen=True)
class ContentBlock:
    """A structured block of a message that is not plain text (a tool call, a tool result,
    thinking, media), ready to show: `body` is text, `language` how to highlight it."""

    kind: str
    label: str
    body: str
    language: str = "text"


def content_blocks(content: Any) -> list[ContentBlock]:
    """The non-text blocks of a message's `content` (AgentScope-style block lists), so a message
    that only calls a tool does not look empty. Text blocks are already the message's text."""
    if not isinstance(content, list):
        return []
    blocks = []
    for block in content:
        if not isinstance(block, dict):
            blocks.append(
                ContentBlock(kind="value", label="block", body=pretty_json(block), language="json")
            )
            continue
        kind = str(block.get("type") or "block")
        if kind == "text":
            continue
        name = block.get("name")
        if kind == "tool_use":
            label = f"calls {name}" if name else "tool call"
            blocks.append(ContentBlock(kind, label, pretty_json(block.get("input")), "json"))
        elif kind == "tool_result":
            output = block.get("output")
            body = output if isinstance(output, str) else content_text(output)
            blocks.append(ContentBlock(kind, f"result of {name}" if name else "tool result", body))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            blocks.append(ContentBlock(kind, "thinking", block["thinking"]))
        else:
            blocks.append(ContentBlock(kind, kind, pretty_json(block), "json"))
    return blocks
