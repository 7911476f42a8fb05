// The element types a paged K/V cache may hold besides float: the bits of an IEEE half,
// of a bfloat16, and an int8 value. Shared by the attention kernel and the fused decode step.
//
// An int8 cache keeps each (token, KV head) row as D int8 values followed by their fp32
// scale (max |x| / 127) in the same row, so a row is D + 4 bytes wide and the cache stays
// one tensor [2, blocks, block_size, KVH, D + 4]: whatever copies or shares a block copies
// its scales with it. row_extra<T> is the number of T after a row's D values.
#pragma once
#include <cstdint>

namespace pagode {

struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
struct I8 { int8_t value; };

template <typename T>
inline constexpr int64_t row_extra = 0;
template <>
inline constexpr int64_t row_extra<I8> = 4;  // the row's fp32 scale

// The stride, in T, from one KV head's row to the next: D values plus any scale.
template <typename T>
inline constexpr int64_t row_width(int64_t D) { return D + row_extra<T>; }

}  // namespace pagode
