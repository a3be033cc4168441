// The compiled CPU forward's two attention reductions (decoding/runtime/attention_kernels.py builds this file on
// the machine that runs it, with -march=native, and registers its operators with PyTorch's dispatcher).
//
// Why a kernel of our own: inductor keeps one accumulator per output vector, so a score (64 dependent adds) or a
// weighted sum over the slots waits on the adder's latency; these loops keep 8 independent accumulators.
//
// Exact by construction (runtime/compiled._attend relies on it): every output element is one lane that adds its
// terms one after another in a fixed order (a score over d = 0..d-1; a weighted sum, and the softmax's
// denominator, over the slots in slot order), with the multiply and the add as separate operations (built with
// -ffp-contract=off), whatever block, row group or width it is computed in. So a row gets the same bits at any
// width, and a masked slot (weight 0) adds an exact zero between the same terms: a tree row, its siblings'
// slots in place, sums exactly what greedy's one-position forward sums.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// floats per vector: one register's worth (AVX-512: 16; AVX2: 8, where 16-float vectors made GCC's code 1.6x slower on
// an AMD EPYC Zen 3). A lane's sum never depends on L (each lane is one slot or one dimension, summed in order),
// so the bits are the same at either width.
#if defined(__AVX512F__)
constexpr int L = 16;
#else
constexpr int L = 8;
#endif
typedef float vf __attribute__((vector_size(L * sizeof(float))));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
inline vf splat(float s) { return vf{} + s; }

// scores[b, g, r, j] = sum_d rows[b, (g * rep + r) * d] * keys_t[g, d, j], j < span
template <int R, int NV>
inline void score_block(const float* const* q, const float* kt, int64_t d, int64_t cap, float* const* out,
                        int64_t at) {
  vf acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  for (int64_t e = 0; e < d; ++e) {
    vf k[NV];
    for (int v = 0; v < NV; ++v) k[v] = load(kt + e * cap + v * L);
    for (int r = 0; r < R; ++r) {
      vf s = splat(q[r][e]);
      for (int v = 0; v < NV; ++v) acc[r][v] = acc[r][v] + s * k[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(out[r] + at + v * L, acc[r][v]);
}

constexpr int WIDE = 4;

// f(nv, i) over [0, n) in blocks of WIDE vectors, then single vectors (nv: the block's vectors, a constant)
template <typename F>
inline void in_blocks(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + WIDE * L <= n; i += WIDE * L) f(std::integral_constant<int, WIDE>{}, i);
  for (; i < n; i += L) f(std::integral_constant<int, 1>{}, i);
}

// For every (row i, kv head g), in parallel: step(R, g, in, out) on its rep query heads, two at a time, then one;
// head h of row i reads in + (i * heads + h) * in_len and writes out + (i * heads + h) * out_len (heads = kv * rep)
template <int R, typename Step>
inline void step_rows(Step& step, int64_t g, int64_t first, const float* in, int64_t in_len, float* out,
                      int64_t out_len) {
  const float* ins[R];
  float* outs[R];
  for (int k = 0; k < R; ++k) {
    ins[k] = in + (first + k) * in_len;
    outs[k] = out + (first + k) * out_len;
  }
  step(std::integral_constant<int, R>{}, g, ins, outs);
}

template <typename Step>
void over_rows(int64_t b, int64_t kv, int64_t rep, const float* in, int64_t in_len, float* out, int64_t out_len,
               Step&& step) {
  at::parallel_for(0, b * kv, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {                  // t = i * kv + g; its first head: t * rep
      int64_t r = 0;
      for (; r + 2 <= rep; r += 2) step_rows<2>(step, t % kv, t * rep + r, in, in_len, out, out_len);
      for (; r < rep; ++r) step_rows<1>(step, t % kv, t * rep + r, in, in_len, out, out_len);
    }
  });
}

at::Tensor float32(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "the attention kernel takes float32 tensors");
  return t.contiguous();
}

at::Tensor attn_scores(const at::Tensor& rows_in, const at::Tensor& keys_in, int64_t span) {
  // rows [B, heads * d] (rotated, scaled), keys_t [kv, d, capacity] -> [B, kv, rep, span]
  const at::Tensor rows = float32(rows_in), keys_t = float32(keys_in);
  TORCH_CHECK(span % L == 0 && span <= keys_t.size(2), "span must be a multiple of 16 within the cache");
  const int64_t b = rows.size(0), kv = keys_t.size(0), d = keys_t.size(1), cap = keys_t.size(2);
  const int64_t heads = rows.size(1) / d, rep = heads / kv;
  auto out = at::empty({b, kv, rep, span}, rows.options());
  const float* kp = keys_t.data_ptr<float>();
  over_rows(b, kv, rep, rows.data_ptr<float>(), d, out.data_ptr<float>(), span,
            [&](auto rn, int64_t g, const float* const* q, float* const* o) {
              in_blocks(span, [&](auto nv, int64_t j) {     // a block of slots: its scores, over d
                score_block<decltype(rn)::value, decltype(nv)::value>(q, kp + g * d * cap + j, d, cap, o, j);
              });
            });
  return out;
}

// out[b, g, r, :] = (sum_j weights[b, g, r, j] * values[g, j, :]) / (sum_j weights[b, g, r, j]), both sums over
// j = 0, 1, ... span - 1 in order (the denominator one float per row, beside the vectors)
template <int R, int NV>
inline void value_block(const float* const* w, const float* v, int64_t d, int64_t span, float* const* out,
                        int64_t at) {
  vf acc[R][NV];
  float den[R];
  for (int r = 0; r < R; ++r) {
    den[r] = 0.0f;
    for (int u = 0; u < NV; ++u) acc[r][u] = vf{};
  }
  for (int64_t j = 0; j < span; ++j) {
    vf x[NV];
    for (int u = 0; u < NV; ++u) x[u] = load(v + j * d + u * L);
    for (int r = 0; r < R; ++r) {
      const float wj = w[r][j];
      den[r] = den[r] + wj;
      vf s = splat(wj);
      for (int u = 0; u < NV; ++u) acc[r][u] = acc[r][u] + s * x[u];
    }
  }
  for (int r = 0; r < R; ++r) {
    vf inv = splat(den[r]);
    for (int u = 0; u < NV; ++u) store(out[r] + at + u * L, acc[r][u] / inv);
  }
}

at::Tensor attn_values(const at::Tensor& weights_in, const at::Tensor& values_in, int64_t span) {
  // weights [B, kv, rep, span], values [1, kv, capacity, d] -> [B, kv, rep, d]
  const at::Tensor weights = float32(weights_in), values = float32(values_in);
  const int64_t b = weights.size(0), kv = weights.size(1), rep = weights.size(2);
  const int64_t cap = values.size(2), d = values.size(3);
  TORCH_CHECK(d % L == 0 && weights.size(3) == span && span <= cap, "head size a multiple of 16, span within the cache");
  auto out = at::empty({b, kv, rep, d}, weights.options());
  const float* vp = values.data_ptr<float>();
  over_rows(b, kv, rep, weights.data_ptr<float>(), span, out.data_ptr<float>(), d,
            [&](auto rn, int64_t g, const float* const* w, float* const* o) {
              in_blocks(d, [&](auto nv, int64_t e) {        // a block of the head's dims: over the slots
                value_block<decltype(rn)::value, decltype(nv)::value>(w, vp + g * cap * d + e, d, span, o, e);
              });
            });
  return out;
}

// The accepted path's keys and values moved down in place: for each cache tensor, slot base + src[i] -> slot
// base + i (src ascending, so src[i] >= i and an ascending copy never overwrites a slot it still has to read).
// A [1, kv, capacity, d] layer moves whole rows; a [kv, d, capacity] transposed one moves single floats.
void move_rows(at::TensorList caches, const at::Tensor& src_in, int64_t base) {
  const at::Tensor src = src_in.to(at::kLong).contiguous();
  const int64_t* sp = src.data_ptr<int64_t>();
  const int64_t m = src.numel();
  for (int64_t i = 1; i < m; ++i) TORCH_CHECK(sp[i] > sp[i - 1], "source rows must ascend");
  at::parallel_for(0, static_cast<int64_t>(caches.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const at::Tensor& t = caches[c];
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "float32 contiguous caches only");
      float* p = t.data_ptr<float>();
      if (t.dim() == 4) {                                   // [1, kv, capacity, d]
        const int64_t kv = t.size(1), cap = t.size(2), d = t.size(3);
        TORCH_CHECK(m == 0 || base + sp[m - 1] < cap, "row outside the cache");
        for (int64_t g = 0; g < kv; ++g)
          for (int64_t i = 0; i < m; ++i)
            if (sp[i] != i) std::memcpy(p + (g * cap + base + i) * d, p + (g * cap + base + sp[i]) * d, d * sizeof(float));
      } else {                                              // [kv, d, capacity]
        TORCH_CHECK(t.dim() == 3, "a cache is [1, kv, capacity, d] or [kv, d, capacity]");
        const int64_t rows = t.size(0) * t.size(1), cap = t.size(2);
        TORCH_CHECK(m == 0 || base + sp[m - 1] < cap, "row outside the cache");
        for (int64_t e = 0; e < rows; ++e)
          for (int64_t i = 0; i < m; ++i) p[e * cap + base + i] = p[e * cap + base + sp[i]];
      }
    }
  });
}

// The index of each row's first largest value, as torch.argmax gives it (a NaN counts as the largest: the first
// NaN's index), for the greedy verification of a wide forward's logits [rows, vocab]: PyTorch's argmax costs
// about 17 times a max over the same floats here. One pass of vector maxima (and a NaN flag), then the first
// index holding that maximum.
typedef int32_t vi __attribute__((vector_size(L * sizeof(int32_t))));

inline bool any_lane(vi m) {
  int64_t w[L / 2];
  std::memcpy(w, &m, sizeof(vi));
  int64_t acc = 0;
  for (int i = 0; i < L / 2; ++i) acc |= w[i];
  return acc != 0;
}

int64_t row_argmax(const float* row, int64_t n) {
  vf m[4] = {splat(-INFINITY), splat(-INFINITY), splat(-INFINITY), splat(-INFINITY)};
  vi nan = vi{};
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L)
    for (int u = 0; u < 4; ++u) {
      vf a = load(row + j + u * L);
      nan |= (a != a);
      m[u] = a > m[u] ? a : m[u];
    }
  float best = -INFINITY;
  bool has_nan = any_lane(nan);
  for (int u = 0; u < 4; ++u)
    for (int i = 0; i < L; ++i) best = m[u][i] > best ? m[u][i] : best;
  for (int64_t t = j; t < n; ++t) {
    if (row[t] != row[t]) has_nan = true;
    else if (row[t] > best) best = row[t];
  }
  if (has_nan) {
    for (int64_t t = 0; t < n; ++t)
      if (row[t] != row[t]) return t;
  }
  const vf target = splat(best);
  int64_t t = 0;
  for (; t + L <= n; t += L)
    if (any_lane(load(row + t) == target)) break;
  for (; t < n; ++t)
    if (row[t] == best) return t;
  return 0;                                              // not reached: some element holds the maximum
}

at::Tensor argmax_rows(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) > 0, "argmax_rows takes a [rows, n] tensor, n > 0");
  const at::Tensor x = float32(x_in);
  const int64_t rows = x.size(0), n = x.size(1);
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 2, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) o[r] = row_argmax(p + r * n, n);
  });
  return out;
}

// ---------------------------------------------------------------------------------------- float16-weight linear
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): x float32 [M, K], w float16 [N, K] (N a multiple of 4 and K of 8).
//
// Why: FBGEMM's float16 GEMM (PyTorch's) gives a row other bits at every row count above one on an AMD EPYC
// (AVX2), and a 16-row call of the bundled model's LM head cost it 6x a one-row call there (32 ms against 5), at
// some 15 % of the cores' peak. Here the weights are read once per call whatever M is (a block of outputs stays
// in L1 while every row uses it) and each output is one 8-lane sum: lane j adds x[k] * w[k] for k = j, j + 8, ...
// in order, then the 8 lanes in a fixed tree. The same bits for a row at any
// M and in any tile: a verify forward's row is the one-position forward's, which the compiled path needs. (On a
// CPU with FMA the multiply and add are fused, in every tile alike.)

typedef float v8 __attribute__((vector_size(8 * sizeof(float))));

template <typename V>
inline V load_as(const float* p) {         // a register's floats from memory (any alignment)
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// The same bits as another type of the same size (a vector extension type <-> an intrinsic's register type)
template <typename To, typename From>
inline To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bits_as: the same size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

inline v8 half8(const uint16_t* p) {
#if defined(__F16C__)
  return bits_as<v8>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  v8 v;
  for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(c10::Half(p[i], c10::Half::from_bits()));
  return v;
#endif
}

inline float lanes(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

// y[0..3] = lanes(acc[n]) (+ bias[n]) for 4 outputs at once: the same adds in the same tree (s_j = a_j + a_{j+4}, then
// (s_0 + s_1) + (s_2 + s_3)), done 4 outputs to a vector instead of one scalar at a time.
inline void lanes4(const v8* acc, const float* bias, float* y) {
#if defined(__AVX__)
  __m128 s[4];
  for (int n = 0; n < 4; ++n) {
    __m256 a;
    std::memcpy(&a, &acc[n], sizeof(v8));
    s[n] = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  }
  __m128 r = _mm_hadd_ps(_mm_hadd_ps(s[0], s[1]), _mm_hadd_ps(s[2], s[3]));
  if (bias) r = _mm_add_ps(r, _mm_loadu_ps(bias));
  _mm_storeu_ps(y, r);
#else
  for (int n = 0; n < 4; ++n) y[n] = bias ? lanes(acc[n]) + bias[n] : lanes(acc[n]);
#endif
}

// acc + x * w, fused where the CPU has FMA (every output's every step alike, so the bits stay the row's own)
inline v8 mul_add(v8 acc, v8 x, v8 w) {
#if defined(__FMA__)
  return bits_as<v8>(_mm256_fmadd_ps(bits_as<__m256>(x), bits_as<__m256>(w), bits_as<__m256>(acc)));
#else
  return acc + x * w;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
typedef float v16 __attribute__((vector_size(16 * sizeof(float))));

inline v16 mul_add(v16 acc, v16 x, v16 w) {          // as the 8-float one, on one AVX-512 register
  return bits_as<v16>(_mm512_fmadd_ps(bits_as<__m512>(x), bits_as<__m512>(w), bits_as<__m512>(acc)));
}
#endif

// Streaming the weights: a tile is 4.6 KB at K = 576, so a worker's run of tiles crosses a 4 KB page at every tile,
// where the hardware's stream prefetcher starts over. Each tile's loop therefore asks for the next tile's cache lines
// (into L2: ``__builtin_prefetch`` locality 1), one line a step spread over the tile's work, so memory streams
// while the cores multiply. A prefetch never faults and changes no value.
inline void prefetch_line(const char* next, int64_t line, int64_t lines) {
  if (line < lines) __builtin_prefetch(next + line * 64, 0, 1);
}

// One tile from float16: MR rows (1 or 2) against the 4 outputs of packed tile ``w`` ([K / 8][4][8] float16: the 4
// outputs' 8 weights of each k-chunk side by side, so a tile streams one contiguous run of memory). With one or two
// rows the conversion is cheap beside the memory it waits on. Not inlined: inlined into half_linear beside the 16-float
// path (an AVX-512 build), the bundled model's products over one row (a greedy step's) took 6.9 ms instead of 5.2 on
// an AMD EPYC Zen 5 (medians of 15, two processes each way; an AVX2 build's took 5.2 either way).
template <int MR>
__attribute__((noinline)) void half_tile(const float* x, int64_t K, const uint16_t* w, const float* bias, float* y,
                                         int64_t N, const char* next, int64_t lines) {
  v8 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 4; ++n) acc[m][n] = v8{};
  for (int64_t k = 0, step = 0; k < K; k += 8, w += 32, ++step) {
    prefetch_line(next, step, lines);
    v8 wv[4];
    for (int n = 0; n < 4; ++n) wv[n] = half8(w + n * 8);
    for (int m = 0; m < MR; ++m) {
      const v8 xv = load_as<v8>(x + m * K + k);
      for (int n = 0; n < 4; ++n) acc[m][n] = mul_add(acc[m][n], xv, wv[n]);
    }
  }
  for (int m = 0; m < MR; ++m) lanes4(acc[m], bias, y + m * N);
}

// One tile from its weights already widened to float32 (``w``: [K / 8][4][8] floats, in L1): MR rows (up to 3) at a
// time, the rows' 8 inputs in registers and one output's weights at a time: 12 accumulators, 3 + 1 operands,
// AVX2's 16 registers. Each output's sum is the same sequence of fused multiply-adds as ``half_tile``'s (a float16
// weight widens to float32 exactly), so a row's bits do not depend on which loop computed it.
template <int MR>
inline void float_tile(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
                       const char* next, int64_t lines) {
  v8 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 4; ++n) acc[m][n] = v8{};
  for (int64_t k = 0, step = 0; k < K; k += 8, w += 32, ++step) {
    prefetch_line(next, step, lines);
    v8 xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = load_as<v8>(x + m * K + k);
    for (int n = 0; n < 4; ++n) {
      const v8 wv = load_as<v8>(w + n * 8);
      for (int m = 0; m < MR; ++m) acc[m][n] = mul_add(acc[m][n], xv[m], wv);
    }
  }
  for (int m = 0; m < MR; ++m) lanes4(acc[m], bias, y + m * N);
}

// The tile on 16-float registers (AVX-512), for products over more than DIRECT_ROWS rows: one register holds two
// outputs' 8 lanes (the packed layout puts outputs n and n + 1 side by side), widened from float16 once a step for all
// the group's rows, and a row's 8 inputs are broadcast to both halves. Every lane does exactly the fused multiply-adds
// of ``half_tile`` / ``float_tile``, in the same order, and the same ``lanes4`` sums them, so a row's bits are the same
// on either path (tests/test_fp16_weights.py checks it): only the instructions per step halve, and the 32 registers
// hold 12 rows (24 accumulators), so a verify forward's rows share one pass over the weights with no widened copy. Up
// to DIRECT_ROWS rows stay on ``half_tile``, in one group (32 registers hold its 16 accumulators; AVX2's 16 hold 2
// rows' 8): on an AMD EPYC Zen 5 this tile took 8-9 ms for a forward's products over 2 to 4 rows, ``half_tile`` 6-7.
// There (bench_half_linear.py), against the 8-float path: 4 rows 7.8 -> 6.6 ms, 10 rows 24 -> 8.4, 16 rows 38 -> 13.
// Which path runs is measured per machine (attention_kernels.choose_half_width); an AVX2 build has only the 8-float
// one.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
constexpr int64_t WIDEST = 16;
constexpr int WIDE_ROWS = 12;           // 24 accumulators + 2 weights + 1 input of the 32 registers

inline void store_lanes(const __m512* acc, const float* bias, float* y) {
  v8 a[4];
  for (int h = 0; h < 2; ++h) {
    a[2 * h] = bits_as<v8>(_mm512_castps512_ps256(acc[h]));
    a[2 * h + 1] = bits_as<v8>(_mm512_extractf32x8_ps(acc[h], 1));
  }
  lanes4(a, bias, y);
}

template <int MR>
inline void wide_tile(const float* x, int64_t K, const uint16_t* w, const float* bias, float* y, int64_t N,
                      const char* next, int64_t lines) {
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0, step = 0; k < K; k += 8, w += 32, ++step) {
    prefetch_line(next, step, lines);
    const __m512 w01 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    const __m512 w23 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16)));
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + m * K + k));
      acc[m][0] = _mm512_fmadd_ps(xv, w01, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xv, w23, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) store_lanes(acc[m], bias, y + m * N);
}

inline void wide_group(int64_t rows, const float* x, int64_t K, const uint16_t* w, const float* bias, float* y,
                       int64_t N, const char* next, int64_t lines) {
  switch (rows) {
    case 1: wide_tile<1>(x, K, w, bias, y, N, next, lines); break;
    case 2: wide_tile<2>(x, K, w, bias, y, N, next, lines); break;
    case 3: wide_tile<3>(x, K, w, bias, y, N, next, lines); break;
    case 4: wide_tile<4>(x, K, w, bias, y, N, next, lines); break;
    case 5: wide_tile<5>(x, K, w, bias, y, N, next, lines); break;
    case 6: wide_tile<6>(x, K, w, bias, y, N, next, lines); break;
    case 7: wide_tile<7>(x, K, w, bias, y, N, next, lines); break;
    case 8: wide_tile<8>(x, K, w, bias, y, N, next, lines); break;
    case 9: wide_tile<9>(x, K, w, bias, y, N, next, lines); break;
    case 10: wide_tile<10>(x, K, w, bias, y, N, next, lines); break;
    case 11: wide_tile<11>(x, K, w, bias, y, N, next, lines); break;
    default: wide_tile<12>(x, K, w, bias, y, N, next, lines); break;
  }
}
#else
constexpr int64_t WIDEST = 8;
constexpr int WIDE_ROWS = 12;
#endif

std::atomic<int64_t> half_width_now{WIDEST};   // the path half_linear takes past DIRECT_ROWS: 8 or (where built) 16
std::atomic<int64_t> half_calls_by_width[2];    // products run on each path (tests count them)
std::atomic<bool> half_three_now{true};          // the 8-float path's three rows as one group (group_rows)

inline bool wide_path() { return WIDEST == 16 && half_width_now.load(std::memory_order_relaxed) == 16; }

constexpr int64_t TB = 8;        // tiles (of 4 outputs) a worker takes at a time

// The next group's rows with ``left`` rows to go, groups of at most ``widest``: as few groups as that allows, of even
// sizes (16 rows at most 12 a group: 8 + 8; at most 6: 6 + 5 + 5)
inline int64_t even_rows(int64_t left, int64_t widest) {
  const int64_t groups = (left + widest - 1) / widest;
  return (left + groups - 1) / groups;
}
constexpr int64_t DIRECT_ROWS = 4;   // up to this many rows, no widened copy of a tile (below)

// The next row group's size in a product over M rows, with ``left`` rows to go: 2 at a time when the rows read the
// float16 weights straight (M <= DIRECT_ROWS), else 3 at a time, but 2 + 2 rather than 3 + 1 (one row alone uses a
// quarter of the registers a group of three does).
// ``wide``: the 16-float path is taken (AVX-512's 32 registers): up to DIRECT_ROWS rows in one ``half_tile`` group (16
// accumulators, 4 weights and 1 input: 21 of 32 registers), more in even groups of up to WIDE_ROWS on ``wide_tile``.
// ``three``: on the 8-float path, three rows (a tree of two nodes and its root) as one group, 12 accumulators and the 4
// weights in AVX2's 16 registers, the inputs read from memory by the multiply-adds, rather than 2 + 1 (the weights
// widened twice); measured per machine (``half_three``). On an AMD EPYC Zen 5 under the AVX2 caps: 7.0 -> 5.7-6.1 ms.
inline int64_t group_rows(int64_t M, int64_t left, bool wide, bool three) {
  if (wide && M > DIRECT_ROWS) return even_rows(left, WIDE_ROWS);     // 16 rows: 8 + 8
  if (M <= DIRECT_ROWS) return std::min<int64_t>(left, wide ? DIRECT_ROWS : M == 3 && three ? 3 : 2);
  return left == 4 || left < 3 ? std::min<int64_t>(left, 2) : 3;
}

inline int64_t row_groups(int64_t M, bool wide, bool three) {
  int64_t groups = 0;
  for (int64_t left = M; left > 0; left -= group_rows(M, left, wide, three)) ++groups;
  return groups;
}

// w: [N / 4, K / 8, 4, 8] float16 (kernels.HalfLinear packs it), x [M, K] float32 -> [M, N]
//
// Up to DIRECT_ROWS rows read each tile's float16 weights straight, two rows at a time (``half_tile``). More widen a
// tile to float32 once, into a buffer that stays in L1 (9 KB at K = 576, 24 KB at 1536), and run every group of rows
// over it (``float_tile``): the conversion is paid once a tile, not once a row group. (At 3 and 4 rows, two direct
// groups measured 8-18 % faster than widening, relative to FBGEMM in the same runs: the widening is paid over too
// few groups.) With the prefetch, the compiled float16-weight forward of the bundled model under the AVX2 caps on an
// Intel Xeon (family 6 model 167), against the kernel before: one position 23.4 -> 19.2 ms, 10 positions 44.3 ->
// 31.4, 16 positions 58.0 -> 40.5 (BENCHMARKS.md, "The float16-weight product, second version";
// benchmarks/bench_half_linear.py times the products).
at::Tensor half_linear(const at::Tensor& x_in, const at::Tensor& w_in, const c10::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(w_in.dim() == 4 && w_in.size(2) == 4 && w_in.size(3) == 8 && w_in.scalar_type() == at::kHalf,
              "half_linear's weights are float16, packed [N / 4, K / 8, 4, 8]");
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == w_in.size(1) * 8, "half_linear takes x [M, K]");
  const at::Tensor x = float32(x_in), w = w_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), tiles = w.size(0), N = tiles * 4;
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) bias = float32(*bias_in);
  auto out = at::empty({M, N}, x.options());
  if (M == 0 || tiles == 0) return out;                             // nothing to multiply (and no row groups)
  const float* px = x.data_ptr<float>();
  const uint16_t* pw = reinterpret_cast<const uint16_t*>(w.data_ptr<at::Half>());
  const float* pb = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* py = out.data_ptr<float>();
  const int64_t tile_lines = (K * 4 * 2 + 63) / 64;               // a tile's bytes in cache lines
  const bool wide = wide_path() && M > 2;
  half_calls_by_width[wide ? 1 : 0].fetch_add(1, std::memory_order_relaxed);    // (up to 2 rows: the same either way)
  const bool three = half_three_now.load(std::memory_order_relaxed);
  const int64_t groups = row_groups(M, wide, three);
  const int64_t per_group = (tile_lines + groups - 1) / groups;    // the next tile's lines each group asks for
  const bool direct = M <= DIRECT_ROWS || wide;         // no widened copy of a tile
  at::parallel_for(0, (tiles + TB - 1) / TB, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> widened(direct ? 0 : static_cast<size_t>(K * 4 + 16));     // + 16: room to align it
    float* wf = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(widened.data()) + 63) & ~uintptr_t(63));
    const int64_t end = std::min(tiles, hi * TB);
    for (int64_t t = lo * TB; t < end; ++t) {
      const uint16_t* wt = pw + t * K * 4;
      const float* bt = pb ? pb + t * 4 : nullptr;
      float* yt = py + t * 4;
      const char* next = reinterpret_cast<const char*>(wt + K * 4);
      const int64_t lines = t + 1 < end ? tile_lines : 0;          // nothing past this worker's last tile
      if (!direct) {
        for (int64_t j = 0; j < K * 4; j += 32) {                 // a cache line of float16 a step (K * 4 % 32 == 0)
          const v8 f0 = half8(wt + j), f1 = half8(wt + j + 8), f2 = half8(wt + j + 16), f3 = half8(wt + j + 24);
          std::memcpy(wf + j, &f0, sizeof(v8));
          std::memcpy(wf + j + 8, &f1, sizeof(v8));
          std::memcpy(wf + j + 16, &f2, sizeof(v8));
          std::memcpy(wf + j + 24, &f3, sizeof(v8));
        }
      }
      for (int64_t m = 0, g = 0; m < M; ++g) {
        const char* part = next + g * per_group * 64;
        const int64_t own = std::max<int64_t>(0, std::min(per_group, lines - g * per_group));
        const int64_t rows = group_rows(M, M - m, wide, three);
        const float* xm = px + m * K;
        float* ym = yt + m * N;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
        if (wide && M > DIRECT_ROWS) {
          wide_group(rows, xm, K, wt, bt, ym, N, part, own);
          m += rows;
          continue;
        }
#endif
        if (direct && rows == 4) half_tile<4>(xm, K, wt, bt, ym, N, part, own);
        if (direct && rows == 3) half_tile<3>(xm, K, wt, bt, ym, N, part, own);
        if (direct && rows == 2) half_tile<2>(xm, K, wt, bt, ym, N, part, own);
        if (direct && rows == 1) half_tile<1>(xm, K, wt, bt, ym, N, part, own);
        if (!direct && rows == 3) float_tile<3>(xm, K, wf, bt, ym, N, part, own);
        if (!direct && rows == 2) float_tile<2>(xm, K, wf, bt, ym, N, part, own);
        if (!direct && rows == 1) float_tile<1>(xm, K, wf, bt, ym, N, part, own);
        m += rows;
      }
    }
  });
  return out;
}

// The path half_linear takes: ``width`` 8 or 16 sets it (16 only where this build has it), 0 leaves it; returns the
// path now taken. ``half_calls`` counts the products each path ran (8 floats, 16 floats).
int64_t half_width(int64_t width) {
  if (width == 8 || (width == 16 && WIDEST == 16)) half_width_now.store(width);
  return half_width_now.load();
}

// Whether the 8-float path runs three rows as one group: ``set`` 1 or 0 sets it, -1 leaves it; returns it now.
int64_t half_three(int64_t set) {
  if (set == 0 || set == 1) half_three_now.store(set == 1);
  return half_three_now.load() ? 1 : 0;
}

std::vector<int64_t> half_calls(const at::Tensor& /*cpu: the dispatcher's key*/) {
  return {half_calls_by_width[0].load(), half_calls_by_width[1].load()};
}

// ------------------------------------------------------------------------------------------------- the FMA probe
// What this machine's cores can multiply: every worker runs ``iters`` rounds of 12 independent multiply-adds on the
// registers half_linear's wide products use (8 floats, or 16 where ``half_width`` is 16: enough chains to cover the
// adder's latency), and the call returns the floating-point operations done (2 per lane per multiply-add). The
// caller times it. With ``loads`` each multiply-add takes one operand from memory (a 16 KB buffer that stays in
// L1), as a product's inner loop does: on an AMD EPYC Zen 3 that rate, not the registers-only one, bounds the
// products (runtime/forward_cost.compute_floor_ms). A virtual CPU may share its core with a neighbour: the probe
// measures what this one gets, which is what a kernel gets too.
template <typename V, bool LOADS>
float fma_rounds(int64_t iters, int64_t seed) {
  constexpr int W = sizeof(V) / sizeof(float);      // floats per register: 8 or 16
  alignas(64) float buf[4096];
  for (int i = 0; i < 4096; ++i) buf[i] = 1e-6f * static_cast<float>((i + seed) % 7);
  V acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = V{} + 0.001f * static_cast<float>(j + seed);
  const V a = V{} + 0.9999f, b = V{} + 1e-5f;
  for (int64_t i = 0; i < iters; ++i) {
    const float* p = buf + (i & (1024 / W - 1)) * 4 * W;
    for (int j = 0; j < 12; ++j) acc[j] = mul_add(LOADS ? load_as<V>(p + (j & 3) * W) : b, acc[j], a);
  }
  float s = 0.f;
  for (int j = 0; j < 12; ++j) s += acc[j][0];
  return s;
}

double fma_probe(const at::Tensor& /*cpu: the dispatcher's key*/, int64_t iters, bool loads) {
  const int64_t workers = std::max<int64_t>(1, at::get_num_threads());
  const int64_t lanes = wide_path() ? 16 : 8;
  std::vector<float> sink(static_cast<size_t>(workers), 0.f);
  at::parallel_for(0, workers, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {      // kept, so the loop is not optimised away
      float got = 0.f;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
      if (lanes == 16) got = loads ? fma_rounds<v16, true>(iters, t) : fma_rounds<v16, false>(iters, t);
#endif
      if (lanes == 8) got = loads ? fma_rounds<v8, true>(iters, t) : fma_rounds<v8, false>(iters, t);
      sink[static_cast<size_t>(t)] = got;
    }
  });
  float total = 0.f;
  for (float s : sink) total += s;
  return total == total ? static_cast<double>(workers) * static_cast<double>(iters) * 12.0 * 2.0 * lanes : 0.0;
}

// ------------------------------------------------------------------------------------------ bfloat16 products
// y = round_bf16(round_bf16(x) . w + bias) for bfloat16 weights (kernels.Bf16Linear's arithmetic: the input rounded to
// bfloat16, float32 accumulation, the result rounded to bfloat16 and handed back as float32), on the project's kernel:
// oneDNN's bfloat16 kernels give a row other bits at other row counts on some CPUs (an AMD EPYC Zen 5), which a
// bfloat16-weight *target* cannot have. Each output's sum here is one fixed sequence (its k-chunks in order, a fixed
// tree over the lanes at the end), whatever M, group or tile computed it, so a row's bits never depend on the width.
//
// Where the CPU has AVX-512 BF16 (``vdpbf16ps``: 32 multiply-adds of bfloat16 pairs an instruction, into 16 float32
// lanes, twice a float32 FMA's work and no conversion of the weights), a register holds one output's 32 weights of a
// k-chunk and a row's 32 inputs, so no broadcast either: up to BF16_ROWS rows x 4 outputs of accumulators. Elsewhere
// (AVX2) the same products on float32 FMAs: a bfloat16 is a float32's upper half, so a pair of them read as one 32-bit
// word widens by a mask (the odd one) and a shift (the even one). The two paths sum in different orders (each is
// exact within itself; a machine runs one of them for every width).
//
// w: [Np / 4, Kp / 32, 4, 32] bfloat16 bits (attention_kernels.pack_bf16; Np, Kp padded to 4 and 32 with zeros).

// PyTorch's float -> bfloat16 rounding (c10::BFloat16: to nearest, ties to even; a NaN becomes 0x7FC0), on the bits,
// so that loops of it vectorize: the bfloat16's bits in the upper half of a float32.
inline uint32_t bf16_bits(uint32_t u) {
  return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

// y[0..3] rounded to bfloat16 in place (as bf16_bits, 4 at a time)
inline void round4(float* y) {
  const __m128 v = _mm_loadu_ps(y);
  const __m128i u = _mm_castps_si128(v);
  __m128i r = _mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)),
                            _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1)));
  r = _mm_and_si128(r, _mm_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m128i nan = _mm_castps_si128(_mm_cmpunord_ps(v, v));
  r = _mm_or_si128(_mm_andnot_si128(nan, r), _mm_and_si128(nan, _mm_set1_epi32(0x7fc00000)));
  _mm_storeu_ps(y, _mm_castsi128_ps(r));
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512DQ__)
constexpr bool BF16_DOT = true;
constexpr int BF16_ROWS = 6;        // 24 accumulators + 4 weights + 1 input of the 32 registers

template <int MR>
inline void bf16_tile(const uint16_t* x, int64_t K, const uint16_t* w, const float* bias, float* acc_out,
                      const char* next, int64_t lines) {
  __m512 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 4; ++n) acc[m][n] = _mm512_setzero_ps();
  const int64_t steps = K / 32, per = steps ? (lines + steps - 1) / steps : 0;
  for (int64_t k = 0, step = 0; k < K; k += 32, w += 128, ++step) {
    for (int64_t i = 0; i < per; ++i) prefetch_line(next, step * per + i, lines);
    __m512i wv[4];
    for (int n = 0; n < 4; ++n) wv[n] = _mm512_loadu_si512(w + n * 32);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = bits_as<__m512bh>(_mm512_loadu_si512(x + m * K + k));
      for (int n = 0; n < 4; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, bits_as<__m512bh>(wv[n]));
    }
  }
  for (int m = 0; m < MR; ++m) {      // 16 lanes -> 8 (lane j + lane j + 8), then lanes4's tree
    v8 a[4];
    for (int n = 0; n < 4; ++n)
      a[n] = bits_as<v8>(_mm256_add_ps(_mm512_castps512_ps256(acc[m][n]), _mm512_extractf32x8_ps(acc[m][n], 1)));
    lanes4(a, bias, acc_out + m * 4);
    round4(acc_out + m * 4);
  }
}
#else
constexpr bool BF16_DOT = false;
#if defined(__AVX512F__)
constexpr int BF16_ROWS = 4;
#else
constexpr int BF16_ROWS = 2;        // 8 accumulators + 4 widened inputs + 2 widened weights of AVX2's 16 registers
#endif
typedef uint32_t vu8 __attribute__((vector_size(8 * sizeof(uint32_t))));

template <int MR>
inline void bf16_tile(const uint16_t* x, int64_t K, const uint16_t* w, const float* bias, float* acc_out,
                      const char* next, int64_t lines) {
  v8 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 4; ++n) acc[m][n] = v8{};
  const int64_t steps = K / 16, per = steps ? (lines + steps - 1) / steps : 0;
  for (int64_t k = 0, step = 0; k < K; k += 16, ++step) {      // half a k-chunk: 8 pairs a register
    for (int64_t i = 0; i < per; ++i) prefetch_line(next, step * per + i, lines);
    const uint16_t* wk = w + (k / 32) * 128 + (k % 32);
    v8 odd[MR], even[MR];
    for (int m = 0; m < MR; ++m) {
      vu8 pair;
      std::memcpy(&pair, x + m * K + k, sizeof(vu8));
      odd[m] = bits_as<v8>(vu8(pair & 0xffff0000u));
      even[m] = bits_as<v8>(vu8(pair << 16));
    }
    for (int n = 0; n < 4; ++n) {
      vu8 pair;
      std::memcpy(&pair, wk + n * 32, sizeof(vu8));
      const v8 wo = bits_as<v8>(vu8(pair & 0xffff0000u)), we = bits_as<v8>(vu8(pair << 16));
      for (int m = 0; m < MR; ++m) acc[m][n] = mul_add(mul_add(acc[m][n], odd[m], wo), even[m], we);
    }
  }
  for (int m = 0; m < MR; ++m) {
    lanes4(acc[m], bias, acc_out + m * 4);
    round4(acc_out + m * 4);
  }
}
#endif

std::atomic<int64_t> bf16_calls_made{0};    // products run (tests count them)

inline void bf16_group(int64_t rows, const uint16_t* x, int64_t K, const uint16_t* w, const float* bias,
                       float* acc_out, const char* next, int64_t lines) {
  switch (rows) {        // rows <= BF16_ROWS: the wider groups are built on every path, taken only where they fit
    case 1: bf16_tile<1>(x, K, w, bias, acc_out, next, lines); break;
    case 2: bf16_tile<2>(x, K, w, bias, acc_out, next, lines); break;
    case 3: bf16_tile<3>(x, K, w, bias, acc_out, next, lines); break;
    case 4: bf16_tile<4>(x, K, w, bias, acc_out, next, lines); break;
    case 5: bf16_tile<5>(x, K, w, bias, acc_out, next, lines); break;
    default: bf16_tile<6>(x, K, w, bias, acc_out, next, lines); break;
  }
}

// x [M, K] float32 (K <= Kp), w packed as above, bias [n] float32 or none, n <= Np -> [M, n] float32 (bfloat16 values)
at::Tensor bf16_linear(const at::Tensor& x_in, const at::Tensor& w_in, const c10::optional<at::Tensor>& bias_in,
                       int64_t n) {
  TORCH_CHECK(w_in.dim() == 4 && w_in.size(2) == 4 && w_in.size(3) == 32 && w_in.scalar_type() == at::kBFloat16,
              "bf16_linear's weights are bfloat16, packed [N / 4, K / 32, 4, 32]");
  const int64_t tiles = w_in.size(0), Kp = w_in.size(1) * 32;
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) <= Kp && x_in.size(1) > Kp - 32, "bf16_linear takes x [M, K]");
  TORCH_CHECK(n > 0 && n <= tiles * 4 && n > tiles * 4 - 4, "bf16_linear: n does not match the packed weights");
  const at::Tensor x = float32(x_in), w = w_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) bias = float32(*bias_in);
  TORCH_CHECK(!bias.defined() || bias.numel() == n, "bf16_linear: the bias has n values");
  auto out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  bf16_calls_made.fetch_add(1, std::memory_order_relaxed);
  // the rows rounded to bfloat16 (PyTorch's rounding), zero past K; the bias padded to whole tiles
  std::vector<uint16_t> xb(static_cast<size_t>(M * Kp), 0);
  const uint32_t* px = reinterpret_cast<const uint32_t*>(x.data_ptr<float>());
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* row = xb.data() + m * Kp;
    const uint32_t* in = px + m * K;
    for (int64_t k = 0; k < K; ++k) row[k] = static_cast<uint16_t>(bf16_bits(in[k]) >> 16);
  }
  std::vector<float> bpad;
  if (bias.defined()) {
    bpad.assign(static_cast<size_t>(tiles * 4), 0.f);
    std::memcpy(bpad.data(), bias.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
  }
  const uint16_t* pw = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const float* pb = bias.defined() ? bpad.data() : nullptr;
  float* py = out.data_ptr<float>();
  const int64_t tile_lines = (Kp * 4 * 2 + 63) / 64;
  // Each tile's loop asks for the cache lines of a tile ahead (as half_linear's): the next one over a few rows,
  // the one after it over more, whose tiles take long enough to compute that one tile's lead no longer covers
  // memory's latency (the bundled model's products over 16 rows on an AMD EPYC Zen 5: 10.6 -> 8.9 ms, interleaved
  // runs; over 1 row 5.9 either way).
  const int64_t ahead = M > DIRECT_ROWS ? 2 : 1;
  const int64_t groups = (M + BF16_ROWS - 1) / BF16_ROWS;
  const int64_t per_group = (tile_lines + groups - 1) / groups;
  at::parallel_for(0, (tiles + TB - 1) / TB, 1, [&](int64_t lo, int64_t hi) {
    float sums[6 * 4];                 // the widest group bf16_group builds
    const int64_t end = std::min(tiles, hi * TB);
    for (int64_t t = lo * TB; t < end; ++t) {
      const uint16_t* wt = pw + t * Kp * 4;
      const char* next = reinterpret_cast<const char*>(wt + ahead * Kp * 4);
      const int64_t lines = t + ahead < end ? tile_lines : 0;
      const int64_t outs = std::min<int64_t>(4, n - t * 4);
      for (int64_t m = 0, g = 0; m < M; ++g) {
        const int64_t rows = even_rows(M - m, BF16_ROWS);
        const int64_t own = std::max<int64_t>(0, std::min(per_group, lines - g * per_group));
        bf16_group(rows, xb.data() + m * Kp, Kp, wt, pb ? pb + t * 4 : nullptr, sums, next + g * per_group * 64, own);
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(py + (m + r) * n + t * 4, sums + r * 4, static_cast<size_t>(outs) * sizeof(float));
        m += rows;
      }
    }
  });
  return out;
}

// Whether this build multiplies bfloat16 pairs in one instruction (AVX-512 BF16), and how many products have run.
std::vector<int64_t> bf16_info(const at::Tensor& /*cpu: the dispatcher's key*/) {
  return {BF16_DOT ? 1 : 0, bf16_calls_made.load(), BF16_ROWS};
}


// -------------------------------------------------------------------------------------------- int8 x int8 products
// y[m, n] = ws[n] * sum_g xs[m, g] * S[m, g, n] (+ bias[n]) for int8 weights (one float32 scale per output, ``ws``)
// and int8 activations (one scale per row and group of I8_GROUP inputs, ``xs``: the group's largest magnitude over
// 127, each input rounded to the nearest integer of x * (127 / largest), ties to even), where S[m, g, n] is the
// group's integer dot product (kernels.W8A8Linear's arithmetic). S is an exact integer on every path (|S| <= 64 *
// 127 * 127 < 2^24), so the float32 part alone decides the bits, and it is one fixed sequence per output lane: the
// groups' fused multiply-adds in order, then the weight's scale, then the bias. A row's bits are therefore the same at
// any row count, in any tile or group, and on every path below (AVX-512 VNNI, AVX2, scalar): an AVX2 CPU's output
// equals an AVX-512 VNNI one's (tests/test_w8a8_weights.py checks a digest of them).
//
// Where the CPU has AVX-512 VNNI (``vpdpbusd``: 64 multiply-adds of byte pairs an instruction, into 16 int32 lanes),
// a register holds 16 outputs' 4 weights of a k-quad and a row's 4 inputs are broadcast; the instruction takes one
// unsigned operand, so the weights are packed shifted by 128 (u8 = w + 128) and the group's sum of the row's inputs
// times 128 is taken back out. Elsewhere (AVX2) ``vpmaddubsw`` multiplies |x| by w with x's sign (no pair can
// saturate its int16 sum: w and x are within [-127, 127]) and ``vpmaddwd`` widens the pairs to int32.
//
// w: [Np / 48, Kp / 4, 48, 4] bytes (attention_kernels.pack_int8; Np, Kp padded to 48 and 64 with zeros).
constexpr int64_t I8_GROUP = 64;     // inputs per activation scale
constexpr int64_t I8_TILE = 48;      // outputs per tile: 3 registers of 16 int32 lanes (AVX-512), 6 of 8 (AVX2)

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
constexpr bool I8_DOT = true;
constexpr int I8_ROWS = 4;           // 12 int32 + 12 float32 accumulators + 3 weights + 1 input of the 32 registers

template <int MR>
inline void i8_tile(const int8_t* q, int64_t Kp, const float* xs, const int32_t* qsum, const uint8_t* w, float* out,
                    const char* next, int64_t lines) {
  const int64_t G = Kp / I8_GROUP;
  const int64_t per = (lines + Kp / 4 - 1) / (Kp / 4);     // lines to ask for a k-quad (0 to 3)
  __m512 f[MR][3];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 3; ++j) f[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g, w += I8_GROUP * I8_TILE) {
    __m512i a[MR][3];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 3; ++j) a[m][j] = _mm512_setzero_si512();
    const int8_t* qg = q + g * I8_GROUP;
#pragma GCC unroll 16
    for (int s = 0; s < I8_GROUP / 4; ++s) {       // a group's 16 k-quads, unrolled: no loop-carried copies
      const uint8_t* ws = w + s * I8_TILE * 4;
      for (int64_t i = 0, line = ((g * I8_GROUP) / 4 + s) * per; i < per; ++i)
        prefetch_line(next, line + i, lines);
      __m512i wv[3];
      for (int j = 0; j < 3; ++j) {
        wv[j] = _mm512_loadu_si512(ws + j * 64);
        __asm__("" : "+v"(wv[j]));                 // kept in a register: GCC otherwise loads it again for every row
      }
      for (int m = 0; m < MR; ++m) {
        int32_t quad;
        std::memcpy(&quad, qg + m * Kp + s * 4, sizeof(quad));
        const __m512i xv = _mm512_set1_epi32(quad);
        for (int j = 0; j < 3; ++j) a[m][j] = _mm512_dpbusd_epi32(a[m][j], wv[j], xv);
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m512i back = _mm512_set1_epi32(128 * qsum[m * G + g]);
      const __m512 scale = _mm512_set1_ps(xs[m * G + g]);
      for (int j = 0; j < 3; ++j)
        f[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[m][j], back)), scale, f[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 3; ++j) _mm512_storeu_ps(out + m * I8_TILE + j * 16, f[m][j]);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool I8_DOT = false;
constexpr int I8_ROWS = 1;           // 6 int32 + 6 float32 accumulators + the input's two forms + ones of 16 registers

template <int MR>
inline void i8_tile(const int8_t* q, int64_t Kp, const float* xs, const int32_t* /*qsum*/, const uint8_t* w, float* out,
                    const char* next, int64_t lines) {
  const int64_t G = Kp / I8_GROUP;
  const int64_t per = (lines + Kp / 4 - 1) / (Kp / 4);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f[MR][6];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 6; ++j) f[m][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g, w += I8_GROUP * I8_TILE) {
    __m256i a[MR][6];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 6; ++j) a[m][j] = _mm256_setzero_si256();
    const int8_t* qg = q + g * I8_GROUP;
#pragma GCC unroll 16
    for (int s = 0; s < I8_GROUP / 4; ++s) {
      const uint8_t* ws = w + s * I8_TILE * 4;
      for (int64_t i = 0, line = ((g * I8_GROUP) / 4 + s) * per; i < per; ++i)
        prefetch_line(next, line + i, lines);
      __m256i xv[MR], xa[MR];
      for (int m = 0; m < MR; ++m) {
        int32_t quad;
        std::memcpy(&quad, qg + m * Kp + s * 4, sizeof(quad));
        xv[m] = _mm256_set1_epi32(quad);
        xa[m] = _mm256_abs_epi8(xv[m]);
      }
      for (int j = 0; j < 6; ++j) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + j * 32));
        for (int m = 0; m < MR; ++m) {
          const __m256i pairs = _mm256_maddubs_epi16(xa[m], _mm256_sign_epi8(wv, xv[m]));
          a[m][j] = _mm256_add_epi32(a[m][j], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 scale = _mm256_set1_ps(xs[m * G + g]);
      for (int j = 0; j < 6; ++j) f[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[m][j]), scale, f[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 6; ++j) _mm256_storeu_ps(out + m * I8_TILE + j * 8, f[m][j]);
}
#else
constexpr bool I8_DOT = false;
constexpr int I8_ROWS = 1;

// A CPU without AVX2: the same integers one at a time, the same fused multiply-adds (std::fma), so the same bits.
template <int MR>
inline void i8_tile(const int8_t* q, int64_t Kp, const float* xs, const int32_t* /*qsum*/, const uint8_t* w, float* out,
                    const char* /*next*/, int64_t /*lines*/) {
  const int64_t G = Kp / I8_GROUP;
  const int8_t* sw = reinterpret_cast<const int8_t*>(w);
  for (int m = 0; m < MR; ++m) {
    float f[I8_TILE] = {};
    for (int64_t g = 0; g < G; ++g) {
      int32_t a[I8_TILE] = {};
      for (int64_t k = g * I8_GROUP; k < (g + 1) * I8_GROUP; k += 4)
        for (int64_t o = 0; o < I8_TILE; ++o)
          for (int64_t e = 0; e < 4; ++e) a[o] += int32_t(q[m * Kp + k + e]) * int32_t(sw[(k / 4) * I8_TILE * 4 + o * 4 + e]);
      for (int64_t o = 0; o < I8_TILE; ++o) f[o] = std::fma(static_cast<float>(a[o]), xs[m * G + g], f[o]);
    }
    std::memcpy(out + m * I8_TILE, f, sizeof(f));
  }
}
#endif

std::atomic<int64_t> i8_calls_made{0};    // products run (tests count them)

inline void i8_group(int64_t rows, const int8_t* q, int64_t Kp, const float* xs, const int32_t* qsum,
                     const uint8_t* w, float* out, const char* next, int64_t lines) {
  switch (rows) {        // rows <= I8_ROWS (a switch: a chain of templates choosing the width cost a one-row product
                         // ~15 % on an AMD EPYC Zen 5)
    case 1: i8_tile<1>(q, Kp, xs, qsum, w, out, next, lines); break;
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
    case 2: i8_tile<2>(q, Kp, xs, qsum, w, out, next, lines); break;
    case 3: i8_tile<3>(q, Kp, xs, qsum, w, out, next, lines); break;
    default: i8_tile<4>(q, Kp, xs, qsum, w, out, next, lines); break;
#else
    default: i8_tile<1>(q, Kp, xs, qsum, w, out, next, lines); break;
#endif
  }
}

// One group's inputs to int8 (kernels.W8A8Linear's arithmetic), ``count`` <= I8_GROUP of them (zero past
// it): q = round(x * (127 / largest)), ties to even; returns the integers' sum. Eight at a time where the CPU has AVX2
// (the same products and the same rounding, so the same integers).
inline int32_t i8_ints(const float* x, int64_t count, float inv, int8_t* q) {
  int32_t sum = 0;
  int64_t k = 0;
#if defined(__AVX2__)
  if (count == I8_GROUP) {
    const __m256 scale = _mm256_set1_ps(inv);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i total = _mm256_setzero_si256();
    for (; k < I8_GROUP; k += 32) {
      __m256i v[4];
      for (int i = 0; i < 4; ++i) {       // _mm256_cvtps_epi32 rounds as the MXCSR says: to nearest, ties to even
        v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * i), scale));
        v[i] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, v[i]));
        total = _mm256_add_epi32(total, v[i]);
      }
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k),
                          _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    int32_t lanes_[8];
    std::memcpy(lanes_, &total, sizeof(lanes_));
    for (int i = 0; i < 8; ++i) sum += lanes_[i];
    return sum;
  }
#endif
  for (; k < I8_GROUP; ++k) {
    const float r = k < count ? std::nearbyint(x[k] * inv) : 0.f;
    const int32_t v = static_cast<int32_t>(std::max(-127.f, std::min(127.f, r)));
    q[k] = static_cast<int8_t>(v);
    sum += v;
  }
  return sum;
}

// One row's inputs to int8, group by group: the group's scale (its largest magnitude over 127), its integers (zero
// past K) and their sum. A group whose largest magnitude is 0 gets scale 0; one with an infinity or a NaN, NaN (so
// the row's outputs are NaN, as a float product's would be).
void i8_row(const float* x, int64_t K, int64_t Kp, int8_t* q, float* xs, int32_t* qsum) {
  for (int64_t g = 0, base = 0; base < Kp; ++g, base += I8_GROUP) {
    const int64_t count = std::max<int64_t>(0, std::min(K, base + I8_GROUP) - base);
    float big = 0.f;
    bool finite = true;
    int64_t k = 0;
#if defined(__AVX2__)
    if (count == I8_GROUP) {       // a max over magnitudes is exact in any order; NaN and infinity seen by a compare
      const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      const __m256 most = _mm256_set1_ps(std::numeric_limits<float>::max());
      __m256 top = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (; k < I8_GROUP; k += 8) {
        const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + base + k), magnitude);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, most, _CMP_NLE_UQ));   // not <= the largest float: inf or NaN
        top = _mm256_max_ps(top, v);
      }
      float lanes_[8];
      _mm256_storeu_ps(lanes_, top);
      for (int i = 0; i < 8; ++i) big = lanes_[i] > big ? lanes_[i] : big;
      finite = _mm256_movemask_ps(bad) == 0;
    }
#endif
    for (; k < count; ++k) {
      const float v = std::fabs(x[base + k]);
      finite &= v <= std::numeric_limits<float>::max();
      big = v > big ? v : big;
    }
    if (!(big > 0.f) || !finite) {
      std::memset(q + base, 0, I8_GROUP);
      xs[g] = finite ? 0.f : std::numeric_limits<float>::quiet_NaN();
      qsum[g] = 0;
    } else {
      xs[g] = big / 127.f;
      qsum[g] = i8_ints(x + base, count, 127.f / big, q + base);
    }
  }
}

// x [M, K] float32 (K <= Kp), w packed as above, ws [n] float32, bias [n] float32 or none -> [M, n] float32
at::Tensor i8_linear(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& ws_in,
                     const c10::optional<at::Tensor>& bias_in, int64_t n) {
  TORCH_CHECK(w_in.dim() == 4 && w_in.size(2) == I8_TILE && w_in.size(3) == 4 && w_in.element_size() == 1 &&
                  w_in.size(1) % (I8_GROUP / 4) == 0,
              "i8_linear's weights are bytes, packed [N / 48, K / 4, 48, 4] with K a multiple of 64");
  const int64_t tiles = w_in.size(0), Kp = w_in.size(1) * 4;
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) <= Kp && x_in.size(1) > Kp - I8_GROUP, "i8_linear takes x [M, K]");
  TORCH_CHECK(n > 0 && n <= tiles * I8_TILE && n > (tiles - 1) * I8_TILE, "i8_linear: n does not match the weights");
  const at::Tensor x = float32(x_in), w = w_in.contiguous(), ws = float32(ws_in);
  TORCH_CHECK(ws.numel() == n, "i8_linear: the weight scales have n values");
  const int64_t M = x.size(0), K = x.size(1), G = Kp / I8_GROUP;
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) bias = float32(*bias_in);
  TORCH_CHECK(!bias.defined() || bias.numel() == n, "i8_linear: the bias has n values");
  auto out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  i8_calls_made.fetch_add(1, std::memory_order_relaxed);
  std::vector<int8_t> q(static_cast<size_t>(M * Kp));
  std::vector<float> xs(static_cast<size_t>(M * G));
  std::vector<int32_t> qsum(static_cast<size_t>(M * G));
  const float* px = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    i8_row(px + m * K, K, Kp, q.data() + m * Kp, xs.data() + m * G, qsum.data() + m * G);
  const uint8_t* pw = static_cast<const uint8_t*>(w.data_ptr());
  const float* pws = ws.data_ptr<float>();
  const float* pb = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* py = out.data_ptr<float>();
  // Each tile's row groups ask for the next tile's cache lines as they go (into L2), each group its share, spread over
  // its steps: a tile is 27 KB at K = 576, so a worker's run of tiles crosses pages where the hardware's stream
  // prefetcher starts over, and the whole tile's compute hides the next one's reads.
  const int64_t tile_lines = Kp * I8_TILE / 64;
  const int64_t groups = (M + I8_ROWS - 1) / I8_ROWS;
  const int64_t share = (tile_lines + groups - 1) / groups;
  at::parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
    float sums[I8_ROWS * I8_TILE];      // the widest group i8_group builds
    for (int64_t t = lo; t < hi; ++t) {
      const uint8_t* wt = pw + t * Kp * I8_TILE;
      const char* next = t + 1 < hi ? reinterpret_cast<const char*>(wt + Kp * I8_TILE) : nullptr;
      const int64_t first = t * I8_TILE, outs = std::min<int64_t>(I8_TILE, n - first);
      for (int64_t m = 0, g = 0; m < M; ++g) {
        const int64_t rows = even_rows(M - m, I8_ROWS);
        const int64_t own = next ? std::max<int64_t>(0, std::min(share, tile_lines - g * share)) : 0;
        i8_group(rows, q.data() + m * Kp, Kp, xs.data() + m * G, qsum.data() + m * G, wt, sums,
                 next ? next + g * share * 64 : nullptr, own);
        for (int64_t r = 0; r < rows; ++r) {
          float* y = py + (m + r) * n + first;
          const float* s = sums + r * I8_TILE;
          for (int64_t o = 0; o < outs; ++o) {
            const float v = s[o] * pws[first + o];
            y[o] = pb ? v + pb[first + o] : v;
          }
        }
        m += rows;
      }
    }
  });
  return out;
}

// Whether this build multiplies byte pairs with AVX-512 VNNI, how many products have run, the rows one group holds.
std::vector<int64_t> i8_info(const at::Tensor& /*cpu: the dispatcher's key*/) {
  return {I8_DOT ? 1 : 0, i8_calls_made.load(), I8_ROWS};
}

// What this machine's cores do of i8_tile's inner step, in byte multiply-adds: every worker runs ``iters`` rounds of
// that step over independent accumulators (AVX-512 VNNI: I8_CHAINS ``vpdpbusd``, 64 byte pairs each; AVX2: one row's
// I8_AVX2_CHAINS sign, ``vpmaddubsw``, ``vpmaddwd`` and add, 32 byte pairs each, on weights kept opaque so that none
// of it is hoisted), registers only, and the call returns the byte multiply-adds done; the caller times it. The int8 product's floor under a wide forward is its multiply-adds at that
// rate (bench_cpu_table.py): on an AMD EPYC Zen 5 a 16-row forward's products ran at about the rate this gives.
// 0 where this build has neither path (its scalar loop has no floor worth stating).
constexpr int I8_CHAINS = 24;        // enough independent sums to cover the instruction's latency at two a cycle
constexpr int I8_AVX2_CHAINS = 6;    // one row's six accumulators, as i8_tile's AVX2 step has them (16 registers)
std::atomic<int64_t> i8_probe_sink{0};

int64_t i8_rounds(int64_t iters, int64_t seed) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
  __m512i acc[I8_CHAINS];
  for (int j = 0; j < I8_CHAINS; ++j) acc[j] = _mm512_set1_epi32(static_cast<int>(j + seed));
  const __m512i w = _mm512_set1_epi32(0x01020304 + static_cast<int>(seed)), x = _mm512_set1_epi32(0x01010101);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < I8_CHAINS; ++j) {
      acc[j] = _mm512_dpbusd_epi32(acc[j], w, x);
      __asm__("" : "+v"(acc[j]));                 // each sum a chain of its own, kept in its register
    }
  }
  int64_t s = 0;
  for (int j = 0; j < I8_CHAINS; ++j) s += _mm512_reduce_add_epi32(acc[j]);
  return s;
#elif defined(__AVX2__) && defined(__FMA__)
  // as i8_tile's step for one row: six weight registers, each signed by the row's inputs, multiplied by their
  // magnitudes, widened and added; the weights and inputs are opaque every round (the asm), so nothing is hoisted
  __m256i acc[I8_AVX2_CHAINS], w[I8_AVX2_CHAINS];
  for (int j = 0; j < I8_AVX2_CHAINS; ++j) {
    acc[j] = _mm256_set1_epi32(static_cast<int>(j + seed));
    w[j] = _mm256_set1_epi32(0x01fe0304 + static_cast<int>(j + seed));
  }
  __m256i x = _mm256_set1_epi32(0x01ff0101);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__("" : "+x"(x), "+x"(w[0]), "+x"(w[1]), "+x"(w[2]), "+x"(w[3]), "+x"(w[4]), "+x"(w[5]));
    const __m256i xa = _mm256_abs_epi8(x);
    for (int j = 0; j < I8_AVX2_CHAINS; ++j)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(w[j], x)), ones));
  }
  int64_t s = 0;
  for (int j = 0; j < I8_AVX2_CHAINS; ++j) s += _mm256_extract_epi32(acc[j], 0);
  return s;
#else
  return iters + seed;
#endif
}

double i8_probe(const at::Tensor& /*cpu: the dispatcher's key*/, int64_t iters) {
#if (defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
  const int64_t workers = std::max<int64_t>(1, at::get_num_threads());
  std::vector<int64_t> sink(static_cast<size_t>(workers), 0);
  at::parallel_for(0, workers, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) sink[static_cast<size_t>(t)] = i8_rounds(iters, t);   // kept: not optimised away
  });
  int64_t total = 0;
  for (int64_t v : sink) total ^= v;
  i8_probe_sink.store(total, std::memory_order_relaxed);        // the sums are used: the loops stay
  const double per = I8_DOT ? 64.0 * I8_CHAINS : 32.0 * I8_AVX2_CHAINS;
  return static_cast<double>(workers) * static_cast<double>(iters) * per;
#else
  (void)iters;
  return 0.0;
#endif
}

}  // namespace

TORCH_LIBRARY(decoding_attention, m) {
  m.def("half_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("scores(Tensor rows, Tensor keys_t, SymInt span) -> Tensor");
  m.def("values(Tensor weights, Tensor values, SymInt span) -> Tensor");   // normalized: the softmax's output
  m.def("move_rows(Tensor(a!)[] caches, Tensor src, int base) -> ()");
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("fma_probe(Tensor cpu, int iters, bool loads) -> float");
  m.def("half_width(int width) -> int", half_width);
  m.def("half_three(int set) -> int", half_three);
  m.def("half_calls(Tensor cpu) -> int[]");
  m.def("bf16_linear(Tensor x, Tensor w, Tensor? bias, int n) -> Tensor");
  m.def("bf16_info(Tensor cpu) -> int[]");
  m.def("i8_linear(Tensor x, Tensor w, Tensor ws, Tensor? bias, int n) -> Tensor");
  m.def("i8_info(Tensor cpu) -> int[]");
  m.def("i8_probe(Tensor cpu, int iters) -> float");
}

TORCH_LIBRARY_IMPL(decoding_attention, CPU, m) {
  m.impl("scores", attn_scores);
  m.impl("values", attn_values);
  m.impl("move_rows", move_rows);
  m.impl("argmax_rows", argmax_rows);
  m.impl("half_linear", half_linear);
  m.impl("fma_probe", fma_probe);
  m.impl("half_calls", half_calls);
  m.impl("bf16_linear", bf16_linear);
  m.impl("bf16_info", bf16_info);
  m.impl("i8_linear", i8_linear);
  m.impl("i8_info", i8_info);
  m.impl("i8_probe", i8_probe);
}
