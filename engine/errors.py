"""Errors the user sees.

Every exception that crosses the engine boundary is a `HalamanError` whose `str()` is one line
naming the problem and what to do about it; the CLI prints it as is and the GUI shows it in the
window. Anything else escaping the engine is a bug.
"""


class HalamanError(Exception):
    """Base class: `str(error)` is a single user-facing line (problem + what to do)."""


class DocumentError(HalamanError):
    """A document could not be read (empty, damaged, encrypted, no text layer, ...)."""


class ModelError(HalamanError):
    """A model could not be located, converted or loaded."""


class SettingsError(HalamanError):
    """A setting has an invalid value (e.g. a budget smaller than sink + window)."""


class CacheStoreError(HalamanError):
    """The prefix-cache store on disk could not be used."""


class Cancelled(HalamanError):
    """The user cancelled a running prefill or generation."""

    def __init__(self, message: str = "Cancelled.") -> None:
        super().__init__(message)
