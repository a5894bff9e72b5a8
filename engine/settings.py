"""Engine and sampling settings (plain dataclasses, JSON-friendly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from engine.machine import default_threads
from engine.speculative_setting import DEFAULT as SPECULATIVE_DEFAULT
from engine.speculative_setting import parse as parse_speculative
from storage.chat_records import DEFAULT_SAMPLING as _SAMPLING

KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml type ids (ggml/include/ggml.h: GGML_TYPE_F16, GGML_TYPE_Q8_0)
REPACK_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class EngineSettings:
    """How a model is loaded.

    n_ctx: context window (tokens). n_threads: CPU threads (0 = automatic: the physical core count less one, at least 1).
    type_k / type_v: KV cache precision, "f16" or "q8_0" (q8_0 V needs flash attention).
    flash_attn: use flash attention. Off by default: llama.cpp's CPU flash-attention kernel
        gives slightly different KV for different prefill batch shapes, and then a reply
        after a restore could differ from one computed from scratch. Without it, KV is the
        same bit for bit however the tokens were batched (measured: tests/test_engine.py).
        A q8_0 V cache needs it, so ``for_kv_type("q8_0")`` turns it on.
    n_batch: prefill batch (tokens per llama_decode call; progress is reported per batch).
    repack: llama.cpp's CPU weight repacking ("extra buffer types", llama_model_params.
        use_extra_bufts): "on", "off", or "auto" (decided per machine by engine/cpu.py;
        the environment variable BRANCHWISE_REPACK overrides it, for bug reports).
    speculative: speculative decoding (engine/speculative.py): "none", "lookup" (n-gram
        drafts from the conversation itself) or "draft:PATH" (a small model with the same
        vocabulary drafts). Models whose state cannot be cut back (sliding window,
        recurrent, hybrid) decode plainly whatever it says.
    """

    n_ctx: int = 8192
    n_threads: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    n_batch: int = 512
    repack: str = "auto"
    speculative: str = SPECULATIVE_DEFAULT

    def __post_init__(self):
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(KV_TYPES)}")
        if self.type_v != "f16" and not self.flash_attn:
            raise ValueError("a quantized V cache (type_v=q8_0) needs flash attention")
        if self.repack not in REPACK_CHOICES:
            raise ValueError(f"repack must be one of {', '.join(REPACK_CHOICES)}")
        if self.n_ctx < 256:
            raise ValueError("n_ctx must be at least 256 tokens")
        if not isinstance(self.speculative, str):
            raise ValueError("speculative must be none, lookup or draft:PATH")
        object.__setattr__(self, "speculative", parse_speculative(self.speculative))

    @classmethod
    def for_kv_type(cls, kv_type: str, **kw) -> "EngineSettings":
        """Settings with V (and K, unless ``type_k`` is given) in ``kv_type``; flash attention
        is turned on when V is quantized (q8_0), which llama.cpp requires.

        Raises:
            ValueError: an unknown type, or another invalid field (see the class)."""
        kw.setdefault("type_k", kv_type)
        return cls(type_v=kv_type, flash_attn=kw.pop("flash_attn", False) or kv_type != "f16", **kw)

    @property
    def threads(self) -> int:
        """CPU threads used: ``n_threads``, or with 0 ``engine.machine.default_threads()``
        (the physical core count less one; README "CPU threads")."""
        return self.n_threads or default_threads()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "EngineSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass(frozen=True)
class SamplingParams:
    """Sampling for one reply. temperature 0 is greedy (deterministic). The defaults are
    ``storage.chat_records.DEFAULT_SAMPLING`` (a new conversation's settings), defined once there.

    max_tokens: most tokens generated (the reply also ends at end-of-turn or a full context).
    seed: the sampler's RNG seed (used when temperature > 0); None draws a new one for
        every reply, so regenerating gives a different reply.
    thinking: a reasoning model's thinking setting, passed to its chat template where the
        template has a control for it (``engine.thinking_control``; "" the default).
    thinking_budget: tokens of thinking before the engine closes it (None: no limit).
    """

    temperature: float = _SAMPLING["temperature"]
    top_p: float = _SAMPLING["top_p"]
    top_k: int = _SAMPLING["top_k"]
    min_p: float = _SAMPLING["min_p"]
    repeat_penalty: float = _SAMPLING["repeat_penalty"]
    seed: int | None = _SAMPLING["seed"]
    max_tokens: int = _SAMPLING["max_tokens"]
    thinking: str = _SAMPLING["thinking"]
    thinking_budget: int | None = _SAMPLING["thinking_budget"]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "SamplingParams":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names and (v is not None or k == "seed")})


DEFAULT_SAMPLING = SamplingParams()
