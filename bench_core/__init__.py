"""LLM Bench Studio's measurement core: datasets, engines, profiler, runner, history and CLI.

Nothing here imports streamlit: the CLI, the tests and the dashboard pages drive the same core.
"""

__version__ = "0.1.0"
