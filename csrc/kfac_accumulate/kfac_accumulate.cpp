// Kronecker-factor accumulation on the CPU: outs[g] += scale * [xs[g], 1]^T [xs[g], 1] for every
// factor g of a group, in one parallel region (paper eq. 6).
//
// xs[g]: [N_g, C_g] (float32, bfloat16 or float16). outs[g]: the packed symmetric factor of width
// C_g(+1) (surgeon_kernels/symmetric.py): its upper-triangle tiles [T, t, t], row-major over the
// upper triangle, diagonal tiles whole. float32 inputs are read in place (no padded copy: it
// measured 56-340 ms per 512-token SmolLM2 window, bench/RESULTS.md); bfloat16/float16 inputs are
// converted once to float32, so every product and sum is float32 (bfloat16 GEMMs through oneDNN
// measured 1.9× faster here but return bfloat16 sums: bench/RESULTS.md). The work is
// cut into strips of up to kStrip consecutive tiles of one tile row: one GEMM
// x[:, row i]^T x[:, strip] each (clipped at the last feature), added to the strip's tiles
// (consecutive in storage). The strips of all factors of the group are spread over threads
// together with at::parallel_for (OpenMP), each GEMM single-threaded, so small factors share the
// threads instead of each starting its own parallel region. The bias column (constant 1) is never
// materialised: its entries are the column sums Σ_n x_n and the token count, added afterwards.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace surgeon {

namespace {
constexpr int64_t kStrip = 4;  // tiles per GEMM (bench/RESULTS.md: wider GEMMs, yet enough tasks)

struct Strip {
  int64_t group, row, col, count, first;  // factor, tile row, first tile column, tiles, storage index of the first
};

// Storage index of the upper-triangle tile (i, j), i <= j, of nb tiles per row.
int64_t tile_index(int64_t nb, int64_t i, int64_t j) { return i * nb - i * (i - 1) / 2 + (j - i); }

// out += scale * [x, 1]^T [x, 1] restricted to the bias column c: Σ_n x_n in its rows above the
// diagonal (and, inside the diagonal tile, the mirrored row) and the token count at (c, c).
void add_bias_column(const at::Tensor& out, const at::Tensor& x, double scale) {
  const int64_t n = x.size(0), c = x.size(1), t = out.size(1), nb = (c + t) / t, jb = c / t, off = c % t;
  const at::Tensor sums = x.sum({0}, /*keepdim=*/false, at::kFloat).mul_(scale);
  for (int64_t i = 0; i <= jb; ++i) {
    const int64_t begin = i * t, len = std::min(t, c - begin);
    const at::Tensor tile = out.select(0, tile_index(nb, i, jb));
    if (len > 0) {
      tile.select(1, off).narrow(0, 0, len).add_(sums.narrow(0, begin, len));
      if (i == jb) tile.select(0, off).narrow(0, 0, len).add_(sums.narrow(0, begin, len));
    }
  }
  out.select(0, tile_index(nb, jb, jb)).select(0, off).select(0, off).add_(scale * static_cast<double>(n));
}
}  // namespace

void kfac_accumulate_cpu(at::TensorList outs, at::TensorList xs, double scale, c10::List<bool> bias) {
  TORCH_CHECK(outs.size() == xs.size() && xs.size() == bias.size(), "kfac_accumulate: ", outs.size(),
              " outs, ", xs.size(), " xs and ", bias.size(), " bias flags: one of each per factor");
  std::vector<at::Tensor> floats(xs.size());
  std::vector<Strip> strips;
  for (size_t g = 0; g < xs.size(); ++g) {
    const at::Tensor &out = outs[g], &x = xs[g];
    TORCH_CHECK(x.dim() == 2, "kfac_accumulate: x must be 2-D [tokens, features], got ", x.dim(), "-D");
    TORCH_CHECK(out.scalar_type() == at::kFloat, "kfac_accumulate: out must be float32");
    TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                    x.scalar_type() == at::kHalf,
                "kfac_accumulate: x must be float32, bfloat16 or float16");
    TORCH_CHECK(out.dim() == 3 && out.size(1) == out.size(2) && out.size(1) > 0,
                "kfac_accumulate: out must be packed tiles [T, t, t]");
    TORCH_CHECK(out.is_contiguous(), "kfac_accumulate: out must be contiguous");
    const int64_t c = x.size(1), width = c + (bias[g] ? 1 : 0), t = out.size(1), nb = (width + t - 1) / t;
    TORCH_CHECK(out.size(0) == nb * (nb + 1) / 2, "kfac_accumulate: ", out.size(0),
                " tiles do not pack a symmetric matrix of width ", width, " in tiles of ", t);
    if (x.size(0) == 0) continue;
    floats[g] = x.to(at::kFloat);  // x itself when float32
    const int64_t data_tiles = (c + t - 1) / t;  // tile rows/columns holding x's features (not only the bias)
    for (int64_t i = 0; i < data_tiles; ++i)
      for (int64_t j = i; j < data_tiles; j += kStrip)
        strips.push_back({static_cast<int64_t>(g), i, j, std::min(kStrip, data_tiles - j), tile_index(nb, i, j)});
  }
  at::parallel_for(0, static_cast<int64_t>(strips.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const Strip& strip = strips[s];
      const at::Tensor& xf = floats[strip.group];
      const at::Tensor& out = outs[strip.group];
      const int64_t c = xf.size(1), t = out.size(1);
      const int64_t rows = std::min(t, c - strip.row * t), cols = std::min(strip.count * t, c - strip.col * t);
      at::Tensor block = at::mm(xf.narrow(1, strip.row * t, rows).t(), xf.narrow(1, strip.col * t, cols));
      at::Tensor tiles = out.narrow(0, strip.first, strip.count);
      if (rows == t && cols == strip.count * t) {
        tiles.add_(block.view({t, strip.count, t}).permute({1, 0, 2}), scale);
        continue;
      }
      for (int64_t k = 0; k < strip.count; ++k) {
        const int64_t width = std::min(t, cols - k * t);
        tiles.select(0, k).narrow(0, 0, rows).narrow(1, 0, width).add_(block.narrow(1, k * t, width), scale);
      }
    }
  });
  for (size_t g = 0; g < xs.size(); ++g)
    if (bias[g] && xs[g].size(0) > 0) add_bias_column(outs[g], floats[g], scale);
}

TORCH_LIBRARY(surgeon, m) {
  m.def("kfac_accumulate(Tensor(a!)[] outs, Tensor[] xs, float scale, bool[] bias) -> ()");
}

TORCH_LIBRARY_IMPL(surgeon, CPU, m) { m.impl("kfac_accumulate", &kfac_accumulate_cpu); }

}  // namespace surgeon

extern "C" {
// An empty Python module, so that `import surgeon_kernels._C` loads the library and its ops.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}
