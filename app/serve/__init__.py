"""The OpenAI-compatible HTTP API both ways.

* :mod:`app.serve.server`: ``branchwise serve``, the engine and its prefix store behind
  ``/v1/chat/completions`` and ``/v1/models`` (:class:`~app.serve.server.ApiServer`; the
  window runs ``branchwise serve`` as a child process, app/window/flows/server_controller.py).
* :mod:`app.serve.protocol`: request validation and response shapes.
* :mod:`app.serve.replies`: the token ids of the replies the server sent.
* the CLI's ``serve`` is :mod:`app.cli.commands.serve`; the ``--engine-url`` client is
  :mod:`engine.remote`.

Kept import-light: the CLI imports this package to build its parser.
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_QUEUE = 8


class ServeError(Exception):
    """The server cannot start (a public address without a key, a port in use); the
    message says what to change."""
