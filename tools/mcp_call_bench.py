"""Per-call time of an MCP tool call through ``McpHub``: ``python -m tools.mcp_call_bench``.

Calls ``echo`` of the test server (tests/mcp_test_server.py, the official SDK over stdio)
``--calls`` times in a row, as the window's tool loop does, and prints each call's wall
time (from the request to its result, server start-up included when there is one) and
the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "mcp_test_server.py"


def run(calls: int) -> dict:
    """``{"load_before", "load_after", "calls_ms": [..]}``: each call's wall time, ms."""
    from app.session.mcp_servers import McpHub, McpServerConfig

    server = McpServerConfig("testing", sys.executable, (str(SERVER),))
    out: dict = {"load_before": [round(x, 2) for x in os.getloadavg()], "calls_ms": []}
    hub = McpHub()
    try:
        for i in range(calls):
            t0 = time.perf_counter()
            result = hub.call_tool(server, "echo", {"text": f"call {i}"}).result(300)
            if result.error:
                raise RuntimeError(result.error)
            out["calls_ms"].append(round((time.perf_counter() - t0) * 1000, 1))
    finally:
        hub.close()
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(run(args.calls)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
