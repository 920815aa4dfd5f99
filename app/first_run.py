"""The first start on the built-in model. LM Studio and Jan begin by helping the user pick a model
that fits the machine; Halaman ships a small demo model so that it answers at once, and says so
once, plainly, with the way to a better one: the model list of Settings, with whether each model
fits this machine and its download (`app.model_list`). Said once (`WindowStore.demo_notice_shown`),
when the embedded model is the one in use and no other model of the list is downloaded.
"""

from __future__ import annotations

from engine.models.catalog import CatalogModel, load_catalog
from engine.models.download import downloaded_folder
from engine.settings import EngineSettings

DEMO_NOTICE = ("Halaman is answering with its built-in model, a small demo: it finds the right pages, but its "
               "answers often get details wrong. A bigger model that fits this computer answers much better.")
CHOOSE = "Choose a model…"
DEMO_STATUS = " · a small demo model: Settings › Model lists bigger ones"
"""What the status bar adds to the built-in model's line, at every start (the notice is said once)."""


def demo_model_only(settings: EngineSettings, models: list[CatalogModel] | None = None) -> bool:
    """The model in use is the embedded one and no other model of `models` (default: the bundled
    list) has been downloaded."""
    if settings.model != "default":
        return False
    models = load_catalog() if models is None else models
    return not any(downloaded_folder(model.repo) for model in models if not model.embedded)


def offer_models(window) -> None:
    """Open Settings on its model list (`window`: a `MainWindow`)."""
    window.show_settings()
    dialog = window.settings_flow.dialog
    if dialog is not None:
        dialog.scroll.ensureWidgetVisible(dialog.model_list)
        dialog.model_list.table.setFocus()


def say_once_if_demo(window) -> bool:
    """After the model loaded: the demo notice in `window`'s banner, with the way to the model list,
    the first time the embedded model is the only one. Not over an error or a warning (then at a
    later start). True when it was shown now."""
    if window.store.demo_notice_shown or window.banner.isVisible() or not demo_model_only(window.settings):
        return False
    window.banner.show_message("info", DEMO_NOTICE, CHOOSE, lambda: offer_models(window))
    window.store.demo_notice_shown = True
    return True
