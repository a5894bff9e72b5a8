"""The conversation rules, shared by the CLI and the window; no Qt here.

``ConversationSession`` (conversation.py) knows what send, edit, regenerate, fork and
switching siblings do to the conversation tree in ``chats.sqlite3``, and what to offer
when a prompt overflows the context. ``ReplyRecorder`` (recorder.py) owns one streaming
reply from its first token to its final status and stats. ``labels.py`` holds the
wording both front ends share (the model label stored on a reply, the stats line).

The CLI feeds a recorder from ``engine.core.Engine.generate`` callbacks; the window
feeds it from ``app.window.workers.engine_client.EngineClient`` signals. Neither keeps its own
copy of these rules. An import-linter contract in pyproject.toml keeps Qt out.
"""

from app.session.conversation import ConversationSession, is_empty_reply, suggested_context_size
from app.session.labels import model_label, reply_status_line, restored_words
from app.session.recorder import ReplyRecorder, ReplyState

__all__ = ["ConversationSession", "ReplyRecorder", "ReplyState", "is_empty_reply", "model_label",
           "reply_status_line", "restored_words", "suggested_context_size"]
