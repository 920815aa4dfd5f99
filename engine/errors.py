"""Errors the user sees.

Every exception that crosses the engine boundary is a `HalamanError` whose `str()` is one line
naming the problem and what to do about it; the CLI prints it as is and the GUI shows it in the
window. Anything else escaping the engine is a bug.
"""

import enum
import sys


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


class OutOfMemory(HalamanError):
    """Memory ran out during an engine call: `where` is "GPU" or "system". A lower KV budget
    (`engine.workspace.lowered_budget`) or fewer other programs may let it through."""

    def __init__(self, action: str, where: str) -> None:
        super().__init__(f"{action} ran out of {where} memory: lower the KV budget or close other programs, then retry")
        self.where = where


def out_of_memory(exc: BaseException) -> str | None:
    """"GPU" or "system" when `exc` says that memory ran out there (torch's out-of-memory error,
    MemoryError, an `OutOfMemory`); None for any other exception."""
    if isinstance(exc, OutOfMemory):
        return exc.where
    torch = sys.modules.get("torch")  # not imported: no torch error to recognise, and none is imported for it
    # torch.OutOfMemoryError is the name since torch 2.5; torch.cuda's is the same class.
    torch_oom = getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if torch_oom is not None and isinstance(exc, torch_oom):
        return "GPU"
    if isinstance(exc, MemoryError):
        return "system"
    return None


class Cancelled(HalamanError):
    """The user cancelled a running prefill or generation."""

    def __init__(self, message: str = "Cancelled.") -> None:
        super().__init__(message)


def halaman_errors_only(action: str):
    """Decorator for engine entry points: nothing but a HalamanError leaves the call. Running out of
    memory (`out_of_memory`) raises OutOfMemory naming `action` ("opening the document"), so callers
    can offer a lower budget; any other exception (a bug) raises a HalamanError whose one line names
    `action` and the exception's type, the original chained (`__cause__`) for the log."""
    import functools

    def wrap(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except HalamanError:
                raise
            except Exception as error:  # noqa: BLE001 - the boundary: nothing else may escape
                where = out_of_memory(error)
                if where is None:
                    first_line = str(error).splitlines()[0][:200] if str(error) else ""
                    raise HalamanError(f"{action} failed with an internal error ({type(error).__name__}: {first_line}): "
                                       "please report it with the log") from error
            # Raised outside the handler, without the original: its traceback holds the failed
            # call's frames and the tensors they allocated, which the retry needs back.
            raise OutOfMemory(action, where)
        return call
    return wrap
