// Fused prefill/extend attention over the paged K/V cache, for the CPU.
// Plain C ABI, loaded with ctypes (cpu_kernels/prefill_attention.py).
//
// Why: the alternative (engine/attention/maskless_prefill.py) first gathers each
// sequence's K/V out of the paged cache into contiguous fp32 tensors, repeats them for
// every query head of a group, and then runs torch's flash kernel twice per query tile.
// This kernel reads the cache in place through the block tables and converts each K/V
// row once for all the query heads that share it.
//
// Work is split into tasks of (sequence, KV head, tile of QUERY_TILE queries): the task's
// rows are its queries times the group's query heads. It walks the keys its rows can see
// (causal, within the window) in tiles of KT keys, flash-attention style: scores of every
// row against the tile, an online softmax (running max m, running sum l, the output
// accumulator rescaled by exp(m_old - m_new) whenever the max grows), then the tile's
// values weighted by the probabilities are added. Nothing of size context x chunk is ever
// held, and the masked upper triangle costs at most one key tile per query tile.
//
// Bodies, by build level, cache element and the caller's precision:
//   avx2    fp32 FMA, key tiles of 16 (two vectors of 8): the K tile is transposed to
//           [D][16] so that a row's scores are D broadcast-FMAs per vector, with no
//           horizontal sums, and four rows share each K load.
//   avx512  the same on 16-wide vectors (key tiles of 32); and bf16 products on AVX512-BF16
//           dot products (vdpbf16ps): the K tile is packed as [D/2][16] pairs, the V tile as
//           [8][D] pairs, queries and probabilities are rounded to bf16 and every product is
//           summed in fp32.
//   amx     bf16 products on the tile unit (TDPBF16PS), key tiles of 64: the same pairs are
//           the B operands, 16 rows of queries (of probabilities) the A operand; scores and
//           the output accumulator stay fp32, the online softmax runs on vectors between the
//           two products.
// A bf16 cache always takes the bf16 products (its K/V are bf16 already, so only the
// queries and probabilities are rounded). An fp32 or fp16 cache takes them only when the
// caller asks (bf16 != 0: the engine asks where the step's projections are bf16 GEMMs
// already), its K/V rows then rounded to bf16 as they are packed; otherwise its fp32 body.
// Cache rows are converted as they are read (include/cache_rows.h, one converter per
// element type). An int8 row (D values, then its fp32 scale: cache_types.h) is dequantized
// to fp32 by kv_convert.h's converter, value * scale as the torch path computes it, so the tile
// holds the very numbers the maskless path gathers; its rows are D + 4 bytes apart. An int8
// cache always takes the fp32 bodies: rounding the queries and probabilities to bf16 would
// add an error the int8 cache's decode and maskless paths do not make, so the kernel could
// no longer stand in for them exactly.
//
// This file holds the work split, the threading and the entry points; the bodies, their
// scratch and the online softmax are the include/prefill_*.h headers it alone includes.
#include "prefill_attention.h"

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "cache_rows.h"
#include "prefill_amx_body.h"
#include "prefill_bf16_body.h"
#include "prefill_fp32_body.h"
#include "prefill_online_softmax.h"
#include "prefill_scratch.h"
#include "simd_vec.h"

namespace {

using namespace pagode::prefill;
using pagode::BF16;
using pagode::cache_row;
using pagode::F16;
using pagode::I8;
using pagode::row_width;
#ifdef PAGODE_AVX512
using pagode_simd::Vec16;
#endif
using pagode_simd::Vec8;


// Queries per task (each brings its group's G query heads): the larger tile shares each
// converted K/V tile among more rows; the smaller one keeps enough tasks for every thread.
constexpr int64_t QUERY_TILE = 32, SMALL_QUERY_TILE = 16;

enum Body : int { NONE = 0, AVX2_F32 = 1, AVX512_F32 = 2, AVX512_BF16 = 3, AMX_BF16 = 4 };

// ---- tasks ---------------------------------------------------------------------
template <typename T>
struct Args {
  const float* q;
  const T* k;
  const T* v;
  const int32_t* bt;
  const int32_t* q_starts;
  const int32_t* seq_lens;
  float* out;
  int64_t S, H, D, BS, KVH, MB;
  float scale;
  int64_t window;
  float softcap;
};

struct Task {
  int64_t seq, kvh, i0, i1;  // the task's queries are rows i0..i1-1 of sequence seq's chunk
  int64_t keys;              // how many key positions it reads (its cost, for ordering)
};

// ---- K/V as bf16 pairs, made once per call (the bf16 bodies) -----------------------
// Every query tile of a sequence reads the same K/V tiles, so the bf16 bodies convert and
// pack each tile once per call, for all of them: per sequence and KV head, the key tiles
// from the first its chunk can see (KT-aligned) to its last, each kp [D/2][KT] then
// vp [KT/2][D] (pack_k_pairs, pack_v_pairs), zeros past the sequence's last position.
struct PairTiles {
  std::vector<uint32_t> words;
  std::vector<int64_t> first, count, base;  // per sequence: first tile, tiles, index of (head 0, first tile)
  int64_t tile_words = 0, KVH = 0, total = 0;

  const uint32_t* k(int64_t s, int64_t h, int64_t t) const {
    return words.data() + (base[s] + h * count[s] + t - first[s]) * 2 * tile_words;
  }
};

template <int64_t KT, typename T>
void plan_pairs(const Args<T>& a, PairTiles& p) {
  p.tile_words = KT * a.D / 2;
  p.KVH = a.KVH;
  p.first.resize(a.S);
  p.count.resize(a.S);
  p.base.resize(a.S);
  p.total = 0;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t n = a.q_starts[s + 1] - a.q_starts[s], len = a.seq_lens[s], ctx = len - n;
    const int64_t klo = a.window > 0 ? std::max<int64_t>(0, ctx - a.window + 1) : 0;
    p.first[s] = klo / KT;
    p.count[s] = (len + KT - 1) / KT - p.first[s];
    p.base[s] = p.total;
    p.total += p.count[s] * a.KVH;
  }
  p.words.resize(p.total * 2 * p.tile_words);
}

// Tile `job` of the plan (sequence, KV head, tile in order), packed by the calling thread.
template <int64_t KT, typename T>
void pack_tile(const Args<T>& a, PairTiles& p, int64_t job, Scratch& sc) {
#ifdef PAGODE_AVX512
  const int64_t s = std::upper_bound(p.base.begin(), p.base.end(), job) - p.base.begin() - 1;
  const int64_t h = (job - p.base[s]) / p.count[s], t = p.first[s] + (job - p.base[s]) % p.count[s];
  const int64_t W = row_width<T>(a.D), row = a.KVH * W, kv = h * W;
  const int64_t kc = std::min<int64_t>(KT, a.seq_lens[s] - t * KT);
  const int32_t* table = a.bt + s * a.MB;
  uint32_t* dst = p.words.data() + job * 2 * p.tile_words;
  const T* rows[KT];
  for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.k, table, t * KT + j, a.BS, row, kv);
  pack_k_pairs<KT>(sc, rows, kc, a.D, dst);
  for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.v, table, t * KT + j, a.BS, row, kv);
  pack_v_pairs<KT>(sc, rows, kc, a.D, dst + p.tile_words);
#else
  (void)a, (void)p, (void)job, (void)sc;
#endif
}

template <class Body, typename T>
void run_task(const Args<T>& a, const Task& t, Scratch& sc, const PairTiles& pairs) {
  constexpr int64_t KT = Body::KT;
  const int64_t G = a.H / a.KVH, D = a.D, n_rows = (t.i1 - t.i0) * G;
  const int64_t q0 = a.q_starts[t.seq], n = a.q_starts[t.seq + 1] - q0, ctx = a.seq_lens[t.seq] - n;
  const int64_t W = row_width<T>(D), row = a.KVH * W, kv = t.kvh * W;
  const int32_t* table = a.bt + t.seq * a.MB;
  const int64_t base = ((q0 + t.i0) * a.H + t.kvh * G) * D;  // row r: query i0 + r / G, head kvh * G + r % G
  auto qrow = [&](int64_t r) { return a.q + base + ((r / G) * a.H + r % G) * D; };
  sc.prepare(n_rows, D, KT);
  Body::load_queries(sc, qrow, n_rows, D);
  const int64_t first = ctx + t.i0, last = ctx + t.i1 - 1;
  const int64_t klo = a.window > 0 ? std::max<int64_t>(0, first - a.window + 1) : 0;
  const T* rows[KT];
  // Packed tiles are KT-aligned: keys of the first one before klo are out of every row's
  // window, and the online softmax masks them as such.
  for (int64_t j0 = Body::PAIRS ? klo / KT * KT : klo; j0 <= last; j0 += KT) {
    const int64_t kc = std::min<int64_t>(KT, last + 1 - j0);
    if constexpr (Body::PAIRS) {
      sc.kpp = pairs.k(t.seq, t.kvh, j0 / KT);
      sc.vpp = sc.kpp + pairs.tile_words;
    } else {
      for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.k, table, j0 + j, a.BS, row, kv);
      Body::pack_k(sc, rows, kc, D);
    }
    Body::scores(sc, qrow, n_rows, D, a.scale);
    online_softmax<typename Body::Width, KT>(sc, n_rows, G, first, j0, kc, a.window, a.softcap, D);
    if constexpr (!Body::PAIRS) {
      for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.v, table, j0 + j, a.BS, row, kv);
      Body::pack_v(sc, rows, kc, D);
    }
    Body::accumulate(sc, n_rows, D);
  }
  for (int64_t r = 0; r < n_rows; ++r) {  // every row sees at least itself, so l > 0
    float* o = a.out + base + ((r / G) * a.H + r % G) * D;
    const __m256 inv = _mm256_set1_ps(1.f / sc.l[r]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(sc.acc.data() + r * D + d), inv));
  }
}

// Every (sequence, KV head, query tile), the costliest first so that the dynamic schedule
// ends with the short ones.
template <typename T>
std::vector<Task> tasks_of(const Args<T>& a, int64_t tile) {
  std::vector<Task> tasks;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t n = a.q_starts[s + 1] - a.q_starts[s], ctx = a.seq_lens[s] - n;
    for (int64_t i0 = 0; i0 < n; i0 += tile) {
      const int64_t i1 = std::min(n, i0 + tile), last = ctx + i1;
      const int64_t first = a.window > 0 ? std::max<int64_t>(0, ctx + i0 - a.window + 1) : 0;
      for (int64_t h = 0; h < a.KVH; ++h) tasks.push_back({s, h, i0, i1, last - first});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.keys > y.keys; });
  return tasks;
}

template <class Body, typename T>
void run(const Args<T>& a, int num_threads) {
  std::vector<Task> tasks = tasks_of(a, QUERY_TILE);
  if (static_cast<int64_t>(tasks.size()) < 4 * num_threads) tasks = tasks_of(a, SMALL_QUERY_TILE);
  const int64_t count = static_cast<int64_t>(tasks.size());
  static thread_local PairTiles calling_thread_pairs;  // reused across calls
  PairTiles* pairs = &calling_thread_pairs;            // the workers use the calling thread's
  if constexpr (Body::PAIRS) plan_pairs<Body::KT>(a, *pairs);
#pragma omp parallel num_threads(num_threads)
  {
    thread_local Scratch sc;
    if constexpr (Body::PAIRS) {
      sc.prepare_packing(a.D, Body::KT);
#pragma omp for schedule(static)
      for (int64_t job = 0; job < pairs->total; ++job) pack_tile<Body::KT>(a, *pairs, job, sc);
    }
    Body::begin(a.D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) run_task<Body>(a, tasks[i], sc, *pairs);
    Body::end();
  }
}

enum Element : int { E_F32 = 0, E_F16 = 1, E_BF16 = 2, E_I8 = 3 };

template <typename T>
constexpr int element_code() {
  return std::is_same<T, float>::value ? E_F32
         : std::is_same<T, F16>::value ? E_F16
         : std::is_same<T, BF16>::value ? E_BF16
                                         : E_I8;
}

// bf16: whether an fp32 or fp16 cache may take the bf16 products (a bf16 cache always does,
// an int8 one never).
int body_for(int64_t D, int element, bool bf16) {
  if (D <= 0 || D % 8 != 0) return NONE;
#ifdef PAGODE_AVX512
  const bool products = D % 32 == 0 && (element == E_BF16 || (bf16 && (element == E_F32 || element == E_F16)));
#ifdef PAGODE_AMX
  if (products) return AMX_BF16;
#endif
  if (products) return AVX512_BF16;
  if (D % 16 == 0) return AVX512_F32;
#endif
  (void)element;
  (void)bf16;
  return AVX2_F32;
}

template <typename T>
void prefill(const Args<T>& a, bool bf16, int num_threads) {
  switch (body_for(a.D, element_code<T>(), bf16)) {
    case AVX2_F32: run<Fp32Body<Vec8, T>>(a, num_threads); return;
#ifdef PAGODE_AVX512
    case AVX512_F32: run<Fp32Body<Vec16, T>>(a, num_threads); return;
    case AVX512_BF16:
      if constexpr (!std::is_same<T, I8>::value) run<Bf16Body<T>>(a, num_threads);
      return;
#endif
#ifdef PAGODE_AMX
    case AMX_BF16:
      if constexpr (!std::is_same<T, I8>::value) {
        pagode_amx::request_tiles();
        run<AmxBody<T>>(a, num_threads);
      }
      return;
#endif
    default: return;
  }
}

}  // namespace

extern "C" {

void paged_prefill_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt,
                                 const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                 int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                 int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<float>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}
void paged_prefill_attention_f16(const float* q, const F16* k, const F16* v, const int32_t* bt,
                                 const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                 int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                 int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<F16>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}
void paged_prefill_attention_bf16(const float* q, const BF16* k, const BF16* v, const int32_t* bt,
                                  const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                  int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                  int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<BF16>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}

void paged_prefill_attention_i8(const float* q, const I8* k, const I8* v, const int32_t* bt,
                                const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<I8>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}

int prefill_attention_body(int64_t D, int element, int bf16) { return body_for(D, element, bf16 != 0); }

}  // extern "C"

#endif  // PAGODE_AVX2
