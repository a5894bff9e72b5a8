"""Tiny random-weight GGUF models for the checkpoint tests: a recurrent one (Mamba) and a
hybrid one (LFM2: short-convolution layers with a recurrent state, and attention layers).

No small real GGUF of these families can be downloaded here, so they are written with the
``gguf`` package, following the tensor names and shapes of the pinned llama.cpp
(``src/llama-arch.cpp`` for names, ``src/models/mamba.cpp`` and ``src/models/lfm2.cpp``
``load_arch_hparams`` / ``load_arch_tensors`` for keys and shapes; ggml shapes are
``{ne0, ne1}``, numpy's are reversed). The tokenizer and chat template are copied from the
default model, so prompts are real ChatML. Random weights give deterministic, meaningless
tokens: enough to compare a restored continuation with one computed from scratch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_EMBD = 64
N_LAYER = 4
CTX = 2048


def _copy_tokenizer(writer, source: Path) -> int:
    """Copy the tokenizer and chat template of ``source``; returns the vocabulary size."""
    import gguf

    r = gguf.GGUFReader(str(source))

    def field(name):
        f = r.fields[name]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [int(f.parts[i][0]) for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]][0].item()

    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(field("tokenizer.ggml.tokens"))
    writer.add_token_types(field("tokenizer.ggml.token_type"))
    writer.add_token_merges(field("tokenizer.ggml.merges"))
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    writer.add_add_bos_token(False)
    writer.add_chat_template(field("tokenizer.chat_template"))
    return len(field("tokenizer.ggml.tokens"))


def build(path: Path, arch: str, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write a tiny ``arch`` ("mamba" or "lfm2") model to ``path`` and return it."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    n_vocab = _copy_tokenizer(w, tokenizer_from)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t("token_embd.weight", n_vocab, N_EMBD, scale=1.0)
    if arch == "mamba":
        d_inner, d_conv, d_state, dt_rank = 2 * N_EMBD, 4, 16, 8
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_head_count_kv(0)
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)
        ones("output_norm.weight", N_EMBD)
        for i in range(N_LAYER):
            ones(f"blk.{i}.attn_norm.weight", N_EMBD)
            t(f"blk.{i}.ssm_in.weight", 2 * d_inner, N_EMBD)
            t(f"blk.{i}.ssm_conv1d.weight", d_inner, d_conv)
            t(f"blk.{i}.ssm_conv1d.bias", d_inner)
            t(f"blk.{i}.ssm_x.weight", dt_rank + 2 * d_state, d_inner)
            t(f"blk.{i}.ssm_dt.weight", d_inner, dt_rank)
            t(f"blk.{i}.ssm_dt.bias", d_inner)
            w.add_tensor(f"blk.{i}.ssm_a", -np.exp(rng.standard_normal((d_inner, d_state))).astype(np.float32))
            t(f"blk.{i}.ssm_d", d_inner)
            t(f"blk.{i}.ssm_out.weight", N_EMBD, d_inner)
    elif arch == "lfm2":
        n_head, head_dim, n_ff, l_cache = 4, N_EMBD // 4, 128, 3
        attention = [i % 2 == 1 for i in range(N_LAYER)]
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv([2 if a else 0 for a in attention])
        w.add_rope_freq_base(10000.0)
        w.add_shortconv_l_cache(l_cache)
        w.add_vocab_size(n_vocab)
        ones("token_embd_norm.weight", N_EMBD)
        for i in range(N_LAYER):
            ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
            t(f"blk.{i}.ffn_gate.weight", n_ff, N_EMBD)
            t(f"blk.{i}.ffn_up.weight", n_ff, N_EMBD)
            t(f"blk.{i}.ffn_down.weight", N_EMBD, n_ff)
            ones(f"blk.{i}.attn_norm.weight", N_EMBD)
            if attention[i]:
                ones(f"blk.{i}.attn_q_norm.weight", head_dim)
                ones(f"blk.{i}.attn_k_norm.weight", head_dim)
                t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
                t(f"blk.{i}.attn_k.weight", 2 * head_dim, N_EMBD)
                t(f"blk.{i}.attn_v.weight", 2 * head_dim, N_EMBD)
                t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
            else:
                t(f"blk.{i}.shortconv.conv.weight", N_EMBD, l_cache)
                t(f"blk.{i}.shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD)
                t(f"blk.{i}.shortconv.out_proj.weight", N_EMBD, N_EMBD)
    else:
        raise ValueError(arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


LLAMA_EMBD = 256  # a multiple of 256: K-quant rows are 256 values


def build_k_quant_llama(path: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A tiny random-weight llama-architecture model (4 layers of 256, grouped-query
    attention) quantized to Q4_K_M, llama.cpp's most common download format (its layer
    weights Q4_K and Q6_K): the KV of such a model depends on batch size below 8 tokens
    (``engine.cpu.min_batch``). Written in F32, then quantized by llama.cpp itself."""
    import ctypes

    import gguf
    import llama_cpp

    rng = np.random.default_rng(seed)
    f32 = path.with_suffix(".f32.gguf")
    w = gguf.GGUFWriter(str(f32), "llama")
    w.add_name("tiny-llama-q4km")
    w.add_context_length(CTX)
    w.add_embedding_length(LLAMA_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(3 * LLAMA_EMBD)
    w.add_head_count(8)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    n_vocab = _copy_tokenizer(w, tokenizer_from)
    head = LLAMA_EMBD // 8

    def t(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * scale))

    t("token_embd.weight", n_vocab, LLAMA_EMBD, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(LLAMA_EMBD, dtype=np.float32))
    t("output.weight", n_vocab, LLAMA_EMBD)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(LLAMA_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(LLAMA_EMBD, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", LLAMA_EMBD, LLAMA_EMBD)
        t(f"blk.{i}.attn_k.weight", 4 * head, LLAMA_EMBD)
        t(f"blk.{i}.attn_v.weight", 4 * head, LLAMA_EMBD)
        t(f"blk.{i}.attn_output.weight", LLAMA_EMBD, LLAMA_EMBD)
        t(f"blk.{i}.ffn_gate.weight", 3 * LLAMA_EMBD, LLAMA_EMBD)
        t(f"blk.{i}.ffn_up.weight", 3 * LLAMA_EMBD, LLAMA_EMBD)
        t(f"blk.{i}.ffn_down.weight", LLAMA_EMBD, 3 * LLAMA_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(path).encode(), ctypes.byref(params))
    f32.unlink()
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return path
