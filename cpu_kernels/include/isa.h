// What the library is being compiled for, as macros every source tests.
//
// cpu_kernels/build.py compiles src/ once per target level with that level's explicit
// flags (-mavx2 -mfma -mf16c for avx2, plus -mavx512* for avx512, plus -mamx-* for amx;
// never -march=native), so these macros say what the binary may use, not what the
// compiling machine has. A body written for a level sits under its macro; at a lower
// level it is left out and the Python side finds its symbols missing.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGODE_AVX2 1
#endif

#if defined(PAGODE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__AVX512BF16__)
#define PAGODE_AVX512 1
#endif

#if defined(PAGODE_AVX512) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define PAGODE_AMX 1
#endif
