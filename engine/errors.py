"""Errors the engine raises, each with a message a person can act on."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: ``str(err)`` is a sentence fit for a dialog or a CLI's stderr."""


class ModelLoadError(EngineError):
    """The model file is missing, unreadable, not a GGUF, truncated or unsupported."""


class TemplateError(EngineError):
    """The model's chat template could not be rendered for these messages."""


class ContextOverflowError(EngineError):
    """The prompt does not fit the context window.

    Attributes: ``prompt_tokens`` and ``n_ctx`` (tokens).
    """

    def __init__(self, prompt_tokens: int, n_ctx: int):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"This conversation is {prompt_tokens:,} tokens long, but the context window holds "
            f"{n_ctx:,}."
        )  # what to do about it is the front end's to say (a CLI flag, a window's dialog)


class EngineCrashedError(EngineError):
    """The engine process exited while serving a request."""
