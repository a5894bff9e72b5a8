"""Will a model fit in this machine's memory at a given context? Computed from its GGUF
header, not guessed from its file size.

The estimate adds what Branchwise allocates (README "Will it fit?"):

* **weights**: the file size (llama.cpp maps the file; a forward pass touches all of it);
* **KV cache**: ``n_ctx`` x sum over attention layers of ``n_head_kv`` x (key length +
  value length) x bytes per element of the KV type. Sliding-window layers count at the
  full context too: llama-cpp-python creates the context with a full-size SWA cache.
  llama.cpp clears the buffer at creation, so all of it is resident;
* **recurrent state** of Mamba-style layers (small);
* **compute buffer**: what llama.cpp's scratch for one 512-token batch touches, see
  :func:`compute_bytes`;
* **state buffers**: the prefix store copies one sequence's state out of llama.cpp after
  each turn into a reused buffer as large as the KV of the tokens in use, and cuts new
  blocks into a second one (at most 64 MiB);
* **runtime**: the process around it, see :func:`runtime_bytes`.

Available memory is psutil's ``available`` plus what a model already loaded would give
back when it is replaced (``freed_bytes``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.hub.header import GgufFacts

KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}
N_UBATCH = 512  # engine.settings' n_batch = n_ubatch
RUNTIME_BYTES = 75 * 1000 * 1000
"""Resident memory of the engine process besides the model's own buffers: Python, numpy,
llama.cpp's library, the prefix store (48 MB measured before a load; the rest fitted with
tools/fit_check.py, see the README table)."""
CUT_BUFFER_BYTES = 64 * 1024 * 1024  # engine.core.CUT_CHUNK_BYTES: new blocks are cut into it
HEADROOM = 0.8
"""A file "fits" when its estimate is at most this fraction of the available memory,
leaving room for the window, the page cache and everything else; above it, "tight"."""
FITS, TIGHT, TOO_LARGE = "Fits", "Tight", "Too large"


@dataclass
class Estimate:
    """Bytes one model needs at ``n_ctx`` tokens, by part; ``total`` is their sum."""

    n_ctx: int
    weights: int
    kv: int
    recurrent: int
    compute: int
    state: int
    runtime: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.state + self.runtime

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def kv_bytes_per_token(facts: GgufFacts, kv_type: str = "f16") -> int:
    """Bytes of KV one token takes over all attention layers (K and V) at ``kv_type``."""
    per = KV_TYPE_BYTES.get(kv_type, 2.0)
    return int(round(sum(h for h in facts.n_head_kv) * (facts.key_length + facts.value_length) * per))


def compute_bytes(facts: GgufFacts, n_kv: int, n_ubatch: int = N_UBATCH) -> int:
    """The resident part of llama.cpp's CPU compute buffer for a batch of ``n_ubatch``
    tokens over ``n_kv`` cells (flash attention off): one layer's attention scores
    (``n_head`` x ``n_kv`` x ``n_ubatch`` f32), the f16 mask, a dozen activations
    (``n_embd`` x ``n_ubatch`` f32) and one row of logits. llama.cpp *reserves* logits for
    the whole batch (``n_vocab`` x 512 f32: 512 MiB of its logged 514.5 MiB for Gemma 3
    270M), but a prefill asks for the last token's only, so those pages are never touched
    and do not count. Calibrated with tools/fit_check.py (README table)."""
    scores = facts.n_head * n_kv * n_ubatch * 4 if any(facts.n_head_kv) else 0
    return int(scores + n_kv * n_ubatch * 2 + 12 * facts.n_embd * n_ubatch * 4 + facts.n_vocab * 4)


def runtime_bytes(facts: GgufFacts, n_ctx: int) -> int:
    """The process around the model: Python with llama.cpp loaded (:data:`RUNTIME_BYTES`),
    llama.cpp's vocabulary tables (about 320 bytes a token: 84 MB for Gemma's 262,144) and
    a per-context overhead beyond the KV (9 KiB a token, fitted on SmolLM2 and Gemma)."""
    return RUNTIME_BYTES + facts.n_vocab * 320 + n_ctx * 9216


def estimate(facts: GgufFacts, file_size: int, n_ctx: int, kv_type: str = "f16",
             tokens_in_use: int | None = None) -> Estimate:
    """The memory a model of ``file_size`` bytes needs at a context of ``n_ctx`` tokens
    with ``tokens_in_use`` of them filled (default: all). The KV cache is always counted
    whole (llama.cpp clears it at creation); the compute buffer and the prefix store's
    buffers (the state blob, and the cut buffer of at most 64 MiB) grow with the tokens
    in use."""
    used = n_ctx if tokens_in_use is None else min(tokens_in_use, n_ctx)
    per_token = kv_bytes_per_token(facts, kv_type)
    n_kv = min(n_ctx, -(-max(used, 1) // 256) * 256)
    state = per_token * used + facts.ssm_state_bytes
    return Estimate(n_ctx=n_ctx, weights=int(file_size), kv=per_token * n_ctx, recurrent=facts.ssm_state_bytes,
                    compute=compute_bytes(facts, n_kv), state=state + min(state, CUT_BUFFER_BYTES),
                    runtime=runtime_bytes(facts, n_ctx))


def available_memory(freed_bytes: int = 0) -> int:
    """Bytes of memory a model could use now: psutil's ``available`` plus ``freed_bytes``
    (what the model already loaded gives back when it is replaced)."""
    import psutil

    return int(psutil.virtual_memory().available) + max(0, int(freed_bytes))


def label(total: int, available: int) -> str:
    """:data:`FITS` within :data:`HEADROOM` of ``available``, :data:`TIGHT` up to all of
    it, else :data:`TOO_LARGE`."""
    if total <= available * HEADROOM:
        return FITS
    return TIGHT if total <= available else TOO_LARGE


def largest_context(facts: GgufFacts, file_size: int, available: int, kv_type: str = "f16") -> int:
    """The largest context (a multiple of 256 tokens, at most the trained context, at least
    0) whose estimate fits within :data:`HEADROOM` of ``available``."""
    top = facts.context_length or 131072
    lo, hi = 0, top // 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(facts, file_size, mid * 256, kv_type).total <= available * HEADROOM:
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def gb(n: int) -> str:
    """Bytes as ``5.1 GB`` (powers of 1000, as disks and the hub count)."""
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def describe(est: Estimate, available: int) -> str:
    """``Fits: needs ≈ 5.1 GB at 8,192 tokens; 11.2 GB available``."""
    return f"{label(est.total, available)}: needs ≈ {gb(est.total)} at {est.n_ctx:,} tokens; {gb(available)} available"


def fit_repo_files(repo_files, token: str | None, n_ctx: int, kv_type: str = "f16",
                   freed_bytes: int = 0, available: int | None = None):
    """Label each model of ``repo_files`` (a ``catalog.RepoFiles``) for this machine: its
    ``labels`` get ``fit`` (Fits / Tight / Too large), ``needs`` (bytes), ``n_ctx``
    (``n_ctx`` capped at the trained context), ``estimate``, ``available``,
    ``largest_context`` (tokens), ``trained_context``, ``architecture``, ``recommended``
    (the largest file that fits) and ``text`` (:func:`describe`). The header is read once
    per model, shared by its quantizations: one ranged request each (contacts the hub).
    ``freed_bytes``: what the model already loaded gives back. Returns (the files smallest
    first, the available bytes).

    Raises:
        engine.hub.header.HeaderError: a header could not be read or parsed.
    """
    from engine.hub import catalog, header

    available = available_memory(freed_bytes) if available is None else available
    facts_by_stem: dict[str, GgufFacts] = {}
    rows = []
    for f in sorted(repo_files.files, key=lambda f: f.size):
        stem = f.name.lower().replace(f.quantization.lower(), "")
        facts = facts_by_stem.get(stem)
        if facts is None:
            url = catalog.resolve_url(repo_files.repo, repo_files.revision, f.parts[0])
            facts = facts_by_stem[stem] = header.read_remote(url, f.sizes[0], token=token)
        ctx = min(n_ctx, facts.context_length or n_ctx)
        est = estimate(facts, f.size, ctx, kv_type)
        f.labels = {"fit": label(est.total, available), "needs": est.total, "n_ctx": ctx,
                    "estimate": est.to_dict(), "available": available,
                    "largest_context": largest_context(facts, f.size, available, kv_type),
                    "trained_context": facts.context_length, "architecture": facts.architecture,
                    "recommended": False, "text": describe(est, available)}
        rows.append(f)
    fitting = [f for f in rows if f.labels["fit"] == FITS]
    if fitting:
        max(fitting, key=lambda f: f.size).labels["recommended"] = True
    return rows, available
