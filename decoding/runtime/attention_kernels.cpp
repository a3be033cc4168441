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

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

constexpr int L = 16;                                   // floats per vector (AVX-512; two AVX2 registers)
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

// f(nv, i) over [0, n) in blocks of 4 vectors, then single vectors (nv: the block's vectors, a constant)
template <typename F>
inline void in_blocks(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) f(std::integral_constant<int, 4>{}, i);
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

}  // namespace

TORCH_LIBRARY(decoding_attention, m) {
  m.def("scores(Tensor rows, Tensor keys_t, SymInt span) -> Tensor");
  m.def("values(Tensor weights, Tensor values, SymInt span) -> Tensor");   // normalized: the softmax's output
  m.def("move_rows(Tensor(a!)[] caches, Tensor src, int base) -> ()");
  m.def("argmax_rows(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(decoding_attention, CPU, m) {
  m.impl("scores", attn_scores);
  m.impl("values", attn_values);
  m.impl("move_rows", move_rows);
  m.impl("argmax_rows", argmax_rows);
}
