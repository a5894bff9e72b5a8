"""``branchwise models``: find GGUF models on a hub, see whether they fit, download them
(resumable, SHA-256 checked) and keep a library. A command module (app/cli/commands/):
:func:`add_parser` adds the subcommand, :func:`run` runs it. No Qt, no llama.cpp.

Nothing contacts the network except ``search`` with a query, ``files`` and ``download``;
each names the host first (``HF_ENDPOINT`` or huggingface.co).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from app.cli import opening
from app.cli.arguments import common_options
from app.cli.exit_codes import EXIT_ERROR

NAME = "models"
LOADS_ENGINE = False
STOP_ON_TERM = False


def add_parser(subparsers) -> None:
    """Add ``models`` and its actions to ``subparsers``."""
    common = common_options()
    models = subparsers.add_parser("models", help="find, download and keep GGUF models")
    sub = models.add_subparsers(dest="action", required=True, parser_class=type(models))
    s = sub.add_parser("search", parents=[common], help="search the hub for GGUF repositories "
                       "(no query: a starter list of well-known models, no network)")
    s.add_argument("query", nargs="?", default="")
    s.add_argument("--limit", type=int, default=20)
    f = sub.add_parser("files", parents=[common], help="a repository's GGUF files by quantization, with "
                       "the memory each needs and whether it fits")
    f.add_argument("repo")
    f.add_argument("--ctx-size", type=int, default=8192, help="context the estimate is for (default 8192)")
    f.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16")
    d = sub.add_parser("download", parents=[common], help="download a model into the library (resumes; "
                       "FILE defaults to the recommended one)")
    d.add_argument("repo")
    d.add_argument("file", nargs="?", help="a file name or a quantization such as Q4_K_M")
    d.add_argument("--ctx-size", type=int, default=8192)
    d.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16")
    ls = sub.add_parser("list", parents=[common], help="the models in the library")
    ls.add_argument("--others", action="store_true",
                    help="also models other apps downloaded (LM Studio, Ollama, GPT4All, Jan), used in place")
    rm = sub.add_parser("rm", parents=[common], help="delete a model from the library")
    rm.add_argument("name")
    rm.add_argument("--forget-blocks", action="store_true",
                    help="also delete the model's KV blocks and checkpoints from the prefix store")
    sub.add_parser("login", parents=[common], help="store a hub access token (read from stdin) for gated "
                   "repositories, 0600 in the data folder")


def run(args) -> int:
    """Run ``branchwise models ACTION``; returns the exit code (0, or 1 with one line on stderr)."""
    from engine.hub.catalog import HubError
    from engine.hub.download import DownloadError
    from engine.hub.header import HeaderError
    from engine.hub.library import LibraryError

    data_dir = opening.data_dir(args)
    try:
        return {"search": _search, "files": _files, "download": _download, "list": _list, "rm": _rm,
                "login": _login}[args.action](args, Path(data_dir))
    except (HubError, DownloadError, HeaderError, LibraryError, ValueError, OSError) as exc:
        print(f"branchwise: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc)}))
        return EXIT_ERROR


def _say(args, text: str) -> None:
    if not args.json and not args.quiet:
        print(text, file=sys.stderr)


def _search(args, data_dir: Path) -> int:
    from engine.hub import catalog

    if not args.query.strip():
        starters = catalog.starter_models()
        if args.json:
            print(json.dumps({"starter": True, "models": starters}))
            return 0
        print("Well-known instruct models (no search made; 'branchwise models search QUERY' searches the hub):")
        for m in starters:
            kind = "reasoning" if m["reasoning"] else "instruct"
            print(f"  {m['repo']:<44} {m['params']:>6} {m['quantization']:<7} ≈ {m['size_gb']:.1f} GB  {kind}"
                  f"  {m['licence']}" + (f"  ({m['note']})" if m["note"] else ""))
        return 0
    _say(args, f"Searching {catalog.host()} for GGUF models matching {args.query!r}…")
    results = catalog.search(args.query, limit=args.limit, token=catalog.read_token(data_dir))
    if args.json:
        print(json.dumps({"host": catalog.host(), "results": [r.to_dict() for r in results]}))
        return 0
    if not results:
        print(f"No GGUF repositories on {catalog.host()} match {args.query!r}.")
    for r in results:
        print(f"  {r.repo:<50} {r.downloads or 0:>10,} downloads {r.likes or 0:>6,} likes  "
              f"{r.licence or 'licence ?':<14} updated {r.updated or '?'}" + ("  gated" if r.gated else ""))
    return 0


def _fitted(repo_files, token: str | None, n_ctx: int, kv_type: str):
    """Each file of ``repo_files`` with its fit labels (``engine.hub.fit.fit_repo_files``)."""
    from engine.hub import fit

    return fit.fit_repo_files(repo_files, token, n_ctx, kv_type)


def _files(args, data_dir: Path) -> int:
    from engine.hub import catalog

    token = catalog.read_token(data_dir)
    _say(args, f"Reading {args.repo} from {catalog.host()}…")
    repo_files = catalog.repo_files(args.repo, token=token)
    rows, available = _fitted(repo_files, token, args.ctx_size, args.kv_type)
    if args.json:
        print(json.dumps({"host": catalog.host(), "repo": repo_files.repo, "revision": repo_files.revision,
                          "licence": repo_files.licence, "available": available,
                          "quantizations": {q: [f.to_dict() for f in fs]
                                            for q, fs in repo_files.by_quantization().items()}}))
        return 0
    print(f"{repo_files.repo} ({repo_files.licence or 'licence ?'}) on {catalog.host()}; "
          f"{available / 1e9:,.1f} GB of memory available")
    if not rows:
        print("  no GGUF model files in this repository")
    for q, fs in repo_files.by_quantization().items():
        for f in fs:
            parts = f"{len(f.parts)} parts" if len(f.parts) > 1 else ""
            star = "  ★ Recommended" if f.labels["recommended"] else ""
            print(f"  {q:<8} {f.size / 1e9:>7.2f} GB {parts:<8} {f.labels['text']}; up to "
                  f"{f.labels['largest_context']:,} tokens fit{star}\n           {f.name}")
    return 0


def _pick(rows, wanted: str | None):
    if wanted:
        w = wanted.lower()
        for f in rows:
            if w in (f.name.lower(), Path(f.name).name.lower()) or w in [p.lower() for p in f.parts]:
                return f
        by_quant = [f for f in rows if f.quantization.lower() == w]
        if by_quant:
            return max(by_quant, key=lambda f: f.size)
        raise ValueError(f"The repository has no file or quantization {wanted!r}; 'branchwise models files REPO' "
                         "lists them.")
    rec = [f for f in rows if f.labels.get("recommended")]
    if not rec:
        raise ValueError("No file of this repository fits this machine's memory with room to spare; name one "
                         "to download it anyway.")
    return rec[0]


def _download(args, data_dir: Path) -> int:
    from engine.hub import catalog, download, library

    token = catalog.read_token(data_dir)
    _say(args, f"Reading {args.repo} from {catalog.host()}…")
    repo_files = catalog.repo_files(args.repo, token=token)
    rows, _available = _fitted(repo_files, token, args.ctx_size, args.kv_type)
    chosen = _pick(rows, args.file)
    files, extra = catalog.download_plan(repo_files, chosen)
    _say(args, f"Downloading {chosen.name} ({chosen.size / 1e9:,.2f} GB{', %d parts' % len(files) if len(files) > 1 else ''}) "
               f"from {catalog.host()}: {chosen.labels['text']}")
    progress, close = _progress(args, chosen.name)
    try:
        paths = download.download(files, library.models_dir(data_dir), repo_files.repo, token=token,
                                  progress=progress, extra=extra)
    except KeyboardInterrupt:
        close()
        print("branchwise: download stopped; the bytes so far are kept and the same command continues from "
              "there.", file=sys.stderr)
        return 130
    finally:
        close()
    model = library.describe_file(paths[0], "Branchwise", source=repo_files.repo)
    if args.json:
        print(json.dumps({"downloaded": model.to_dict()}))
    else:
        print(f"Saved {model.name} ({model.size / 1e9:,.2f} GB, SHA-256 checked) in {paths[0].parent}; "
              f"chat with it: branchwise chat --model {model.name}")
    return 0


def _progress(args, name: str):
    """A (progress callback, close) pair: a rich bar with bytes, speed and time left on a
    terminal, else a no-op."""
    if args.json or args.quiet or not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task(name, total=None)
    bar.start()
    lock = threading.Lock()
    last = [0.0]

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        with lock:
            if now - last[0] >= 0.1 or done >= total:
                last[0] = now
                bar.update(task, completed=done, total=total)

    return update, bar.stop


def _list(args, data_dir: Path) -> int:
    from engine.hub import library

    models = library.list_library(data_dir)
    others = library.list_others() if args.others else []
    builtin = library.builtin_models()
    if args.json:
        print(json.dumps({"folder": str(library.models_dir(data_dir)), "models": [m.to_dict() for m in models],
                          "builtin": [m.to_dict() for m in builtin], "others": [m.to_dict() for m in others]}))
        return 0
    if not models:
        print(f"No models downloaded yet ({library.models_dir(data_dir)}); 'branchwise models search' finds some.")
    for m in builtin + models + others:
        origin = ("" if m.origin == "Branchwise" else "  [embedded in Branchwise]" if m.origin == library.BUILTIN
                  else f"  [{m.origin}, used in place]")
        ctx = f"{m.context_length:,}" if m.context_length else "?"
        print(f"  {m.name:<40} {m.quantization:<8} {m.size / 1e9:>6.2f} GB  ctx {ctx:>7}  "
              f"{m.architecture or '?':<10} {m.treatment}{origin}")
    if args.others and not others:
        print("No models found in the folders of LM Studio, Ollama, GPT4All or Jan.")
    return 0


def _rm(args, data_dir: Path) -> int:
    from engine.hub import library

    model = library.find(data_dir, args.name)
    freed = library.forget_blocks(data_dir, model) if model is not None and args.forget_blocks else None
    model = library.remove(data_dir, args.name)
    if args.json:
        print(json.dumps({"removed": model.to_dict(), "blocks_deleted": freed}))
    elif freed is not None:
        print(f"Removed {model.name} ({model.size / 1e9:,.2f} GB) from {Path(model.path).parent} and its "
              f"{freed:,} KV blocks from the prefix store.")
    else:
        print(f"Removed {model.name} ({model.size / 1e9:,.2f} GB) from {Path(model.path).parent}. Its KV blocks "
              "stay in the prefix store until evicted ('branchwise models rm NAME --forget-blocks' frees them "
              "with the model).")
    return 0


def _login(args, data_dir: Path) -> int:
    from engine.hub import catalog

    if sys.stdin.isatty():
        import getpass

        token = getpass.getpass("Hub access token (not shown): ")
    else:
        token = sys.stdin.readline()
    path = catalog.save_token(data_dir, token)
    print(f"Token stored in {path} (readable by you only); it is sent only to {catalog.host()}.")
    return 0
