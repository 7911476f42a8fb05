// A whole decode step of a decoder on block-quantized weights, in one call (CPU).
//
// At one to a few tokens per step a layer's ten or so ops each take microseconds, and
// dispatching them from Python (module calls, ctypes, tensor allocation) cost as much as
// the arithmetic. This file runs every layer's ops back to back on preallocated scratch:
// residual-add + RMSNorm, the fused QKV projection, RoPE + K/V cache write, paged decode
// attention, the output projection, residual-add + RMSNorm, gate-up, the gated activation,
// down, and the final norm. Per layer, the table also gives what families add to that layer:
// RMSNorm on the queries and keys before RoPE, per head (Qwen3, Gemma 3) or over the whole
// projection (OLMo 2); norms after each sublayer as well as or instead of before it (Gemma,
// OLMo 2); the layer's own RoPE tables (local and global bases, partial rotary, layers
// without RoPE); a sliding window and a logit soft-cap; a scale on each sublayer's output
// (Granite); and SiLU or tanh-GELU. Gemma's (1 + w) norms arrive as ordinary weights
// holding 1 + w. Each op is the very function that the per-op path calls through
// ctypes (declared in include/, linked into the same library), so both paths give the
// same numbers. The attention and fused ops are AVX2: below the avx2 level this file
// compiles to nothing.
#include "isa.h"

#ifdef PAGODE_AVX2
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_gemm.h"
#include "cache_types.h"
#include "fused_ops.h"
#include "lora_delta.h"
#include "paged_attention.h"
#include "quant_linear.h"

namespace {

using pagode::BF16;
using pagode::F16;
using pagode::I8;

// Per layer, the pointer slots the Python side fills (engine/model/decode_step.py).
enum Slot : int64_t {
    // RMSNorm weights before and after each sublayer, 0 where the layer has none.
    ATTN_NORM, ATTN_OUT_NORM, MLP_NORM, MLP_OUT_NORM,
    K_CACHE, V_CACHE,
    Q_NORM, K_NORM,  // q/k RMSNorm weights, 0 when the family has none
    QK_NORM_WHOLE,   // 1: they span the whole q and k projections, 0: each head
    COS, SIN,        // the layer's RoPE tables
    WINDOW, SOFTCAP,  // the sliding window (0: none), the soft-cap's float bits (0: none)
    OUT_SCALE,       // float bits of the factor on each sublayer's output (0: none)
    ACTIVATION,      // the MLP's gate: Activation
    // Each linear: its part table, how many parts, and its dense bf16 weight (DenseSlot) or 0.
    QKV, O = QKV + 3, GATE_UP = O + 3, DOWN = GATE_UP + 3,
    SLOTS = DOWN + 3,
};
// A linear's dense bf16 copy: the weight [N, K], its bias as the bf16 GEMM adds it (fp32, or 0),
// and the step sizes (from, to) at which the layer-by-layer path runs pagode's bf16 GEMM on it.
enum DenseSlot : int64_t { DENSE_WEIGHT, DENSE_BIAS, DENSE_FROM, DENSE_TO };
enum Activation : int64_t { SILU = 0, GELU_TANH = 1 };
constexpr int64_t PART = 8;  // a part of a linear: kind, rows, qs, scales, mins, bias, tile_from, int8
enum CacheType : int64_t { F32 = 0, F16_CACHE = 1, BF16_CACHE = 2, I8_CACHE = 3 };

struct Dims {
    int64_t hidden, heads, kv_heads, head_dim, inter, block_size;
};

// Which rows run on which adapter, and each projection's adapter table (lora_delta.h) per
// layer: [L, 4] in PROJECTIONS order, 0 where a projection has no adapter. table is null
// when no row of the step runs on an adapter.
struct Adapters {
    const int64_t* table;
    const int64_t* row_slots;
};
enum Projection : int64_t { P_QKV, P_O, P_GATE_UP, P_DOWN, PROJECTIONS };

// A fused projection whose shards kept different formats (a Q4_K_M file's Q4_K q/k beside a
// Q6_K v) is several parts, each writing its own columns of y [M, N].
void base_linear(const int64_t* slot, const float* x, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
    const auto* part = reinterpret_cast<const int64_t*>(slot[0]);
    int64_t n0 = 0;
    for (int64_t i = 0; i < slot[1]; ++i, part += PART) {
        linear_blocks(part[0], x, reinterpret_cast<const uint8_t*>(part[2]), reinterpret_cast<const uint16_t*>(part[3]),
                      reinterpret_cast<const uint16_t*>(part[4]), reinterpret_cast<const float*>(part[5]), y + n0, M,
                      part[1], K, N, part[6], part[7], nthreads);
        n0 += part[1];
    }
}

// Where the layer-by-layer path runs the bf16 GEMM for a step of M tokens, the same kernel
// on the same dense copy, its answer rounded to bf16 as that path's is; else the blocks.
void dense_or_blocks(const int64_t* slot, const float* x, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
#ifdef PAGODE_AMX
    const auto* dense = reinterpret_cast<const int64_t*>(slot[2]);
    if (dense != nullptr && M >= dense[DENSE_FROM] && M <= dense[DENSE_TO]) {
        bf16_gemm(x, 0, reinterpret_cast<const uint16_t*>(dense[DENSE_WEIGHT]),
                  reinterpret_cast<const float*>(dense[DENSE_BIAS]), y, BF16_OUT_ROUNDED_FP32, M, N, K, nthreads);
        return;
    }
#endif
    base_linear(slot, x, y, M, N, K, nthreads);
}

// The base projection over every row, then each adapter row's delta.
void linear(const int64_t* p, Slot slot, const Adapters& lora, int64_t layer, Projection which, const float* x,
            float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
    dense_or_blocks(p + slot, x, y, M, N, K, nthreads);
    if (lora.table == nullptr) return;
    const auto* table = reinterpret_cast<const int64_t*>(lora.table[layer * PROJECTIONS + which]);
    if (table != nullptr) lora_add_f32(table, x, y, M, K, N, lora.row_slots, nthreads);
}

// The attention entry points for a cache element type.
template <typename T> struct CacheKernels;
template <> struct CacheKernels<float> {
    static constexpr auto rope_write = rope_write_kv_f32;
    static constexpr auto decode = paged_decode_attention_f32;
};
template <> struct CacheKernels<F16> {
    static constexpr auto rope_write = rope_write_kv_f16;
    static constexpr auto decode = paged_decode_attention_f16;
};
template <> struct CacheKernels<BF16> {
    static constexpr auto rope_write = rope_write_kv_bf16;
    static constexpr auto decode = paged_decode_attention_bf16;
};
template <> struct CacheKernels<I8> {
    static constexpr auto rope_write = rope_write_kv_i8;
    static constexpr auto decode = paged_decode_attention_i8;
};

float float_slot(const int64_t* p, Slot slot) {
    float value;
    const int32_t bits = (int32_t)p[slot];
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

const float* weight(const int64_t* p, Slot slot) { return reinterpret_cast<const float*>(p[slot]); }

template <typename T>
void attend(const int64_t* p, const Dims& d, const float* qkv, const int64_t* positions, const int64_t* slots,
            const int32_t* tables, const int32_t* lens, float* q, float* out, int64_t B, int64_t MB, float scale,
            int nthreads) {
    T* kc = reinterpret_cast<T*>(p[K_CACHE]);
    T* vc = reinterpret_cast<T*>(p[V_CACHE]);
    const int64_t row = (d.heads + 2 * d.kv_heads) * d.head_dim;
    const float softcap = float_slot(p, SOFTCAP);
    CacheKernels<T>::rope_write(qkv, row, positions, reinterpret_cast<const float*>(p[COS]),
                                reinterpret_cast<const float*>(p[SIN]), q, kc, vc, slots, B, d.heads, d.kv_heads,
                                d.head_dim, nthreads);
    CacheKernels<T>::decode(q, kc, vc, tables, lens, out, B, d.heads, d.head_dim, d.block_size, d.kv_heads, MB,
                            scale, (int)p[WINDOW], softcap, nthreads);
}

// RMSNorm on the queries and keys of every row, in place (the per-op path's norm): on each
// head (Qwen3, Gemma 3), or on the whole q and the whole k projections (OLMo 2).
void normalize_qk(const int64_t* p, const Dims& d, float* qkv, int64_t B, float eps, float* scratch) {
    const int64_t qd = d.heads * d.head_dim, kd = d.kv_heads * d.head_dim, row = qd + 2 * kd;
    const bool whole = p[QK_NORM_WHOLE] != 0;
    const int64_t q_rows = whole ? 1 : d.heads, k_rows = whole ? 1 : d.kv_heads;
    for (int64_t b = 0; b < B; ++b) {
        float* q = qkv + b * row;
        add_rmsnorm_f32(q, scratch, weight(p, Q_NORM), q, q_rows, qd / q_rows, eps, 0, 1);
        add_rmsnorm_f32(q + qd, scratch, weight(p, K_NORM), q + qd, k_rows, kd / k_rows, eps, 0, 1);
    }
}

struct Scratch {
    std::vector<float> residual, normed, spare, qkv, q, attn, gate_up, act, heads;
    void size(int64_t B, const Dims& d) {
        const int64_t qd = d.heads * d.head_dim;
        residual.resize(B * d.hidden);
        normed.resize(B * d.hidden);
        spare.resize(B * d.hidden);
        qkv.resize(B * (qd + 2 * d.kv_heads * d.head_dim));
        q.resize(B * qd);
        attn.resize(B * qd);
        gate_up.resize(B * 2 * d.inter);
        act.resize(B * d.inter);
        heads.resize(qd);
    }
};

// The residual stream and the output of the last sublayer, still to be added into it. Deferring
// the add lets it fuse into the next norm, as the per-op path's residual-add + RMSNorm does.
struct Stream {
    float* x;              // the pending sublayer output [B, hidden]
    bool started = false;  // whether the residual holds the stream yet (the embeddings start it)
    Scratch& s;
    int64_t B, hidden;
    float eps;
    int nthreads;

    // Adds x into the stream and gives the sublayer's input: the stream's RMSNorm, or the
    // stream itself where the layer has no norm before the sublayer (OLMo 2).
    const float* enter(const float* norm) {
        float* r = s.residual.data();
        if (norm) {
            add_rmsnorm_f32(x, r, norm, s.normed.data(), B, hidden, eps, started, nthreads);
        } else {
            for (int64_t i = 0; i < B * hidden; ++i) r[i] = started ? r[i] + x[i] : x[i];
        }
        started = true;
        return norm ? s.normed.data() : r;
    }

    // The sublayer wrote its output into x: its norm (Gemma, OLMo 2), then its scale (Granite),
    // in the per-op path's order.
    void leave(const float* norm, float scale) {
        if (norm) {
            add_rmsnorm_f32(x, s.spare.data(), norm, s.normed.data(), B, hidden, eps, 0, nthreads);
            std::memcpy(x, s.normed.data(), B * hidden * sizeof(float));
        }
        if (scale != 0.f)
            for (int64_t i = 0; i < B * hidden; ++i) x[i] *= scale;
    }

    // The final norm: what the lm_head reads, into `out`.
    void finish(const float* norm, float* out) {
        add_rmsnorm_f32(x, s.residual.data(), norm, s.normed.data(), B, hidden, eps, started, nthreads);
        std::memcpy(out, s.normed.data(), B * hidden * sizeof(float));
    }
};

void activate(const int64_t* p, const float* gate_up, float* out, int64_t B, int64_t inter, int nthreads) {
    if (p[ACTIVATION] == GELU_TANH)
        gelu_tanh_and_mul_f32(gate_up, out, B, inter, nthreads);
    else
        silu_and_mul_f32(gate_up, out, B, inter, nthreads);
}

}  // namespace

extern "C" {

// hidden [B, hidden]: in, the token embeddings (scaled as the family scales them); out, the
// final RMSNorm of the last layer's residual stream (what the lm_head reads). layers [L, SLOTS]
// holds pointers (engine/model/decode_step.py): per projection (qkv, o, gate_up, down), a table
// of its parts and their count.
// dims: hidden, heads, kv_heads, head_dim, intermediate, block_size. Positions and slots are
// int64 [B], block tables int32 [B, MB], seq_lens int32 [B]; every slot must be >= 0.
// lora: [L, 4] adapter tables (lora_delta.h) or null, row_slots [B] each row's adapter slot
// (-1: the base weights only).
void decode_step(float* hidden, const int64_t* layers, int64_t L, const int64_t* dims,
                 int64_t cache_type, const float* final_norm, float eps, float scale, const int64_t* positions, const int64_t* slots, const int32_t* tables,
                 const int32_t* lens, int64_t B, int64_t MB, const int64_t* lora, const int64_t* row_slots,
                 int nthreads) {
    const Dims d{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]};
    thread_local Scratch s;
    s.size(B, d);
    const int64_t qd = d.heads * d.head_dim, qkv_n = qd + 2 * d.kv_heads * d.head_dim;
    const auto attend_fn = cache_type == F16_CACHE    ? attend<F16>
                           : cache_type == BF16_CACHE ? attend<BF16>
                           : cache_type == I8_CACHE   ? attend<I8>
                                                      : attend<float>;
    Stream st{hidden, false, s, B, d.hidden, eps, nthreads};
    const Adapters adapters{lora, row_slots};
    for (int64_t l = 0; l < L; ++l) {
        const int64_t* p = layers + l * SLOTS;
        const float out_scale = float_slot(p, OUT_SCALE);
        linear(p, QKV, adapters, l, P_QKV, st.enter(weight(p, ATTN_NORM)), s.qkv.data(), B, qkv_n, d.hidden, nthreads);
        if (p[Q_NORM]) normalize_qk(p, d, s.qkv.data(), B, eps, s.heads.data());
        attend_fn(p, d, s.qkv.data(), positions, slots, tables, lens, s.q.data(), s.attn.data(), B, MB, scale,
                  nthreads);
        linear(p, O, adapters, l, P_O, s.attn.data(), st.x, B, d.hidden, qd, nthreads);
        st.leave(weight(p, ATTN_OUT_NORM), out_scale);
        linear(p, GATE_UP, adapters, l, P_GATE_UP, st.enter(weight(p, MLP_NORM)), s.gate_up.data(), B, 2 * d.inter,
               d.hidden, nthreads);
        activate(p, s.gate_up.data(), s.act.data(), B, d.inter, nthreads);
        linear(p, DOWN, adapters, l, P_DOWN, s.act.data(), st.x, B, d.hidden, d.inter, nthreads);
        st.leave(weight(p, MLP_OUT_NORM), out_scale);
    }
    st.finish(final_norm, hidden);
}

int64_t decode_step_slots() { return SLOTS; }

}  // extern "C"

#endif  // PAGODE_AVX2
