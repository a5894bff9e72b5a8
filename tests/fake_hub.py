"""A fake Hugging Face hub on 127.0.0.1 for the model tests: a small Starlette app serving
what ``huggingface_hub`` and Branchwise's downloader call.

* ``GET /api/models?search=Q&filter=gguf`` -> the repositories whose id contains Q;
* ``GET /api/models/{owner}/{name}`` and ``.../revision/{rev}`` -> model info with
  ``siblings`` (``rfilename``, ``size``, ``blobId``, ``lfs.sha256``) and ``sha``;
* ``GET|HEAD /{owner}/{name}/resolve/{rev}/{file}`` -> the bytes, honouring ``Range``,
  with ``ETag``, ``X-Repo-Commit``, ``X-Linked-Size``, ``X-Linked-Etag``.

Knobs (attributes of :class:`FakeHub`, changeable while it runs): ``throttle`` (bytes per
second per response), ``drop_after`` (close the connection after N bytes of a response,
once), ``wrong_hash`` (file names whose LFS sha256 is reported wrong), ``gated`` (repos
that answer 403 without a token). Every file response is logged in ``log`` as
``[file, start, bytes_sent, open_ended]`` (open_ended: ``Range: bytes=N-`` or none, as a
download asks; a header read asks for ``bytes=0-N``).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, Path]  # name in the repo -> file on disk
    downloads: int = 100
    likes: int = 5
    licence: str = "apache-2.0"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    throttle: int = 0
    drop_after: int = 0
    wrong_hash: set[str] = field(default_factory=set)
    gated: set[str] = field(default_factory=set)
    log: list[list] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    hashes: dict[Path, str] = field(default_factory=dict)

    def sha(self, path: Path) -> str:
        if path not in self.hashes:
            self.hashes[path] = _sha256(path)
        return self.hashes[path]

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        hub = self

        def info(repo_id: str, blobs: bool) -> dict:
            repo = hub.repos[repo_id]
            siblings = []
            for name, path in repo.files.items():
                size = path.stat().st_size
                sib = {"rfilename": name}
                if blobs:
                    sha = hub.sha(path)
                    if name in hub.wrong_hash:
                        sha = "0" * 64
                    sib.update(size=size, blobId="b" * 40, lfs={"sha256": sha, "size": size, "pointerSize": 134})
                siblings.append(sib)
            siblings.append({"rfilename": "README.md", **({"size": 10, "blobId": "c" * 40} if blobs else {})})
            return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "downloads": repo.downloads,
                    "likes": repo.likes, "lastModified": "2025-03-04T05:06:07.000Z", "private": False,
                    "gated": "manual" if repo_id in hub.gated else False,
                    "tags": ["gguf", f"license:{repo.licence}"], "siblings": siblings}

        def denied(repo_id: str, request) -> Response | None:
            if repo_id in hub.gated and "authorization" not in request.headers:
                return Response("gated", status_code=403, headers={"X-Error-Code": "GatedRepo",
                                                                   "X-Error-Message": "Access restricted"})
            return None

        async def models(request):
            hub.requests.append(str(request.url))
            q = request.query_params.get("search", "").lower()
            found = [info(r, False) for r in hub.repos if q in r.lower()]
            return JSONResponse(sorted(found, key=lambda d: -d["downloads"]))

        async def model_info(request):
            repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
            hub.requests.append(str(request.url))
            if repo_id not in hub.repos:
                return JSONResponse({"error": "Repository not found"}, status_code=404,
                                    headers={"X-Error-Code": "RepoNotFound"})
            return denied(repo_id, request) or JSONResponse(info(repo_id, request.query_params.get("blobs") == "true"))

        async def resolve(request):
            repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
            name = request.path_params["file"]
            hub.requests.append(str(request.url))
            repo = hub.repos.get(repo_id)
            if repo is None or name not in repo.files:
                return Response("not found", status_code=404, headers={"X-Error-Code": "EntryNotFound"})
            if (d := denied(repo_id, request)) is not None:
                return d
            path = repo.files[name]
            size = path.stat().st_size
            etag = f'"{hub.sha(path)}"'
            headers = {"ETag": etag, "X-Repo-Commit": COMMIT, "X-Linked-Size": str(size), "X-Linked-Etag": etag,
                       "Accept-Ranges": "bytes"}
            start, end, status, open_ended = 0, size - 1, 200, True
            rng = request.headers.get("range")
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                start = int(a or 0)
                end = min(int(b), size - 1) if b else size - 1
                open_ended = not b
                if start >= size:
                    return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            headers["Content-Length"] = str(end - start + 1)
            if request.method == "HEAD":
                return Response(status_code=status, headers=headers)
            entry = [name, start, 0, open_ended]
            hub.log.append(entry)
            drop = hub.drop_after if open_ended else 0  # downloads only, not header reads
            if open_ended:
                hub.drop_after = 0

            async def body():
                pos, sent = start, 0
                with open(path, "rb") as f:
                    f.seek(start)
                    while pos <= end:
                        n = min(64 * 1024, end - pos + 1)
                        if drop and sent + n > drop:
                            n = drop - sent
                        block = f.read(n)
                        if not block:
                            break
                        pos += len(block)
                        sent += len(block)
                        entry[2] = sent
                        yield block
                        if drop and sent >= drop:
                            raise ConnectionResetError("fake hub: dropped on purpose")
                        if hub.throttle:
                            await asyncio.sleep(len(block) / hub.throttle)

            return StreamingResponse(body(), status_code=status, headers=headers)

        return Starlette(routes=[
            Route("/api/models", models),
            Route("/api/models/{owner}/{name}", model_info),
            Route("/api/models/{owner}/{name}/revision/{rev}", model_info),
            Route("/{owner}/{name}/resolve/{rev}/{file:path}", resolve, methods=["GET", "HEAD"]),
        ])


class RunningHub:
    """Serve a :class:`FakeHub` with uvicorn on a free 127.0.0.1 port in a thread."""

    def __init__(self, hub: FakeHub):
        import uvicorn

        self.hub = hub
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(hub.app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> RunningHub:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def split_copy(source: Path, out: Path, parts: int = 3) -> list[Path]:
    """Write ``source`` (a GGUF) again as ``parts`` split files ``<out>-0000i-of-0000n.gguf``
    (llama.cpp's split layout: every part a GGUF with ``split.*`` keys, the tensors shared
    out), with the ``gguf`` package's writer; returns the parts in order."""
    import gguf

    r = gguf.GGUFReader(str(source))
    w = gguf.GGUFWriter(str(out), r.fields["general.architecture"].contents(),
                        split_max_tensors=(len(r.tensors) + parts - 1) // parts)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith(("GGUF.", "split.")):
            continue
        vtype = f.types[0]
        w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    stem = out.with_suffix("")
    return [Path(f"{stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]
