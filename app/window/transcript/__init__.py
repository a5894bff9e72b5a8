"""The shown conversation: ``ChatController`` (chat_controller.py: send, edit, regenerate,
the streaming reply), the transcript of message bubbles (transcript_view.py and the bodies
and Markdown view they draw with), the composer, and what a turn draws (reply_view.py),
counts (path_figures.py) and times (send_timeline.py)."""
