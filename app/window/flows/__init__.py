"""What happens when the user asks for something that takes more than one step: the
model and the engine process (model_controller.py, crash.py, stop_watchdog.py), a message
too long for the context (overflow_flow.py), an unanswered question (unanswered.py),
prewarming the next prompt, import, the API server, Delete and forget, links, and the
actions on one message."""
