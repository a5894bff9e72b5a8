"""The models in the data folder's ``models/`` (downloaded by Branchwise) and, on request,
the GGUF files other apps keep (used in place, never modified).

Each model's facts come from its GGUF header (:mod:`engine.hub.header`), so listing loads
no model. How the prefix store treats it follows ``engine.model.cache_mode`` from the
same facts: ``n_swa`` is the header's sliding window, recurrent and hybrid come from the
architecture (llama.cpp's ``llm_arch_is_recurrent`` / ``llm_arch_is_hybrid`` lists).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.hub.catalog import quantization_of
from engine.hub.download import PARTIAL_DIR
from engine.hub.header import HeaderError, read_local

MODELS_DIR = "models"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

TREATMENTS = {"blocks": "blocks", "blocks + sliding-window checkpoints": "checkpoints (sliding window)",
              "recurrent-state checkpoints": "checkpoints (recurrent)",
              "blocks + recurrent-state checkpoints": "checkpoints (hybrid)", "off": "prefill only"}


class LibraryError(Exception):
    """A library operation failed; one sentence naming the model or folder."""


@dataclass
class LibraryModel:
    """One model on disk. ``path`` is the file llama.cpp opens (a split model's first part)."""

    name: str
    path: str
    parts: int
    size: int
    quantization: str
    context_length: int | None
    architecture: str | None
    treatment: str
    origin: str  # "Branchwise", or the app whose folder holds it
    source: str | None = None  # the hub repository it came from

    def to_dict(self) -> dict:
        return asdict(self)


def models_dir(data_dir: Path) -> Path:
    """``<data dir>/models``, created 0700."""
    path = Path(data_dir) / MODELS_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700) if sys.platform != "win32" else None
    return path


def treatment(architecture: str, sliding_window: int) -> str:
    """How the prefix store keeps this model: ``blocks``, ``checkpoints (...)`` or ``prefill only``."""
    from engine.hub.header import HYBRID_ARCHS, RECURRENT_ARCHS

    hybrid, recurrent = architecture in HYBRID_ARCHS, architecture in RECURRENT_ARCHS
    if hybrid:
        mode = "off" if sliding_window > 0 else "blocks + recurrent-state checkpoints"
    elif recurrent:
        mode = "recurrent-state checkpoints"
    elif sliding_window > 0:
        mode = "blocks + sliding-window checkpoints"
    else:
        mode = "blocks"
    return TREATMENTS[mode]


def describe_file(path: Path, origin: str, name: str | None = None, source: str | None = None) -> LibraryModel:
    """A :class:`LibraryModel` for the GGUF at ``path`` (a split model's parts are counted
    and summed). A header that cannot be read gives ``architecture`` None and ``treatment``
    ``"unreadable header"``."""
    path = Path(path)
    m = _SPLIT.search(path.name)
    files = [path]
    if m:
        stem, count = path.name[: m.start()], int(m.group(2))
        files = [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    size = sum(f.stat().st_size for f in files if f.exists())
    try:
        facts = read_local(path)
        arch, ctx, how = facts.architecture, facts.context_length, treatment(facts.architecture, facts.sliding_window)
    except HeaderError:
        arch, ctx, how = None, None, "unreadable header"
    display = name or (path.name[: m.start()] if m else path.stem)
    quant = quantization_of(path.name if not m else path.name[: m.start()] + ".gguf")
    if quant == "unknown" and arch is not None:  # e.g. an Ollama blob, named by its digest
        quant = _file_type_name(facts.file_type)
    return LibraryModel(name=display, path=str(path), parts=len(files), size=size, quantization=quant,
                        context_length=ctx, architecture=arch, treatment=how, origin=origin, source=source)


def _file_type_name(file_type: int) -> str:
    """``general.file_type`` as a quantization name (``Q4_K_M``), from ``gguf.LlamaFileType``."""
    try:
        import gguf

        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return "unknown"


def _first_parts(folder: Path):
    for p in sorted(folder.rglob("*.gguf")):
        if PARTIAL_DIR in p.parts or "mmproj" in p.name.lower():
            continue
        m = _SPLIT.search(p.name)
        if m and int(m.group(1)) != 1:
            continue
        yield p


BUILTIN = "built-in"
"""The origin of the embedded default model in a library listing (used, never removed)."""


def builtin_models() -> list[LibraryModel]:
    """The embedded default model as a library entry (origin :data:`BUILTIN`, its name marked
    "(built-in)"), or [] when it is not installed. Reads the file's header (a few ms)."""
    from engine.errors import ModelLoadError
    from engine.model_file import default_model_path

    try:
        path = default_model_path()
    except ModelLoadError:
        return []
    if not path.is_file():
        return []
    model = describe_file(path, BUILTIN)
    model.name += " (built-in)"
    return [model]


def list_library(data_dir: Path) -> list[LibraryModel]:
    """Every model Branchwise downloaded into ``<data dir>/models``, by name."""
    out = []
    root = models_dir(data_dir)
    for p in _first_parts(root):
        source = None
        meta = p.with_name(p.name + ".source.json")
        try:
            source = json.loads(meta.read_text(encoding="utf-8")).get("repo")
        except (OSError, ValueError):
            pass
        out.append(describe_file(p, "Branchwise", source=source))
    return sorted(out, key=lambda m: m.name.lower())


def find(data_dir: Path, name: str) -> LibraryModel | None:
    """The library model called ``name`` (its name, or its file name), case-insensitive; None if none."""
    key = name.lower().removesuffix(".gguf")
    for m in list_library(data_dir):
        if key in (m.name.lower(), Path(m.path).stem.lower()):
            return m
    return None


def remove(data_dir: Path, name: str) -> LibraryModel:
    """Delete the library model ``name`` (every part and its source note). Only files under
    ``<data dir>/models`` are ever deleted: another app's models are not in the library.

    Raises:
        LibraryError: no model of that name.
    """
    model = find(data_dir, name)
    if model is None:
        raise LibraryError(f"No model called {name!r} in {models_dir(data_dir)}; 'branchwise models list' "
                           "shows the names.")
    first = Path(model.path)
    m = _SPLIT.search(first.name)
    files = [first] if not m else [first.with_name(f"{first.name[: m.start()]}-{i:05d}-of-{int(m.group(2)):05d}.gguf")
                                   for i in range(1, int(m.group(2)) + 1)]
    for f in files + [first.with_name(first.name + ".source.json")]:
        f.unlink(missing_ok=True)
    try:
        first.parent.rmdir()  # the repository's folder, once empty
    except OSError:
        pass
    return model


def _ollama_models(root: Path):
    manifests = root / "manifests"
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()) if manifests.is_dir() else []:
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError):
            continue
        for layer in layers:
            if layer.get("mediaType") == "application/vnd.ollama.image.model":
                blob = root / "blobs" / str(layer.get("digest", "")).replace(":", "-")
                if blob.is_file():
                    rel = manifest.relative_to(manifests).parts
                    yield blob, f"{rel[-2]}:{rel[-1]}" if len(rel) >= 2 else manifest.name


def other_app_folders(home: Path | None = None) -> dict[str, list[Path]]:
    """Where LM Studio, Ollama, GPT4All and Jan keep models on this platform (existing or not)."""
    home = Path(home or Path.home())
    local = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    mac = home / "Library" / "Application Support"
    win = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    return {
        "LM Studio": [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"],
        "Ollama": [Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS")
        else [home / ".ollama" / "models"],
        "GPT4All": [local / "nomic.ai" / "GPT4All", mac / "nomic.ai" / "GPT4All", win / "nomic.ai" / "GPT4All"],
        "Jan": [home / "jan" / "models", local / "Jan" / "data" / "llamacpp" / "models",
                mac / "Jan" / "data" / "llamacpp" / "models", home / "AppData" / "Roaming" / "Jan" / "data" / "models"],
    }


def list_others(home: Path | None = None) -> list[LibraryModel]:
    """GGUF models other apps downloaded, found in their folders (:func:`other_app_folders`);
    Ollama's by its manifests (blobs named by digest). Only read, never modified."""
    out = []
    for app, folders in other_app_folders(home).items():
        for folder in folders:
            if not folder.is_dir():
                continue
            if app == "Ollama":
                for blob, tag in _ollama_models(folder):
                    out.append(describe_file(blob, app, name=tag))
                continue
            for p in _first_parts(folder):
                out.append(describe_file(p, app))
    return out


def disk_free(data_dir: Path) -> int:
    """Free bytes on the disk holding the models folder."""
    return shutil.disk_usage(models_dir(data_dir)).free


KV_CONFIGS = [(k, v, fa) for k in ("f16", "q8_0") for v in ("f16", "q8_0") for fa in (False, True) if v == "f16" or fa]
"""(type_k, type_v, flash attention) of every KV configuration the engine accepts
(``engine.settings.EngineSettings``: a q8_0 V cache needs flash attention)."""


def model_fingerprints(path: Path, store) -> list[bytes]:
    """The prefix-store fingerprints the model file at ``path`` can have in ``store`` (a
    ``PrefixStore``): one per KV configuration (:data:`KV_CONFIGS`) and repacking on or
    off, under this build's llama.cpp and the store's block size. Reads the whole file once unless ``store``
    remembers its digest. Raises OSError when the file cannot be read."""
    from importlib.metadata import version

    from engine.cpu import system_info
    from engine.fingerprint import cached_file_digest, fingerprint, kernels

    digest = cached_file_digest(Path(path), store)
    llama = version("llama-cpp-python")
    info = system_info()
    return [fingerprint(digest, llama, k, v, fa, store.block_size, kernels(repack, info))
            for k, v, fa in KV_CONFIGS for repack in (True, False)]


def forget_blocks(data_dir: Path, model: LibraryModel) -> int:
    """Delete the KV blocks and checkpoints ``model`` left in the data folder's prefix store
    (``kvcache.sqlite3``); call it before the file is removed. Returns the blocks deleted.

    Raises:
        OSError: the model file cannot be read (its digest names its blocks).
        storage.prefix.records.StoreUnavailable / StoreFull: the store cannot be changed.
    """
    from storage.paths import KVCACHE_DB
    from storage.prefix_store import PrefixStore

    if not (Path(data_dir) / KVCACHE_DB).exists():
        return 0
    store = PrefixStore(Path(data_dir) / KVCACHE_DB)
    try:
        return store.forget_models(model_fingerprints(Path(model.path), store))
    finally:
        store.close()
