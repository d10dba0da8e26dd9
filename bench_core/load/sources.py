"""Where a dataset's text comes from: the built-in sources and the user's own file, and what is wrong with a source
before it is read, so a run whose file is not there is refused with its other problems, before anything loads."""

from __future__ import annotations

from ..models.resolve import local_path

BUILTIN_SHAREGPT = "builtin:sharegpt"
BUILTIN_SAMPLE = "builtin:sample"
BUILTIN_SOURCES = (BUILTIN_SHAREGPT, BUILTIN_SAMPLE)


def source_problem(source: str) -> str | None:
    """Why `source` names no text to read, as a sentence (an unknown built-in, a path that is not a file); None where
    it does. What the file holds is known only once it is read."""
    if source in BUILTIN_SOURCES:
        return None
    if source.startswith("builtin:"):
        return f"Unknown built-in dataset '{source}'; choose one of {', '.join(BUILTIN_SOURCES)}."
    path = local_path(source)
    if path is not None and path.is_file():
        return None
    what = "is a folder, not a file" if path is not None and path.is_dir() else "does not exist"
    return f"Dataset {source} {what}: pass a ShareGPT JSON or JSONL file, {BUILTIN_SHAREGPT} or {BUILTIN_SAMPLE}."
