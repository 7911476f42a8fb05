// GGUF block tensors to fp32, bit for bit what gguf-py's `dequantize` gives (or to bf16, as torch
// rounds those fp32 values).
//
// Why: a GGUF's matrices are dequantized once at load (the model is built on fp32 weights,
// and the big-step GEMM copies are made from them); gguf-py does it in numpy on one core,
// about 9 s for a 1.7B Q4_K_M file. Here each block is decoded in C++ across the threads.
// The arithmetic follows gguf-py's order and roundings (products and differences of fp32
// values, no fused multiply-add), so the weights equal the reference that the tests hold
// the kernels and transformers to.
//
// Blocks as llama.cpp writes them: Q4_0 (fp16 d, 16 bytes of nibbles: w = d * (q - 8)),
// Q4_1 (fp16 d, fp16 m, nibbles: w = d * q + m), Q5_0 and Q5_1 (the same with a fifth bit,
// q - 16 for Q5_0), Q8_0 (fp16 d, 32 int8: w = q * d), and the K-quants' 256-element
// super-blocks (block_formats.h). Q5_0 is what llama-quantize's Q4_K_M falls back to for
// rows whose length is not a multiple of 256.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "block_formats.h"

namespace {

using namespace block_formats;

// GGML's type numbers for the formats decoded here.
constexpr int64_t GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14;

#define NO_FMA __attribute__((optimize("fp-contract=off")))

NO_FMA void q4_0(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b));
    for (int i = 0; i < 16; ++i) {
        out[i] = d * (float)((b[2 + i] & 0x0f) - 8);
        out[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
    }
}

NO_FMA void q4_1(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
    for (int i = 0; i < 16; ++i) {
        out[i] = d * (float)(b[4 + i] & 0x0f) + m;
        out[i + 16] = d * (float)(b[4 + i] >> 4) + m;
    }
}

// Q5_0 and Q5_1: the fifth bit of element i is bit i of a 32-bit word after the scales.
NO_FMA void q5_0(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b));
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    for (int i = 0; i < 16; ++i) {
        out[i] = d * (float)((int)((b[6 + i] & 0x0f) | (((qh >> i) & 1) << 4)) - 16);
        out[i + 16] = d * (float)((int)((b[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
    }
}

NO_FMA void q5_1(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    for (int i = 0; i < 16; ++i) {
        out[i] = d * (float)((b[8 + i] & 0x0f) | (((qh >> i) & 1) << 4)) + m;
        out[i + 16] = d * (float)((b[8 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) + m;
    }
}

NO_FMA void q8_0(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b));
    for (int i = 0; i < 32; ++i) out[i] = (float)((const int8_t*)(b + 2))[i] * d;
}

// Q4_K and Q5_K: w = (d * sc) * q - (dmin * m), per sub-block of 32.
template <typename KQ>
NO_FMA void k_with_mins(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
    uint32_t u[4];
    scale_min_k4(b + 4, u);
    const auto* sm = reinterpret_cast<const uint8_t*>(u);
    for (int j = 0; j < SUBS; ++j) {
        const float scale = d * (float)sm[j], minimum = dmin * (float)sm[8 + j];
        int w[QK];
        KQ::ints(b, j, w);
        for (int l = 0; l < QK; ++l) out[j * QK + l] = scale * (float)w[l] - minimum;
    }
}

// Q6_K: w = (d * sc) * (q - 32), an int8 scale per 16 weights.
NO_FMA void q6_k(const uint8_t* b, float* out) {
    const float d = half_to_float(load_u16(b + 208));
    const int8_t* sc = (const int8_t*)(b + 192);
    for (int j = 0; j < SUBS; ++j) {
        const uint8_t *ql = Q6K::low(b, j), *qh = Q6K::high(b, j);
        const int k = j % 4, shift = (k & 2) ? 4 : 0;
        for (int l = 0; l < QK; ++l) {
            const int q = (((ql[l] >> shift) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            out[j * QK + l] = (d * (float)sc[(j * QK + l) / 16]) * (float)q;
        }
    }
}

// fp32 to bf16 as torch's CPU `.to(torch.bfloat16)` rounds it: to nearest even, and every NaN
// to 0xffff (its vectorized conversion's NaN, not c10::BFloat16's scalar 0x7fc0).
inline uint16_t to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffff;
    return (uint16_t)((bits + (((bits >> 16) & 1u) + 0x7fffu)) >> 16);
}

// Every block decoded in place (fp32 out), or decoded to fp32 then rounded (bf16 out, the
// big-step GEMM's copy of a file's matrix): the result equals torch's rounding of the fp32
// weights without those ever filling memory.
template <void (*Decode)(const uint8_t*, float*), typename Out>
void decode_all(const uint8_t* data, int64_t blocks, int64_t block_bytes, int64_t block_size, Out* out,
                int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < blocks; ++i) {
        if constexpr (std::is_same_v<Out, float>) {
            Decode(data + i * block_bytes, out + i * block_size);
        } else {
            float values[QK_K];
            Decode(data + i * block_bytes, values);
            for (int64_t j = 0; j < block_size; ++j) out[i * block_size + j] = to_bf16(values[j]);
        }
    }
}

// One GGML type's blocks into out; -1 for a type this file does not decode.
template <typename Out>
int decode_type(int64_t type, const uint8_t* data, int64_t blocks, Out* out, int nthreads) {
    switch (type) {
        case GGML_Q4_0: decode_all<q4_0>(data, blocks, 18, QK, out, nthreads); return 0;
        case GGML_Q4_1: decode_all<q4_1>(data, blocks, 20, QK, out, nthreads); return 0;
        case GGML_Q5_0: decode_all<q5_0>(data, blocks, 22, QK, out, nthreads); return 0;
        case GGML_Q5_1: decode_all<q5_1>(data, blocks, 24, QK, out, nthreads); return 0;
        case GGML_Q8_0: decode_all<q8_0>(data, blocks, 34, QK, out, nthreads); return 0;
        case GGML_Q4_K: decode_all<k_with_mins<Q4K>>(data, blocks, Q4K::BYTES, QK_K, out, nthreads); return 0;
        case GGML_Q5_K: decode_all<k_with_mins<Q5K>>(data, blocks, Q5K::BYTES, QK_K, out, nthreads); return 0;
        case GGML_Q6_K: decode_all<q6_k>(data, blocks, Q6K::BYTES, QK_K, out, nthreads); return 0;
        default: return -1;
    }
}

}  // namespace

extern "C" {

// As dequantize_gguf, into bf16 (uint16 bits).
int dequantize_gguf_bf16(int64_t type, const uint8_t* data, int64_t blocks, uint16_t* out, int nthreads) {
    return decode_type(type, data, blocks, out, nthreads);
}

// `blocks` blocks of GGML type `type` from `data` into out (blocks x the type's block size
// floats). Returns 0, or -1 for a type this file does not decode (the caller falls back).
int dequantize_gguf(int64_t type, const uint8_t* data, int64_t blocks, float* out, int nthreads) {
    return decode_type(type, data, blocks, out, nthreads);
}

}  // extern "C"
