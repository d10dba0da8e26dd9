"""One browser history entry per page, so that Back leaves the page instead of stepping back through its settings.

Streamlit's frontend (1.67, `handlePageInfoChanged`) pushes a history entry each time a script run changes the
query string, unless the browser is moving through its history. The sidebar keeps its settings in the URL
(url_settings.remember) and the Run page names its run there, so each changed setting and each Start added an
entry, and Back took one press per change to leave the Run page. Python cannot ask for a replace: only widgets
bound with `bind="query-params"` replace, and a bound widget writes its raw value, where url_settings masks a
password and keeps the run id beside the settings. So the app wraps the browser's `pushState` once per
document: a new entry for the page already shown (same path, another query string) replaces the current one;
a switch to another page still pushes, and Back returns to it.
"""

from __future__ import annotations

import streamlit as st

_ONE_ENTRY_PER_PAGE = """<script>
if (!window.benchStudioOneEntryPerPage) {
  window.benchStudioOneEntryPerPage = true;
  const push = window.history.pushState.bind(window.history);
  const replace = window.history.replaceState.bind(window.history);
  window.history.pushState = (state, title, url) => {
    const samePage = url != null && new URL(url, window.location.href).pathname === window.location.pathname;
    (samePage ? replace : push)(state, title, url);
  };
}
</script>"""


def one_entry_per_page() -> None:
    """Install the wrapper in this browser tab (a no-op after the first time)."""
    st.html(_ONE_ENTRY_PER_PAGE, unsafe_allow_javascript=True)
