"""Search a hub for GGUF repositories and list a repository's GGUF files by quantization.

Uses ``huggingface_hub``'s ``HfApi`` (``list_models``, ``model_info``) against
:func:`endpoint`: ``HF_ENDPOINT`` when set (the tests point it at a fake hub on
127.0.0.1), else https://huggingface.co, through ``engine.hub.client`` (each request waits
at most ``TIMEOUT_S``; redirects stay on the hub's hosts). Nothing here runs at import;
every function that contacts the hub says so in its docstring.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
STARTER_FILE = Path(__file__).with_name("starter_models.json")
TOKEN_FILE = "hub-token"
"""File name of the hub access token in the data folder (0600), for gated repositories."""
TIMEOUT_S = 20.0
"""Seconds the hub may take to accept, and then to send each part of its answer."""

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(IQ[1-4]_(?:XXS|XS|S|M|NL|L)|TQ[12]_0|Q[2-8]_K(?:_(?:XL|S|M|L))?|Q[4-8]_[01]|Q8_0|MXFP4|"
    r"BF16|F16|F32|FP16|FP32)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class HubError(Exception):
    """A hub request failed; the message is one sentence for the user (it names the host)."""


class GatedError(HubError):
    """The repository is gated (or private): a stored access token may open it."""


def endpoint() -> str:
    """The hub's base URL: ``HF_ENDPOINT`` if set, else https://huggingface.co (no trailing /)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def host() -> str:
    """The host name :func:`endpoint` contacts, e.g. ``huggingface.co`` or ``127.0.0.1:8765``."""
    return urlsplit(endpoint()).netloc or endpoint()


def read_token(data_dir: Path) -> str | None:
    """The stored hub token (``<data dir>/hub-token``), else ``HF_TOKEN``, else None."""
    try:
        text = (Path(data_dir) / TOKEN_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    return text or os.environ.get("HF_TOKEN") or None


def save_token(data_dir: Path, token: str) -> Path:
    """Store ``token`` in ``<data dir>/hub-token``, created 0600 (owner only). Returns the path.

    Raises:
        ValueError: the token is blank.
        OSError: the file cannot be written.
    """
    token = token.strip()
    if not token:
        raise ValueError("The token is empty; paste the access token from your hub account's settings.")
    path = Path(data_dir) / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return path


def _api(token: str | None):
    from huggingface_hub import HfApi
    from huggingface_hub.utils import logging as hub_logging

    from engine.hub import client

    client.install(endpoint(), TIMEOUT_S)

    # Its retries log a warning each ("Retrying in 1s [Retry 1/5]"); the one sentence
    # Branchwise says after them (_hub_error) is what a person needs.
    hub_logging.set_verbosity_error()

    # token=False: never pick up another tool's stored login behind the user's back.
    return HfApi(endpoint=endpoint(), token=token or False)


def _hub_error(exc: Exception, what: str) -> HubError:
    from huggingface_hub import errors

    from engine.hub.client import HubTimeout, RedirectRefused

    timeout = next((e for e in _chain(exc) if isinstance(e, HubTimeout)), None)
    if timeout is not None:
        return HubError(f"The hub at {endpoint()} did not answer within {timeout.timeout_s:g} s ({what}); try "
                        "again later, or check HF_ENDPOINT.")
    refused = next((e for e in _chain(exc) if isinstance(e, RedirectRefused)), None)
    if refused is not None:
        return HubError(f"The hub at {endpoint()} redirected the request ({what}) to {refused.target_host}, which is neither "
                        "its own host nor a Hugging Face host, so Branchwise did not follow it.")

    if isinstance(exc, errors.GatedRepoError):
        return GatedError(f"{what} is gated on {host()}: accept its licence on the hub, then store your access "
                        "token with 'branchwise models login'.")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"{what} was not found on {host()} (or it is private: store a token with "
                        "'branchwise models login').")
    if _unreachable(exc):
        return HubError(f"{host()} could not be reached for {what}: this machine may be offline, or its name does "
                        f"not resolve ({_root_cause(exc)}). Check the internet connection (or HF_ENDPOINT) and try again.")
    return HubError(f"{host()} refused the request for {what} ({exc}).")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _unreachable(exc: Exception) -> bool:
    """Whether ``exc`` (or what caused it) is a failure to connect: a name that does not
    resolve, a refused or timed-out connection, not an HTTP answer."""
    import socket

    import httpx

    connect = (httpx.ConnectError, httpx.ConnectTimeout, socket.gaierror, ConnectionError, TimeoutError)
    return any(isinstance(e, connect) for e in _chain(exc))


def _root_cause(exc: Exception) -> str:
    return str(list(_chain(exc))[-1]) or type(exc).__name__


@dataclass
class RepoResult:
    """One search result: a GGUF repository and its figures on the hub."""

    repo: str
    downloads: int | None
    likes: int | None
    licence: str | None
    updated: str | None  # ISO date, YYYY-MM-DD
    gated: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _licence(tags: list[str] | None, card) -> str | None:
    for tag in tags or []:
        if tag.startswith("license:"):
            return tag.split(":", 1)[1]
    lic = getattr(card, "license", None) if card is not None else None
    return lic if isinstance(lic, str) else None


def search(query: str, limit: int = 20, token: str | None = None) -> list[RepoResult]:
    """Search the hub (contacts :func:`host`) for GGUF repositories matching ``query``, most
    downloaded first; at most ``limit`` results.

    Raises:
        HubError: the hub could not be reached or answered with an error.
    """
    try:
        models = list(_api(token).list_models(search=query, filter="gguf", sort="downloads", limit=limit,
                                              expand=["downloads", "likes", "lastModified", "tags", "gated"]))
    except Exception as exc:  # noqa: BLE001 - network and HTTP errors of every kind end in one sentence
        raise _hub_error(exc, f"the search for {query!r}") from exc
    return [RepoResult(repo=m.id, downloads=m.downloads, likes=m.likes, licence=_licence(m.tags, m.card_data),
                       updated=m.last_modified.date().isoformat() if m.last_modified else None,
                       gated=bool(m.gated)) for m in models]


@dataclass
class ModelFile:
    """One downloadable model: a single ``.gguf`` or every part of a split one, in order."""

    name: str  # the file name, or the first part's name for a split model
    quantization: str
    parts: list[str]
    sizes: list[int]
    sha256: list[str | None]
    labels: dict = field(default_factory=dict)  # filled in by the fit estimate

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def to_dict(self) -> dict:
        return {"name": self.name, "quantization": self.quantization, "parts": self.parts, "size": self.size,
                "sha256": self.sha256, **self.labels}


@dataclass
class RepoFiles:
    """A repository's GGUF models at one commit (``revision``), grouped by quantization."""

    repo: str
    revision: str
    licence: str | None
    gated: bool
    files: list[ModelFile]

    def by_quantization(self) -> dict[str, list[ModelFile]]:
        """Quantization -> the models of that quantization, smallest quantization file first."""
        groups: dict[str, list[ModelFile]] = {}
        for f in sorted(self.files, key=lambda f: f.size):
            groups.setdefault(f.quantization, []).append(f)
        return groups


def quantization_of(filename: str) -> str:
    """The quantization named in a GGUF file name (``Q4_K_M``, ``IQ3_XS``, ``F16``...),
    upper case; ``"unknown"`` when the name has none."""
    matches = _QUANT.findall(Path(filename).name)
    q = matches[-1].upper() if matches else "unknown"
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


def group_files(siblings: list[tuple[str, int, str | None]]) -> list[ModelFile]:
    """Turn a repository's ``(path, size, sha256)`` entries into models: every ``.gguf``
    that is not a vision projector (``mmproj``), split files (``-00001-of-00003.gguf``)
    joined into one entry whose parts are in order. A split set with a part missing is left out."""
    singles: list[ModelFile] = []
    splits: dict[tuple[str, int], dict[int, tuple[str, int, str | None]]] = {}
    for path, size, sha in siblings:
        name = Path(path).name
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        m = _SPLIT.search(path)
        if m:
            splits.setdefault((path[: m.start()], int(m.group(2))), {})[int(m.group(1))] = (path, size, sha)
        else:
            singles.append(ModelFile(path, quantization_of(path), [path], [size], [sha]))
    for (stem, count), parts in splits.items():
        if sorted(parts) != list(range(1, count + 1)):
            continue
        ordered = [parts[i] for i in range(1, count + 1)]
        singles.append(ModelFile(ordered[0][0], quantization_of(stem + ".gguf"), [p for p, _, _ in ordered],
                                 [s for _, s, _ in ordered], [h for _, _, h in ordered]))
    return singles


def repo_files(repo: str, token: str | None = None) -> RepoFiles:
    """List ``repo``'s GGUF models at its current commit, with sizes and LFS SHA-256
    (contacts :func:`host`).

    Raises:
        HubError: not found, gated without a token, or the hub could not be reached.
    """
    try:
        info = _api(token).model_info(repo, revision="main", files_metadata=True)
    except Exception as exc:  # noqa: BLE001
        raise _hub_error(exc, repo) from exc
    try:
        entries = [(s.rfilename, (s.lfs.size if s.lfs else s.size) or 0, s.lfs.sha256 if s.lfs else None)
                   for s in info.siblings or []]
        return RepoFiles(repo=info.id or repo, revision=info.sha or "main",
                         licence=_licence(info.tags, info.card_data), gated=bool(info.gated),
                         files=group_files(entries))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a listing of the wrong shape
        raise HubError(f"{host()} answered for {repo} with something that is not a model listing; is HF_ENDPOINT "
                       "a Hugging Face hub?") from exc


def resolve_url(repo: str, revision: str, filename: str) -> str:
    """The download URL of ``filename`` in ``repo`` at ``revision`` on :func:`endpoint`."""
    return f"{endpoint()}/{repo}/resolve/{quote(revision, safe='')}/{quote(filename)}"


def starter_models() -> list[dict]:
    """The starter list shown for an empty search (``starter_models.json``, shipped in the
    package, no network): dicts with ``repo``, ``file``, ``quantization``, ``size_gb``
    (approximate), ``params``, ``reasoning`` (bool), ``licence``, ``note``."""
    return json.loads(STARTER_FILE.read_text(encoding="utf-8"))["models"]


def download_plan(repo_files: RepoFiles, model: ModelFile) -> tuple[list, dict]:
    """What ``engine.hub.download.download`` needs for ``model`` of ``repo_files``: its
    parts as ``RemoteFile`` (URL on :func:`endpoint`, size, SHA-256) in order, and the
    source note kept beside the first part (repository, revision, licence, host, files)."""
    from engine.hub.download import RemoteFile

    files = [RemoteFile(resolve_url(repo_files.repo, repo_files.revision, p), p, s, h)
             for p, s, h in zip(model.parts, model.sizes, model.sha256)]
    extra = {"repo": repo_files.repo, "revision": repo_files.revision, "licence": repo_files.licence,
             "host": host(), "files": model.parts, "sha256": model.sha256}
    return files, extra
