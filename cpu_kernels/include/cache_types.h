// The element types a paged K/V cache may hold besides float: the bits of an IEEE half
// and of a bfloat16. Shared by the attention kernel and the fused decode step.
#pragma once
#include <cstdint>

namespace pagode {

struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };

}  // namespace pagode
