"""Chat with your documents: extract a file's text safely, render it in one fixed form,
cut it into passages to search (README, "Chat with your documents").

Qt-free. ``sandbox.attach_file`` / ``attach_bytes`` give a ``Document`` (or raise
``DocumentError``, one sentence); ``render`` is the prompt form; ``attach`` stores, links
and renders attachments through ``storage.attachments``; ``limits`` holds every cap.
"""

from engine.documents.extract import DocumentError, Extracted
from engine.documents.sandbox import Document, attach_bytes, attach_file

__all__ = ["Document", "DocumentError", "Extracted", "attach_bytes", "attach_file"]
