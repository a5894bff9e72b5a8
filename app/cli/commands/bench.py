"""``branchwise bench``: the figures the prefix store exists for (app/bench/)."""

from __future__ import annotations

NAME = "bench"
LOADS_ENGINE = True
"""Runs in the supervised child (app/cli/supervisor.py)."""
STOP_ON_TERM = False


def add_parser(sub) -> None:
    """Add ``bench`` to ``sub`` (the CLI's subparsers)."""
    bench = sub.add_parser(
        "bench", help="one table beside llama-server: restore, snapshot, prefill, decode, speculative decode")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    bench.add_argument("--model", help="a GGUF model (default: the embedded one)")
    bench.add_argument("--quick", action="store_true", help="smaller workload (for a smoke test)")
    bench.add_argument("--llama-server", metavar="PATH",
                       help="a llama-server binary: measure it in the same run (slot save/restore, prefill, "
                            "decode, --spec-type ngram-simple) and print each ratio")
    bench.add_argument("--store", action="store_true",
                       help="only the prefix store's own figures: resume in a new process, restore, snapshot, "
                            "sharing between branches (several minutes)")
    bench.add_argument("--cpu", action="store_true",
                       help="only measure prefill speed with llama.cpp's weight repacking on and off")
    bench.add_argument("--threads", action="store_true",
                       help="only measure prefill and decode speed for each CPU thread count")
    bench.add_argument("--serve", action="store_true",
                       help="only the API server comparison: TTFT for a resent 2,000-token history after a "
                            "restart, branchwise serve vs python -m llama_cpp.server")


def run(args) -> int:
    """Run the bench ``args`` asks for (``--threads``, ``--cpu``, ``--serve``, ``--store``, else
    the side-by-side table of app/bench/compare.py); returns the exit code."""
    if args.threads:
        from app.bench.threads import run_threads_bench

        return run_threads_bench(as_json=args.json)
    if args.cpu:
        from app.bench.cpu import run_cpu_bench

        return run_cpu_bench(as_json=args.json)
    if args.serve:
        from app.bench.serve import run_serve_bench

        return run_serve_bench(model=args.model, as_json=args.json, quick=args.quick)
    if not args.store:
        from app.bench.compare import run_compare

        return run_compare(model=args.model, as_json=args.json, llama_server=args.llama_server)
    from app.bench.store import run_bench

    return run_bench(model=args.model, as_json=args.json, quick=args.quick,
                     llama_server=args.llama_server)
