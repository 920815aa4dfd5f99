"""What one operation changed, as one value (Anki's `OpChanges`). A flow or the window does its
operation, updates the `DocumentState`, then emits a `Changes` on the window's `changed` signal;
each panel refreshes itself from the fields it shows (`app.panel_refresh`). So an operation never
lists the panels it affects, and a new panel never adds a call to every flow.

Emitted on the GUI thread, after the state is updated: a panel reads the state as it now is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Changes:
    """What changed; every field False by default, so an operation names only what it touched.

    shown: the chat shows another library document (or a new file being read), or the one it shows
    was removed or opened. reading: a read started, ended, or a reread under new settings was given
    up (whether a question can be asked). library: the library's documents or their prefix-cache
    status. history: a chat's messages (a question asked, an answer started or ended). settings: the
    settings in use. model: the model loaded or was unloaded. busy: the worker started work or ran
    out of it."""

    shown: bool = False
    reading: bool = False
    library: bool = False
    history: bool = False
    settings: bool = False
    model: bool = False
    busy: bool = False
