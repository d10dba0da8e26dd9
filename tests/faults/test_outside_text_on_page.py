"""Outside text on the page (reliability round 4, n11): Streamlit renders every message, caption, heading and
container label as Markdown and links what looks like an address, so a server's model id such as
`![m](http://any.where/pixel.png)` shown as it is makes the browser fetch that image. `dashboard.text.plain` is the
one way to show such text; this test reads the source of app.py, app_pages/ and dashboard/ and fails where text
reaches a Streamlit text call without it.

The rule, for every argument that Streamlit renders as Markdown (each positional argument of `error`, `warning`,
`info`, `success`, `caption`, `markdown`, `write`, `toast`, `exception`, `title`, `header`, `subheader`, `expander`,
`popover`, `status`, `spinner` and `tabs`, and their `body`, `label`, `text` and `help` keywords, on `st` or on any
column, container or sidebar, or on either of `(st.error if failed else st.warning)`; `progress`'s `text`,
`page_link`'s `label` and `help`), the text shown is one of:
  - a literal: a string or a number written in the code;
  - a constant: a name or attribute in CAPITALS (`report.COMPARE_NOTE`), text written in the code elsewhere;
  - `plain(...)`: whatever it wraps (an exception, a server's answer, a run's label) is shown as written;
  - a number: `len(...)`, `int(...)`, `float(...)`, `round(...)`, or an f-string field formatted as a number
    (`{n:,}`, `{rate:.1f}`, `{share:.0%}`, `{x:g}`: such a format raises on anything but a number);
  - made of those: an f-string whose every field is one of them, `a + b`, `a if c else b`, `sep.join(...)` of them,
    or a list or tuple of them (the labels of `tabs`).
Anything else (a variable, `str(exc)`, a bare `{name}` field) is flagged, even when its text is known to be safe
today: the call site itself shows that the text is safe, so a later change to where the text comes from cannot
slip past. `st.html` takes literals and constants only, as `plain` makes text safe for Markdown, not for HTML.
Widget labels (buttons, inputs, selects, metrics) are written in the code or come from the settings' catalog and
are outside this rule; so is an element called through a name bound to it (`show = st.warning`): call it directly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOWING_MODULES = sorted([ROOT / "app.py", *(ROOT / "app_pages").glob("*.py"), *(ROOT / "dashboard").glob("*.py")])
MARKDOWN_CALLS = frozenset(
    {
        "error",
        "warning",
        "info",
        "success",
        "caption",
        "markdown",
        "write",
        "toast",
        "exception",
        "title",
        "header",
        "subheader",
        "expander",
        "popover",
        "status",
        "spinner",
        "tabs",
    }
)
MARKDOWN_KEYWORDS = frozenset({"body", "label", "text", "help"})
KEYWORD_ONLY_CALLS = {"progress": frozenset({"text"}), "page_link": frozenset({"label", "help"})}
HTML_CALLS = frozenset({"html"})
NUMBER_FUNCTIONS = frozenset({"len", "int", "float", "round"})
# Presentation types and grouping that `format` accepts for numbers only (`format("x", ",")` raises).
NUMBER_FORMAT_MARKS = frozenset("bcdeEfFgGnoxX%,_")


def _name(node: ast.AST) -> str:
    """The last identifier of a name or attribute (`plain`, `text.plain` -> "plain"), or ""."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_constant(node: ast.AST) -> bool:
    name = _name(node)
    return isinstance(node, ast.Constant) or (name.isupper() and isinstance(node, (ast.Name, ast.Attribute)))


def _formatted_as_number(field: ast.FormattedValue) -> bool:
    spec = field.format_spec
    if not isinstance(spec, ast.JoinedStr) or not all(isinstance(part, ast.Constant) for part in spec.values):
        return False
    written = "".join(str(part.value) for part in spec.values)
    return bool(written) and (written[-1] in NUMBER_FORMAT_MARKS or bool({",", "_"} & set(written)))


def shown_safely(node: ast.AST) -> bool:
    """Whether `node` is text the rule above lets Streamlit render as Markdown."""
    if _is_constant(node):
        return True
    if isinstance(node, ast.Call):
        function = _name(node.func)
        if function == "plain" or (function in NUMBER_FUNCTIONS and isinstance(node.func, ast.Name)):
            return True
        if function == "join" and isinstance(node.func, ast.Attribute) and len(node.args) == 1:
            items = node.args[0]
            elements = [items.elt] if isinstance(items, (ast.GeneratorExp, ast.ListComp)) else [items]
            return shown_safely(node.func.value) and all(shown_safely(element) for element in elements)
        return False
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(part, ast.Constant) or shown_safely(part.value) or _formatted_as_number(part)
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return shown_safely(node.left) and shown_safely(node.right)
    if isinstance(node, ast.IfExp):
        return shown_safely(node.body) and shown_safely(node.orelse)
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(shown_safely(element) for element in node.elts)
    return False


def _method(function: ast.AST) -> str:
    """The method a call calls: `st.error` -> "error"; `(st.error if failed else st.warning)` -> "error" too."""
    if isinstance(function, ast.IfExp):
        return _method(function.body) or _method(function.orelse)
    return _name(function) if isinstance(function, ast.Attribute) else ""


def _rendered_arguments(call: ast.Call) -> list[ast.AST]:
    """The arguments of `call` that Streamlit renders as Markdown, if it is a call of a Streamlit text element."""
    method = _method(call.func)
    if method in MARKDOWN_CALLS:
        return [*call.args, *(keyword.value for keyword in call.keywords if keyword.arg in MARKDOWN_KEYWORDS)]
    if method in KEYWORD_ONLY_CALLS:
        return [keyword.value for keyword in call.keywords if keyword.arg in KEYWORD_ONLY_CALLS[method]]
    return []


def unsafe_text_calls(source: str, name: str = "module.py") -> list[str]:
    """`file:line: code` for every Streamlit text call in `source` that shows text the rule does not let through."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in HTML_CALLS:
            unsafe = [argument for argument in node.args if not _is_constant(argument)]
        else:
            unsafe = [argument for argument in _rendered_arguments(node) if not shown_safely(argument)]
        found += [f"{name}:{argument.lineno}: {ast.unparse(node)[:160]}" for argument in unsafe]
    return found


def test_the_check_flags_outside_text_and_lets_plain_text_through():
    flagged = [
        "st.error(str(exc))",
        "st.caption(exc)",
        "st.warning(warning)",
        "left.caption(f'tokenized with {preview.tokenizer}.')",
        "st.sidebar.markdown('**Model**: ' + model)",
        "st.info(f'{count} runs')",
        "with st.expander(row['prompt']): pass",
        "st.tabs(['Runs', name])",
        "st.progress(0.5, text=f'{run.state}: running')",
        "st.caption('x', help=definition)",
        "st.html(plain(text))",
        "st.write(frame)",
        "st.caption(' '.join(notes))",
        "st.toast(message.upper())",
        "st.page_link('app_pages/run.py', label=f'Watch run {run_id} live')",
        "(st.error if failed else st.warning)(said)",
    ]
    allowed = [
        "st.error(plain(exc))",
        "st.caption('No sweep yet.')",
        "left.caption(f'{len(table):,} requests, tokenized with {plain(preview.tokenizer)}.')",
        "st.info(f'{count:,} runs, {share:.0%} done, rate {rate:g}')",
        "st.markdown('**Model**: ' + plain(model))",
        "st.caption(report.COMPARE_NOTE)",
        "st.markdown('\\n'.join(plain(line) for line in rest))",
        "st.warning(plain(a) if a else 'none')",
        "st.tabs(['Runs', 'Charts'])",
        "st.html(_ONE_ENTRY_PER_PAGE)",
        "name.title()",
        "st.metric(label, value)",
        "(st.error if failed else st.warning)(plain(said))",
    ]
    assert [code for code in flagged if not unsafe_text_calls(code)] == []
    assert [code for code in allowed if unsafe_text_calls(code)] == []


@pytest.mark.parametrize("path", SHOWING_MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_page_shows_outside_text_through_plain(path):
    assert unsafe_text_calls(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) == []
