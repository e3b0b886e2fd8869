"""Template helpers for the dashboard: role checks and safe rendering of agent-written content."""

from datetime import UTC, datetime

from django import template
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import mark_safe

from memory_app import rendering
from memory_app.roles import user_can

register = template.Library()


@register.filter
def can(user, capability: str) -> bool:
    """`{% if user|can:"curate" %}`: hide buttons a role cannot use (views check again)."""
    return user_can(user, capability)


@register.filter
def markdown(text: str):
    return rendering.render_markdown(text)


@register.filter
def highlight(code: str, language: str = "python"):
    return rendering.highlight_code(code or "", language)


@register.filter
def pretty_json(value) -> str:
    return rendering.pretty_json(value)


@register.filter
def content_text(value) -> str:
    return rendering.content_text(value)


@register.filter
def epoch(value):
    """A Unix epoch float (smolagents' Timing) as an aware datetime, for the `date` filter."""
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


@register.filter
def seconds(value) -> str:
    """A duration in seconds, short: 850 ms, 3.2 s, 4 min 12 s."""
    if value is None:
        return "–"
    value = float(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def since(value, start) -> str:
    """Unix seconds as an offset from the run's time zero: +0 ms, +3.2 s, +6 min 14 s."""
    if value is None or start is None:
        return "–"
    return "+" + seconds(max(0.0, float(value) - float(start)))


@register.filter
def usd(value) -> str:
    """A cost in US dollars; unknown is a dash, never $0."""
    if value is None:
        return "—"
    value = float(value)
    if value == 0:
        return "$0"
    if value < 0.01:
        return f"${value:.4f}"
    return f"${value:,.2f}"


FOLD_LINES = 30
FOLD_CHARS = 4000
PREVIEW_LINES = 8


@register.filter
def fold(text) -> dict:
    """Whether a text is long enough to fold (a 400-line tool output), with its first lines."""
    text = "" if text is None else str(text)
    lines = text.count("\n") + 1
    preview = "\n".join(text.split("\n", PREVIEW_LINES)[:PREVIEW_LINES])[:1000]
    return {
        "long": lines > FOLD_LINES or len(text) > FOLD_CHARS,
        "lines": lines,
        "preview": preview,
    }


@register.filter
def compact(value) -> str:
    """12345 -> 12.3k (token counts)."""
    if value is None:
        return "–"
    value = int(value)
    if value < 1000:
        return str(value)
    if value < 1_000_000:
        return f"{value / 1000:.1f}k"
    return f"{value / 1_000_000:.1f}M"


@register.filter
def get_item(mapping, key):
    return (mapping or {}).get(key, ())


@register.filter
def tool_arguments(call):
    """A tool call's arguments, pretty: JSON highlighted, or code when the tool runs code."""
    args = call.arguments
    if isinstance(args, str):
        language = "python" if call.name == "python_interpreter" else "text"
        return rendering.highlight_code(args, language)
    return rendering.highlight_code(rendering.pretty_json(args), "json")


@register.simple_tag
def change_diff(before, after):
    """`{% change_diff e.before e.after as diff %}`: (changed fields, unchanged field names)."""
    return rendering.change_diff(before, after)


@register.filter
def content_blocks(content):
    """A message's tool calls, tool results and other non-text blocks (see rendering)."""
    return rendering.content_blocks(content)


@register.filter
def key_value(value) -> str:
    """A context key's value as the filter accepts it back: strings as they are, anything else
    as JSON (`true`, `42`, `null`), never Python's `True`/`None`."""
    return value if isinstance(value, str) else rendering.json_text(value)


@register.simple_tag
def timeline_bars(timeline, run_pk: int):
    """The timeline's bars as SVG links, built here rather than in a template loop: up to 200
    bars of a dozen numbers each took ~0.3 s through the template engine's per-value
    localisation and one URL reversal per bar. Only numbers and our own text go in."""
    placeholder = 987654321
    url = reverse("run-step", args=[run_pk, placeholder])
    height = timeline.height
    base = timeline.tokens_base
    parts = []
    for bar in timeline.bars:
        title = f"steps {bar.start}" + (f"–{bar.end}" if bar.end != bar.start else "") + ":"
        if bar.offset is not None:
            title += f" at +{seconds(bar.offset)},"
        title += f" {seconds(bar.duration)}, {bar.tokens} tokens"
        if bar.errors:
            title += f", {bar.errors} error{'s' if bar.errors != 1 else ''}"
        href = url.replace(str(placeholder), str(bar.start))
        parts.append(
            f'<a href="{escape(href)}" class="tl-bar{" has-error" if bar.errors else ""}">'
            f"<title>{escape(title)}</title>"
            f'<rect class="tl-hit" x="{bar.x}" y="0" width="{bar.width}" height="{height}"></rect>'
            f'<rect class="tl-dur" x="{bar.x}" y="{bar.duration_y}" width="{bar.width}"'
            f' height="{bar.duration_height}"></rect>'
            f'<rect class="tl-tok" x="{bar.x}" y="{base}" width="{bar.width}"'
            f' height="{bar.tokens_height}"></rect></a>'
        )
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only


@register.filter
def delta(value, unit: str) -> str:
    """A difference b − a with its sign, in `unit` (tokens, usd, seconds); unknown is a dash,
    no difference "±0"."""
    if value is None:
        return "–"
    if value == 0:
        return "±0"
    sign = "+" if value > 0 else "−"
    size = abs(value)
    if unit == "usd":
        return sign + usd(size)
    if unit == "seconds":
        return sign + seconds(size)
    return sign + compact(size)


@register.simple_tag
def live_timeline_bars(bars, run_pk: int):
    """A running run's bars, one per step, with their numbers as data: app.js lays them out on
    the run's clock (and again after a poll appends more), so a poll sends only its new steps."""
    placeholder = 987654321
    url = reverse("run-step", args=[run_pk, placeholder])
    parts = []
    for bar in bars:
        title = f"step {bar.position}:"
        if bar.offset is not None:
            title += f" at +{seconds(bar.offset)},"
        title += f" {seconds(bar.duration)}, {bar.tokens} tokens" + (", error" if bar.error else "")
        timing = (
            f' data-s="{round(bar.offset, 3)}" data-e="{round(bar.end, 3)}"'
            if bar.offset is not None
            else ""
        )
        href = url.replace(str(placeholder), str(bar.position))
        parts.append(
            f'<a href="{escape(href)}" class="tl-bar{" has-error" if bar.error else ""}"'
            f' data-p="{bar.position}"{timing} data-d="{round(bar.duration, 3)}"'
            f' data-t="{bar.tokens}"><title>{escape(title)}</title>'
            '<rect class="tl-hit"></rect><rect class="tl-dur"></rect><rect class="tl-tok"></rect>'
            "</a>"
        )
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only
