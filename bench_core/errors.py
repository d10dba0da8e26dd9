"""Errors a user can cause. Their messages are written for that user and shown as they are,
by the CLI (one line on stderr) or by a page (one alert); anything else is a bug."""

from .redact import redact_text


class BenchError(Exception):
    """Base class: the message says what is wrong and, where possible, what to do. It may quote what the
    user typed, a server URL with its password included: the text shown has every credential masked.

    `refuses_input`: the error refuses what the user asked for (a typo, a missing file, an impossible setting)
    before any work on it: such a run is not a run and leaves no history row. Errors that come once the work is
    under way (a model that fails to build, an engine out of memory) are recorded with the run."""

    refuses_input = False

    def __str__(self) -> str:
        text = super().__str__()
        # What the user reads of the error: one raised without a message still says what kind it is.
        return redact_text(text) if text.strip() else f"{type(self).__name__} (raised without a message)"


class ConfigError(BenchError):
    """An impossible or unsupported combination of settings, found before any work starts."""

    refuses_input = True


class DatasetError(BenchError):
    """A dataset that is missing, unreadable or holds no usable conversation."""

    refuses_input = True


class ModelError(BenchError):
    """A model that cannot be loaded or built."""


class UnknownModel(ModelError):
    """A model name that names nothing: no folder, no built-in or synthetic model of that name or shape."""

    refuses_input = True


class EngineUnavailable(BenchError):
    """A backend that cannot run on this machine (library or GPU missing)."""

    refuses_input = True


class CacheNotWritable(BenchError):
    """A model to build into our cache where this user cannot write (a read-only HOME or mount, a service account
    without a home): the machine's setup, found before anything is measured."""

    refuses_input = True


class HistoryError(BenchError):
    """A history or CSV file that cannot be read or imported."""
