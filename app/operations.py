"""One named operation per thing the user asks the engine to do (as Anki's `aqt/operations/`): each
returns the `Job` that runs it on the worker thread, with the caller's callbacks (`on_done`,
`on_error`, `on_progress`, `on_text`) passed through. The window submits them; it never writes
`lambda workspace, ctx: …` itself, so what each action calls in the engine is read here, in one place.
Applying settings is the client's own job (`EngineClient.apply_settings`): it changes the client's
state as well as the workspace's.

Questions the engine asks mid-job go to the GUI as a `ConfirmRequest` (`ctx.confirm(kind, payload)`)
of a `Confirm` kind.
"""

from __future__ import annotations

import enum
import threading

from app.worker import Job


class Confirm(enum.Enum):
    """What a job asks the user mid-way: CLOUD (payload a `CloudPlan`: send it?) or LONG_READ
    (payload a `ReadPlan`: read it all?)."""

    CLOUD = "cloud"
    LONG_READ = "long read"


def load_model(**callbacks) -> Job:
    """Load (or convert, the first time) the model in the settings."""
    return Job("load model", lambda workspace, ctx: workspace.ensure_model(ctx.progress), title="Loading the model…", **callbacks)


def open_document(path: str, *, name: str, password: str | None = None, **callbacks) -> Job:
    """Read `path` and build its index, then restore its prefix cache or, index first, leave its
    whole read to `read_document` (a document the cache keeps whole is prefilled here: short). A
    prefill here of at least `engine.read_time.LONG_READ_S` on this machine first asks the user
    (`Confirm.LONG_READ`)."""
    def run(workspace, ctx):
        return workspace.open(path, password=password, progress=ctx.progress, cancel=ctx.cancel,
                              before_prefill=lambda plan: ctx.confirm(Confirm.LONG_READ, plan), read_now=False)

    return Job("open", run, title=f"Opening {name}…", **callbacks)


def read_document(*, pause: threading.Event, **callbacks) -> Job:
    """Read the open document whole (it was opened index first); the result is its `OpenReport`, or
    None when `pause` stopped the read between two chunks (submit another to go on)."""
    return Job("read", lambda workspace, ctx: workspace.read(progress=ctx.progress, cancel=ctx.cancel, pause=pause),
               title="Reading the whole document (you can ask meanwhile)…", **callbacks)


def ask_local(question: str, *, follow_up: bool | None, **callbacks) -> Job:
    """Answer with the local model over the open document's KV cache; the result is an
    `AnswerOutcome` (the answer, its library record, its escalation to the cloud)."""
    def run(workspace, ctx):
        return workspace.outcome(workspace.ask(question, follow_up=follow_up, on_text=ctx.text, cancel=ctx.cancel,
                                               progress=ctx.progress))

    return Job("ask", run, title="Answering…", **callbacks)


def follow_up_decision(question: str, *, follow_up: bool | None, **callbacks) -> Job:
    """Whether `question`, asked next, goes on from the last question (`DocumentSession.continues`:
    why, "" when it starts afresh), decided before its answer so the window says so from the start."""
    def run(workspace, ctx):
        return workspace.session.continues(question, follow_up) if workspace.session is not None else ""

    return Job("follow-up decision", run, title="Answering…", **callbacks)


def ask_library(question: str, paths: list[str], **callbacks) -> Job:
    """Answer from the documents of `paths` the question picks (`Workspace.ask_library`); the
    result is an `AnswerOutcome` whose `documents` are those it read, the best first."""
    def run(workspace, ctx):
        return workspace.library_outcome(workspace.ask_library(question, paths, on_text=ctx.text, cancel=ctx.cancel))

    return Job("ask library", run, title="Answering from the library…", **callbacks)


def ask_cloud(question: str, *, reason: str, **callbacks) -> Job:
    """Answer with the cloud endpoint in Settings; with "ask before sending" on, the user sees what
    would be sent first. The result is an `AnswerOutcome`, or None if they decline."""
    def run(workspace, ctx):
        confirm = (lambda plan: ctx.confirm(Confirm.CLOUD, plan)) if workspace.settings.cloud.ask_before_sending else None
        answer = workspace.ask_cloud(question, reason=reason, on_text=ctx.text, cancel=ctx.cancel, confirm=confirm)
        return workspace.outcome(answer) if answer is not None else None

    return Job("cloud", run, title="Asking the cloud…", **callbacks)


def prefix_cache_status(token_counts: set[int], **callbacks) -> Job:
    """The prefix caches on disk and the signature documents of `token_counts` prefix tokens would
    be keyed with now (a `CacheStatus`, for the library's "cached" / "stale")."""
    return Job("cache status", lambda workspace, ctx: workspace.cache_status(token_counts), **callbacks)


def prefix_cache_usage(**callbacks) -> Job:
    """(entries, bytes) of the prefix caches on disk, for Settings."""
    return Job("cache usage", lambda workspace, ctx: workspace.prefix_cache_usage(), **callbacks)


def clear_prefix_cache(**callbacks) -> Job:
    """Delete every saved prefix cache; the result is how many were removed."""
    return Job("clear cache", lambda workspace, ctx: workspace.clear_prefix_cache(), **callbacks)
