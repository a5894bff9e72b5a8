"""Loading a GGUF model into a llama.cpp context, and the facts a user wants to see about it."""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import llama_cpp

from engine import cpu
from engine.chat_template import (PromptBuilder, TemplateLimitError, disable_library_chat_templates,
                                  template_from_metadata)
from engine.errors import ContextOverflowError, ModelLoadError
from engine.kv_codec import StateKind
from engine.generated_ids import SavedIds
from engine.gguf_meta import layer_weight_types
from engine.live_context import SEQUENCES
from engine.model_file import check_gguf
from engine.reasoning import model_syntax
from engine.settings import KV_TYPES, EngineSettings
from engine.special_chunks import PIECE_BYTES, SpecialPieces

log = logging.getLogger(__name__)

_QUANT_NAMES = {  # general.file_type (llama.h enum llama_ftype)
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}

# llama.cpp's log lines, so a failed load can say why (llama.cpp reports through a callback).
_recent_log: collections.deque[str] = collections.deque(maxlen=40)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace").rstrip()
    if line:
        _recent_log.append(line)
        log.debug("llama.cpp: %s", line)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
disable_library_chat_templates()  # the GGUF's template is compiled only by PromptBuilder, bounded


@dataclass(frozen=True)
class ModelFacts:
    """What the window shows about a model. Sizes in bytes, context in tokens."""

    path: str
    name: str
    architecture: str
    parameters: int
    size_bytes: int
    quantization: str
    context_length: int  # trained context length
    n_ctx: int  # the context window in use
    chat_template: bool  # True when the GGUF carries one
    kv_bytes_per_token: int
    cache_policy: str  # "full", or why the prefix store is off for this model
    repack: str = ""  # whether weights were repacked for this CPU, and why (engine/cpu.py)
    prompt_format: str = "model template"  # engine.chat_template.PromptFormat
    chat_template_note: str = ""  # why the model's own template is not used ("" when it is)
    cache_mode: str = "blocks"  # a CacheMode value: how the prefix store keeps this model's state
    n_threads: int = 0  # CPU threads in use
    reasoning_format: str = "none"  # engine.reasoning.ReasoningFormat: how the model writes its thinking
    thinking_control: str = "none"  # engine.thinking_control.ThinkingControl: what a chat may set about it
    tool_format: str = "generic"  # engine.tool_calls.ToolFormat: how the template writes tool calls ("generic": none)

    def to_dict(self) -> dict:
        return asdict(self)


class LoadedModel:
    """A model plus one llama.cpp context (one sequence, id 0).

    Args:
        crash_verdict: an engine crashed on this machine while repacking weights
            (engine/cpu.py ``CrashVerdict``); with ``settings.repack == "auto"`` it keeps
            repacking off.

    Raises:
        ModelLoadError: the file is not a loadable GGUF, or llama.cpp refused it.
        ValueError: ``BRANCHWISE_REPACK`` holds something other than on/off/auto.
    """

    def __init__(self, path: str | Path, settings: EngineSettings, crash_verdict: bool = False):
        p = check_gguf(path)
        check_context_fits(p, settings)  # before llama.cpp allocates the KV cache
        _recent_log.clear()
        layer_types = layer_weight_types(p)
        self.min_batch = cpu.min_batch(layer_types)
        """The smallest prefill batch that computes exact KV for this model (``cpu.min_batch``)."""
        self.repack = cpu.decide_repack(settings.repack, os.environ.get(cpu.ENV_VAR), cpu.system_info(),
                                        crash_verdict, layer_types)
        log.info("weight repacking %s: %s", "on" if self.repack.repack else "off", self.repack.reason)
        try:
            with cpu.model_params_with_repack(self.repack.repack, sequences=SEQUENCES):
                self.llama = llama_cpp.Llama(
                    str(p),
                    n_ctx=settings.n_ctx,
                    n_batch=settings.n_batch,
                    n_ubatch=settings.n_batch,
                    n_threads=settings.threads,
                    n_threads_batch=settings.threads,
                    flash_attn=settings.flash_attn,
                    type_k=KV_TYPES[settings.type_k],
                    type_v=KV_TYPES[settings.type_v],
                    n_gpu_layers=-1,  # Metal on macOS; a no-op on CPU builds
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            if not p.exists():  # deleted or moved while llama.cpp read it
                raise ModelLoadError(f"The model file {p} was deleted or moved while it was loading; "
                                     "put it back, or choose another model file.") from exc
            detail = next(
                (line for line in reversed(_recent_log) if "error" in line.lower() or "failed" in line.lower()),
                "",
            )
            raise ModelLoadError(_load_error_text(p, detail)) from exc
        self.path = p
        self.settings = settings
        self.vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        self._piece_buf = ctypes.create_string_buffer(64)
        self._pieces: SpecialPieces | None = None  # the special tokens, read at the first long text
        self._pieces_lock = threading.Lock()
        meta = self.llama.metadata
        self.template_text, template_missing = template_from_metadata(meta, self._meta_bytes)
        bos, eos = llama_cpp.llama_vocab_bos(self.vocab), llama_cpp.llama_vocab_eos(self.vocab)
        self.prompts = _LengthAwarePrompts(self, PromptBuilder(
            self.template_text,
            self.tokenize,
            bos_token=self.token_text(bos) if bos >= 0 else "",
            eos_token=self.token_text(eos) if eos >= 0 else "",
            bos_id=bos if bos >= 0 else None,
            add_bos=llama_cpp.llama_vocab_get_add_bos(self.vocab),
            missing_reason=template_missing,
            saved_ids=SavedIds(self.vocab, llama_cpp.llama_vocab_n_tokens(self.vocab)).usable,
        ))
        # engine/reasoning.py: the reasoning format, from the template and the vocabulary
        self.reasoning, self.reasoning_specials = model_syntax(self.template_text, self.prompts, self.tokenize)
        kind = dict(
            n_swa=llama_cpp.llama_model_n_swa(self.llama.model),
            recurrent=llama_cpp.llama_model_is_recurrent(self.llama.model),
            hybrid=llama_cpp.llama_model_is_hybrid(self.llama.model),
        )
        self.cache_policy = cache_policy(**kind)
        self.cache_mode = cache_mode(**kind)
        self.n_swa = kind["n_swa"]
        ftype = int(meta.get("general.file_type", -1)) if meta.get("general.file_type", "").isdigit() else -1
        self.facts = ModelFacts(
            path=str(p),
            name=meta.get("general.name") or p.stem,
            architecture=meta.get("general.architecture", "unknown"),
            parameters=int(llama_cpp.llama_model_n_params(self.llama.model)),
            size_bytes=_size_or_zero(p),
            quantization=_QUANT_NAMES.get(ftype, meta.get("general.file_type", "unknown")),
            context_length=int(llama_cpp.llama_model_n_ctx_train(self.llama.model)),
            n_ctx=self.llama.n_ctx(),
            chat_template=bool(self.template_text),
            prompt_format=str(self.prompts.format),
            chat_template_note=self.prompts.note,
            kv_bytes_per_token=kv_bytes_per_token(self.llama.model, meta, settings.type_k, settings.type_v),
            cache_policy=self.cache_policy,
            repack=("on" if self.repack.repack else "off") + f" ({self.repack.reason})",
            cache_mode=self.cache_mode.value,
            n_threads=settings.threads,
            reasoning_format=str(self.reasoning.format),
            thinking_control=str(self.prompts.thinking_control),
            tool_format=str(self.prompts.tool_format),
        )

        self._warm_up()

    def _warm_up(self) -> None:
        """Run one token through the model and forget it, as llama.cpp's own tools do:
        the first decode pages in the weights and builds the compute graph (about a
        second here), which belongs to model load, not to the first reply's TTFT."""
        token = self.llama.token_bos()
        self.llama.eval([token if token >= 0 else 0])
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        llama_cpp.llama_memory_clear(mem, True)
        self.llama.n_tokens = 0

    def _meta_bytes(self, key: str) -> bytes | None:
        """The raw bytes of a GGUF metadata string (None when absent), undecoded."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.llama.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            n = llama_cpp.llama_model_meta_val_str(self.llama.model, key.encode(), buf, len(buf))
        return buf.raw[:n]

    @property
    def cache_supported(self) -> bool:
        return self.cache_policy == "full"

    def tokenize(self, text: str, special: bool) -> list[int]:
        """Token ids of ``text`` (no BOS); ``special`` parses control-token text. A long text
        with special parsing is tokenized in pieces, to the same ids, in linear time
        (``engine.special_chunks``: llama.cpp's own partition is quadratic in the control
        tokens a text holds, 54 s and more for a 50,001-message history)."""
        data = utf8(text)
        if not special or len(data) <= 2 * PIECE_BYTES:
            return self.llama.tokenize(data, add_bos=False, special=special)
        with self._pieces_lock:
            if self._pieces is None:
                self._pieces = SpecialPieces.from_vocab(self.vocab)
        return self._pieces.tokenize(data, lambda piece: self.llama.tokenize(piece, add_bos=False, special=True))

    def token_text(self, token: int) -> str:
        return self.token_bytes(token, special=True).decode("utf-8", "replace")

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes a token shows as (control tokens show as nothing unless ``special``)."""
        buf = self._piece_buf
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:  # the piece is longer than the buffer: -n is its length
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return self.llama.detokenize(tokens).decode("utf-8", "replace")

    def is_end_of_turn(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        self.llama.close()


class HistoryTooLongError(ContextOverflowError):
    """A prompt whose messages alone hold more tokens than the context window, found
    after the chat template ran past its limits on it (a long history, not a hostile
    template). ``prompt_tokens`` is a lower bound: the messages' own tokens."""

    def __init__(self, prompt_tokens: int, n_ctx: int, n_messages: int):
        super().__init__(prompt_tokens, n_ctx)
        self.n_messages = n_messages
        self.args = (f"This conversation is too long: its {n_messages:,} messages hold at least "
                     f"{prompt_tokens:,} tokens, but the context window holds {n_ctx:,}.",)


class _LengthAwarePrompts:
    """The model's :class:`PromptBuilder`, except that a render stopped by its limits on a
    history whose messages alone overflow the context is reported as what it is (too
    long: :class:`HistoryTooLongError` with the counts), not as a hostile template."""

    def __init__(self, model: "LoadedModel", builder: PromptBuilder):
        self._model, self._builder = model, builder

    def __getattr__(self, name):
        return getattr(self._builder, name)

    def build(self, messages, add_generation_prompt: bool = True, tools: list[dict] | None = None,
              thinking: str = "") -> list[int]:
        """:meth:`PromptBuilder.build`.

        Raises:
            HistoryTooLongError: the template hit a limit and the messages' own tokens
                exceed the context window.
            TemplateError: the template failed otherwise.
        """
        try:
            return self._builder.build(messages, add_generation_prompt, tools, thinking)
        except TemplateLimitError:
            n_ctx, total = self._model.llama.n_ctx(), 0
            for m in messages:
                ids = m.token_ids if m.role == "assistant" and m.token_ids is not None else None
                total += len(ids) if ids is not None else len(self._model.tokenize(m.content, False))
                if total > 64 * n_ctx:  # enough to say so: stop counting
                    break
            if total + len(messages) > n_ctx:
                raise HistoryTooLongError(total, n_ctx, len(messages)) from None
            raise

    def template_tokens(self, roles: list[str]) -> int:
        """Tokens the chat template adds around messages with these ``roles`` (BOS, role
        markers, the assistant header): the prompt of empty messages. A history too long
        for the template's limits is measured on its first :data:`TEMPLATE_SAMPLE` messages
        and scaled to its length (the markers repeat per message), so a count never fails
        on length.

        Raises:
            TemplateError: the template fails on a short history too.
        """
        from engine.chat_template import ChatMessage

        empties = [ChatMessage(r, "") for r in roles]
        try:
            return len(self._builder.build(empties))
        except TemplateLimitError:
            k = min(len(empties), TEMPLATE_SAMPLE)
            return round(len(self._builder.build(empties[:k])) * len(empties) / k)


TEMPLATE_SAMPLE = 256  # messages rendered to measure the template's share of a long history


class CacheMode(StrEnum):
    """How the prefix store keeps a model's state (README "Which models get which
    treatment"). Blocks hold KV that can be cut at any token; a checkpoint holds the part
    that cannot (a sliding window, a recurrent state) whole, at message boundaries."""

    BLOCKS = "blocks"  # dense attention: every layer's KV in shared token blocks
    SWA_CHECKPOINTS = "blocks + sliding-window checkpoints"  # iSWA (Gemma 2/3, gpt-oss, Llama 4)
    RECURRENT_CHECKPOINTS = "recurrent-state checkpoints"  # Mamba, RWKV
    HYBRID_CHECKPOINTS = "blocks + recurrent-state checkpoints"  # LFM2, Granite 4, Falcon-H1, Jamba
    OFF = "off"

    @property
    def state_kind(self) -> StateKind | None:
        """The state blob's layout for :mod:`engine.kv_codec` (None when off)."""
        return {
            CacheMode.BLOCKS: StateKind.DENSE, CacheMode.SWA_CHECKPOINTS: StateKind.ISWA,
            CacheMode.RECURRENT_CHECKPOINTS: StateKind.RECURRENT,
            CacheMode.HYBRID_CHECKPOINTS: StateKind.HYBRID,
        }.get(self)

    @property
    def checkpoints(self) -> bool:
        return self not in (CacheMode.BLOCKS, CacheMode.OFF)


def cache_mode(n_swa: int, recurrent: bool, hybrid: bool) -> CacheMode:
    """The treatment for a model, from ``llama_model_n_swa`` / ``_is_recurrent`` /
    ``_is_hybrid``. A hybrid with sliding-window attention (``llama_memory_hybrid_iswa``)
    writes three sections the codec does not know yet: off."""
    if hybrid:
        return CacheMode.OFF if n_swa > 0 else CacheMode.HYBRID_CHECKPOINTS
    if recurrent:
        return CacheMode.RECURRENT_CHECKPOINTS
    if n_swa > 0:
        return CacheMode.SWA_CHECKPOINTS
    return CacheMode.BLOCKS


def cache_policy(n_swa: int, recurrent: bool, hybrid: bool) -> str:
    """"full" when the prefix store serves this model (see :func:`cache_mode` for how),
    else why not, in words for the window's banner.

    Dense KV is cut into blocks at any token. Sliding-window attention drops KV older than
    the window and a recurrent state cannot be rewound, so for them the part that cannot
    be cut is stored whole as checkpoints at message boundaries.
    """
    if cache_mode(n_swa, recurrent, hybrid) == CacheMode.OFF:
        return ("off: hybrid models with sliding-window attention keep a state this version "
                "cannot store yet")
    return "full"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (``"\\ud800"`` from JSON, undecodable bytes
    from a command line) as U+FFFD: it is no character and has no UTF-8 form."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def _size_or_zero(path: Path) -> int:
    """The file's size in bytes; 0 when it is gone (deleted after llama.cpp read it)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def check_context_fits(path: Path, settings: EngineSettings) -> None:
    """Refuse a context the model at ``path`` or this machine's memory cannot hold, from the
    GGUF header alone (engine/gguf_meta.py), before llama.cpp allocates anything: at most
    ``engine.limits.CTX_TRAIN_FACTOR`` times the trained context, and a KV cache no larger
    than the memory available now; and a thread count within ``engine.limits.max_threads``.

    Raises:
        ModelLoadError: one sentence with the figures (nothing is checked when the header
            does not give the model's shape).
    """
    from engine import gguf_meta, limits
    from engine.machine import memory_bytes

    try:
        limits.check_threads(settings.n_threads, "The CPU thread count")
    except limits.LimitError as exc:  # llama.cpp crashes on 100,000 threads
        raise ModelLoadError(f"{exc} Choose fewer threads (--threads).") from None
    shape = gguf_meta.model_shape(path)
    if shape is None:
        return
    problem = limits.context_problem(settings.n_ctx, shape.trained,
                                     shape.kv_bytes_per_token(settings.type_k, settings.type_v),
                                     memory_bytes()[1], path.name)
    if problem:
        raise ModelLoadError(problem)


def _load_error_text(path: Path, detail: str) -> str:
    size = _size_or_zero(path)
    reason = f" llama.cpp said: {detail.strip()}" if detail else ""
    if "bounds" in detail or "incomplete" in detail or "corrupted" in detail or "truncat" in detail:
        return (
            f"{path.name} looks incomplete or damaged ({size / 1e6:,.1f} MB on disk). "
            f"Download it again.{reason}"
        )
    if "unknown model architecture" in detail:
        return f"{path.name} uses a model architecture this version of llama.cpp does not support.{reason}"
    return f"{path.name} could not be loaded. It may be damaged or an unsupported model.{reason}"


_KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                  "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}
"""Bytes per element of a KV cache type (block types: block bytes / 32 elements)."""


def kv_bytes_per_token(model, meta: dict, type_k: str, type_v: str) -> int:
    """Bytes of KV cache one token takes in context (all layers, K and V), from the model's
    shape: layers x KV heads x head size x bytes per element of ``type_k`` / ``type_v``.
    Head sizes come from ``<arch>.attention.key_length`` / ``value_length`` when the GGUF
    has them, else embedding size / heads. 0 when the shape is unknown. The prefix store's
    learned layout (exact, after the first snapshot) replaces it in the worker."""
    try:
        n_layer = int(llama_cpp.llama_model_n_layer(model))
        n_embd = int(llama_cpp.llama_model_n_embd(model))
        n_head = int(llama_cpp.llama_model_n_head(model))
        n_head_kv = int(llama_cpp.llama_model_n_head_kv(model)) or n_head
    except (AttributeError, TypeError, ValueError):
        return 0
    if n_layer <= 0 or n_head <= 0 or n_embd <= 0:
        return 0
    arch = meta.get("general.architecture", "")

    def head_size(key: str) -> int:
        value = str(meta.get(f"{arch}.attention.{key}", ""))
        return int(value) if value.isdigit() else n_embd // n_head

    k = n_layer * n_head_kv * head_size("key_length") * _KV_TYPE_BYTES.get(type_k, 2.0)
    v = n_layer * n_head_kv * head_size("value_length") * _KV_TYPE_BYTES.get(type_v, 2.0)
    return int(round(k + v))
