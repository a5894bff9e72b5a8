"""Continue, Export chat…, the draft's token count and model-written titles, installed on
a ``MainWindow`` in one call (``install_extras``), each in its own module:
``continue_flow.py``, ``export_flow.py``, ``transcript/draft_count.py``, ``title_job.py``."""

from __future__ import annotations

from dataclasses import dataclass

from app.window.flows.continue_flow import ContinueFlow
from app.window.flows.export_flow import ExportFlow
from app.window.flows.title_job import TitleJob
from app.window.transcript.draft_count import DraftCount


@dataclass
class Extras:
    """The flows ``install_extras`` made (the window keeps them as ``window.extras``)."""

    continuing: ContinueFlow
    exporting: ExportFlow
    draft_count: DraftCount
    titles: TitleJob


def install_extras(window) -> Extras:
    """Create the flows on ``window`` (a MainWindow with its chat, model, reader, composer,
    transcript and banner built) and connect them; the draft count's label goes under the
    composer."""
    chat = window.chat
    continuing = ContinueFlow(chat, window)
    window.transcript.continue_requested.connect(continuing.continue_reply)
    exporting = ExportFlow(chat=chat, reader=window.reader, banner=window.banner, parent=window)
    draft = DraftCount(chat=chat, model=window.model, composer=window.composer, parent=window)
    box = window.composer.parentWidget().layout()
    box.insertWidget(box.indexOf(window.composer) + 1, draft.label)
    titles = TitleJob(chat=chat, model=window.model, reader=window.reader, parent=window)
    return Extras(continuing, exporting, draft, titles)
