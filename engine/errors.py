"""Errors the user sees.

Every exception that crosses the engine boundary is a `HalamanError` whose `str()` is one line
naming the problem and what to do about it; the CLI prints it as is and the GUI shows it in the
window. Anything else escaping the engine is a bug.
"""

import enum


class ErrorKind(enum.Enum):
    """What kind of failure a caller is told about (`engine.workspace.error_kind` decides which):
    CANCELLED by the user, a PDF PASSWORD is needed or was wrong, out of memory (OOM), a DOCUMENT,
    MODEL, SETTINGS or prefix-CACHE error, ERROR (another `HalamanError`), or a BUG (anything else)."""

    CANCELLED = "cancelled"
    PASSWORD = "password"
    OOM = "oom"
    DOCUMENT = "document"
    MODEL = "model"
    SETTINGS = "settings"
    CACHE = "cache"
    ERROR = "error"
    BUG = "bug"


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


def halaman_errors_only(action: str):
    """Decorator for engine entry points: an exception that is not a HalamanError (a bug, or
    MemoryError) leaves the call as a HalamanError whose one line names `action` ("opening the
    document") and the exception's type; the original is chained (`__cause__`) for the log."""
    import functools

    def wrap(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except HalamanError:
                raise
            except MemoryError:
                raise HalamanError(f"{action} ran out of memory: close other programs or lower the cache budget") from None
            except Exception as error:  # noqa: BLE001 - the boundary: nothing else may escape
                first_line = str(error).splitlines()[0][:200] if str(error) else ""
                raise HalamanError(f"{action} failed with an internal error ({type(error).__name__}: {first_line}): "
                                   "please report it with the log") from error
        return call
    return wrap
