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

#include <cstring>

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
inline void score_block(const float* const* q, const float* kt, int64_t d, int64_t cap, float* const* out) {
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
    for (int v = 0; v < NV; ++v) store(out[r] + v * L, acc[r][v]);
}

template <int R>
void score_rows(const float* const* q, const float* kt, int64_t d, int64_t cap, int64_t span, float* const* out) {
  int64_t j = 0;
  for (; j + 4 * L <= span; j += 4 * L) {
    float* o[R];
    for (int r = 0; r < R; ++r) o[r] = out[r] + j;
    score_block<R, 4>(q, kt + j, d, cap, o);
  }
  for (; j < span; j += L) {
    float* o[R];
    for (int r = 0; r < R; ++r) o[r] = out[r] + j;
    score_block<R, 1>(q, kt + j, d, cap, o);
  }
}

at::Tensor attn_scores(const at::Tensor& rows_in, const at::Tensor& keys_in, int64_t span) {
  // rows [B, heads * d] (rotated, scaled), keys_t [kv, d, capacity] -> [B, kv, rep, span]
  TORCH_CHECK(rows_in.scalar_type() == at::kFloat && keys_in.scalar_type() == at::kFloat, "float32 only");
  const at::Tensor rows = rows_in.contiguous(), keys_t = keys_in.contiguous();
  TORCH_CHECK(span % L == 0 && span <= keys_t.size(2), "span must be a multiple of 16 within the cache");
  const int64_t b = rows.size(0), kv = keys_t.size(0), d = keys_t.size(1), cap = keys_t.size(2);
  const int64_t heads = rows.size(1) / d, rep = heads / kv;
  auto out = at::empty({b, kv, rep, span}, rows.options());
  const float* qp = rows.data_ptr<float>();
  const float* kp = keys_t.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, b * kv, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t i = t / kv, g = t % kv;
      const float* kt = kp + g * d * cap;
      int64_t r = 0;
      for (; r + 2 <= rep; r += 2) {
        const float* q[2] = {qp + i * heads * d + (g * rep + r) * d, qp + i * heads * d + (g * rep + r + 1) * d};
        float* o[2] = {op + ((i * kv + g) * rep + r) * span, op + ((i * kv + g) * rep + r + 1) * span};
        score_rows<2>(q, kt, d, cap, span, o);
      }
      for (; r < rep; ++r) {
        const float* q[1] = {qp + i * heads * d + (g * rep + r) * d};
        float* o[1] = {op + ((i * kv + g) * rep + r) * span};
        score_rows<1>(q, kt, d, cap, span, o);
      }
    }
  });
  return out;
}

// out[b, g, r, :] = (sum_j weights[b, g, r, j] * values[g, j, :]) / (sum_j weights[b, g, r, j]), both sums over
// j = 0, 1, ... span - 1 in order (the denominator one float per row, beside the vectors)
template <int R, int NV>
inline void value_block(const float* const* w, const float* v, int64_t d, int64_t span, float* const* out) {
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
    for (int u = 0; u < NV; ++u) store(out[r] + u * L, acc[r][u] / inv);
  }
}

template <int R>
void value_rows(const float* const* w, const float* v, int64_t d, int64_t span, float* const* out) {
  int64_t e = 0;
  for (; e + 4 * L <= d; e += 4 * L) {
    float* o[R];
    for (int r = 0; r < R; ++r) o[r] = out[r] + e;
    value_block<R, 4>(w, v + e, d, span, o);
  }
  for (; e < d; e += L) {
    float* o[R];
    for (int r = 0; r < R; ++r) o[r] = out[r] + e;
    value_block<R, 1>(w, v + e, d, span, o);
  }
}

at::Tensor attn_values(const at::Tensor& weights_in, const at::Tensor& values_in, int64_t span) {
  // weights [B, kv, rep, span], values [1, kv, capacity, d] -> [B, kv, rep, d]
  TORCH_CHECK(weights_in.scalar_type() == at::kFloat && values_in.scalar_type() == at::kFloat, "float32 only");
  const at::Tensor weights = weights_in.contiguous(), values = values_in.contiguous();
  const int64_t b = weights.size(0), kv = weights.size(1), rep = weights.size(2);
  const int64_t cap = values.size(2), d = values.size(3);
  TORCH_CHECK(d % L == 0 && weights.size(3) == span && span <= cap, "head size a multiple of 16, span within the cache");
  auto out = at::empty({b, kv, rep, d}, weights.options());
  const float* wp = weights.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, b * kv, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t i = t / kv, g = t % kv;
      const float* v = vp + g * cap * d;
      int64_t r = 0;
      for (; r + 2 <= rep; r += 2) {
        const float* w[2] = {wp + ((i * kv + g) * rep + r) * span, wp + ((i * kv + g) * rep + r + 1) * span};
        float* o[2] = {op + ((i * kv + g) * rep + r) * d, op + ((i * kv + g) * rep + r + 1) * d};
        value_rows<2>(w, v, d, span, o);
      }
      for (; r < rep; ++r) {
        const float* w[1] = {wp + ((i * kv + g) * rep + r) * span};
        float* o[1] = {op + ((i * kv + g) * rep + r) * d};
        value_rows<1>(w, v, d, span, o);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(decoding_attention, m) {
  m.def("scores(Tensor rows, Tensor keys_t, SymInt span) -> Tensor");
  m.def("values(Tensor weights, Tensor values, SymInt span) -> Tensor");   // normalized: the softmax's output
}

TORCH_LIBRARY_IMPL(decoding_attention, CPU, m) {
  m.impl("scores", attn_scores);
  m.impl("values", attn_values);
}
