"""Plugin modules as someone would write them outside the package, for the tests of the registries (not in
conftest: tests/ and tests/e2e/ each have one, and `from conftest import` takes whichever was imported first)."""

# A toy export as someone would write one outside the package: one module in a folder of their own.
TOY_EXPORT = '''"""The run ids of what is exported, one a line."""

from bench_core.exports import Export, Scope


def run_ids_text(subject) -> bytes:
    return ("\\n".join(subject.run_ids) + "\\n").encode()


RUN_IDS = Export(
    "run-ids", "Run ids (TXT)", "text/plain", "{stem}-ids.txt", dict.fromkeys(Scope, run_ids_text), order=1
)
'''
