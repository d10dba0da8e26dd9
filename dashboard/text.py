"""Text that comes from outside the app, shown as text, and a verdict shown in its colour: a server's model id and errors, run labels, file names.

Streamlit renders every message element (captions, alerts, expander labels) as Markdown, and then links whatever
looks like a URL, an address or a www. name, so such text could make the browser fetch an image from any URL it
names, or show a link to one. `plain` escapes what Markdown reads and puts an invisible word joiner (U+2060) where
a link would start ("http:" + "//", "www" + ".", "@"), so the text shows as it was written and nothing is fetched or
linked. It is the one way the pages show such text: tests/faults/test_outside_text_on_page.py reads app.py,
app_pages/ and dashboard/ and fails where any text but a literal, a constant or a number reaches a Streamlit text
element without it.
"""

from __future__ import annotations

import re

import streamlit as st

from bench_core.views.verdict import Judged, Verdict

# The marks that start Markdown (links, images, emphasis, code, HTML, entities, tables, strikethrough), a heading's
# "#" at a line's start, Streamlit's LaTeX ($) and the colon of its ":red[...]", ":material/icon:" and ":emoji:"
# directives. Ordinary punctuation (". , ' - ( ) / ?", "builtin:sample") stays as it is.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>!|~$&]|(?m:^#)|:(?=[\w/-]+[:\[]))")
_LINK_STARTS = re.compile(r"(?i):(?=//)|\bwww(?=\.)|@")
WORD_JOINER = "\u2060"


def plain(text: object) -> str:
    """`text` as Markdown that shows it literally, linking nothing."""
    unlinked = _LINK_STARTS.sub(lambda match: match.group(0) + WORD_JOINER, str(text))
    return _MARKDOWN.sub(r"\\\1", unlinked)


def show_verdict(judged: Judged) -> None:
    """A verdict's line in its colour: green, amber or red."""
    alert = {Verdict.GOOD: st.success, Verdict.CAUTION: st.warning, Verdict.BAD: st.error}[judged.verdict]
    alert(plain(judged.said))
