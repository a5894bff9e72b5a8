"""``branchwise serve``: the command-line side of the OpenAI-compatible API (the server
itself is app/serve/server.py; the ``--engine-url`` client is engine/remote.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli import arguments, opening
from app.cli.arguments import common_options, engine_options
from app.serve import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_QUEUE

NAME = "serve"
LOADS_ENGINE = True
"""Runs in the supervised child (app/cli/supervisor.py)."""
STOP_ON_TERM = False
"""uvicorn takes SIGTERM itself."""

SERVE_HELP = """\
Serve the model and its KV prefix store over an OpenAI-compatible HTTP API:
POST /v1/chat/completions (streaming and not) and GET /v1/models. Point any OpenAI
client at http://HOST:PORT/v1. Every request goes through the prefix store, so a
client that resends a long history gets it restored instead of re-prefilled, also
after a restart; usage.prompt_tokens_details.cached_tokens says how many prompt
tokens were restored. --temperature, --top-p, --max-tokens and the other sampling
options set the defaults for fields a request leaves out (otherwise the same as
'branchwise chat'). With --json the start-up line is one JSON object
{"url", "port", "model"}. Requests are served one at a time, in order; when --queue-size
requests wait, more get 429 with Retry-After.

Tool calling: 'tools', 'tool_choice' ("none", "auto", "required" or a named function)
and 'parallel_tool_calls' are rendered by the model's own chat template; "required" and a
named function are forced by a grammar from the tools' JSON schemas. A model whose
template has no tool support (the default model's) answers 400 when it may call a tool.

Served conversations are NOT saved to your chats: the client keeps its own history
and resends it every time, and your chat list stays yours. Only the KV cache
(kvcache.sqlite3) and the token ids of the replies sent (serve-replies.sqlite3, so a
resent reply matches the cache) are written to the data folder.

It listens on 127.0.0.1 only, unless --host names another address; that needs
--api-key, and then every request must send 'Authorization: Bearer KEY'.

Web pages cannot use it: a request whose Host header is not the address it listens
on (localhost, 127.0.0.1 or [::1] on loopback), one with an Origin header (browsers
send it) not allowed, and a POST body that is not 'Content-Type: application/json' get 403.
--allowed-host and --allowed-origin let chosen ones through."""


def add_parser(sub) -> None:
    """Add ``serve`` to the CLI's subcommands (with the data-dir and engine options; the
    sampling options become the defaults for fields a request leaves out)."""
    parents = [common_options(), engine_options()]
    p = sub.add_parser("serve", parents=parents, help="an OpenAI-compatible API for other tools",
                       description=SERVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}; "
                                                        "any other needs --api-key)")
    p.add_argument("--port", type=arguments.port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request (env BRANCHWISE_API_KEY)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also accept this name in the Host header (repeatable; e.g. a reverse proxy's name)")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="accept requests, and answer CORS pre-flights, from this web origin (repeatable; "
                        "e.g. http://localhost:3000); every other Origin gets 403")
    p.add_argument("--queue-size", type=arguments.queue_size, default=DEFAULT_QUEUE,
                   help=f"requests that may wait behind the running one before 429 (default {DEFAULT_QUEUE})")


def run(args) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit code (0 once stopped).

    Raises:
        ServeError: a public ``--host`` without an API key, or a port out of range.
    """
    import os

    from app.serve.replies import FILE_NAME, ReplyMemory
    from app.serve import ServeError
    from app.serve.server import ApiServer, is_loopback

    api_key = args.api_key or os.environ.get("BRANCHWISE_API_KEY") or None
    if not is_loopback(args.host) and not api_key:  # refuse before loading anything
        raise ServeError(f"Refusing to listen on {args.host} without an API key: anyone who can reach this machine "
                         f"could use the model. Pass --api-key KEY, or leave --host at {DEFAULT_HOST}.")
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be between 0 and 65535, not {args.port}.")
    engine = opening.open_engine(args)
    defaults = opening.sampling(args, _NoConversation())
    model_id = Path(args.model).stem if args.model else "SmolLM2-135M-Instruct.Q4_1"
    memory = ReplyMemory(opening.data_dir(args) / FILE_NAME)
    server = ApiServer(engine, model_id, host=args.host, port=args.port, api_key=api_key,
                       queue_size=max(args.queue_size, 1), reply_memory=memory,
                       sampling=defaults, use_cache=not args.no_cache,
                       on_state=lambda state: _announce(server, state, args.json),
                       allowed_hosts=args.allowed_host, allowed_origins=args.allowed_origin)
    if engine.store is None and not args.no_cache:
        print("branchwise serve: running without the KV prefix store (see the line above); every request "
              "is prefilled in full", file=sys.stderr)
    terminated = _TermFlag()
    try:
        with terminated:
            server.serve_forever()
    finally:
        memory.close()
        engine.close()
    if terminated.got:  # uvicorn stops gracefully, then re-raises the SIGTERM it took to our handler
        print("branchwise serve: stopped (SIGTERM)", file=sys.stderr)
        return 128 + terminated.got
    if not args.json:
        print("branchwise serve: stopped", file=sys.stderr)
    return 0


class _TermFlag:
    """While serving: SIGTERM is remembered instead of ending the process at once.
    uvicorn takes SIGTERM itself while it runs, shuts down gracefully and then raises the
    signal again to the handler that was there before: this one, so ``serve`` can say it
    stopped and exit 143 (a bare default handler would end the process without a word)."""

    def __init__(self):
        self.got = 0
        self._previous = None

    def __enter__(self):
        import contextlib
        import signal

        def remember(signum, _frame):
            self.got = signum

        with contextlib.suppress(ValueError):  # not the main thread (tests run commands inline)
            self._previous = signal.signal(signal.SIGTERM, remember)
        return self

    def __exit__(self, *exc):
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


class _NoConversation:
    sampling = None


def _announce(server, state, as_json: bool) -> None:
    import json

    from app.serve.server import ServerState

    if state == ServerState.RUNNING and as_json:
        print(json.dumps({"url": server.url, "port": server.port, "model": server.model_id}), flush=True)
    elif state == ServerState.RUNNING:
        key = " (API key required)" if server.api_key else ""
        print(f"branchwise serve: {server.model_id} at {server.url}{key}; Ctrl-C stops", flush=True)
