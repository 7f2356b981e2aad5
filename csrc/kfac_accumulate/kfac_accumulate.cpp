// Kronecker-factor accumulation on the CPU: out += scale * [x, 1]^T [x, 1]  (paper eq. 6).
//
// x: [N, C] (float32, bfloat16 or float16), out: [C(+1), C(+1)] float32, symmetric.
// The output is cut into square tiles; only tiles on or above the diagonal are computed, each
// as one BLAS product of two column slabs of x (converted to float32 once), and written to its
// mirrored place as well. Tiles are spread over threads with at::parallel_for
// (OpenMP). The bias column (constant 1) is added from column sums, never materialised.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

namespace surgeon {

namespace {
constexpr int64_t kTile = 128;
}

void kfac_accumulate_cpu(at::Tensor out, const at::Tensor& x, double scale, bool bias) {
  TORCH_CHECK(x.dim() == 2, "kfac_accumulate: x must be 2-D [tokens, features], got ", x.dim(), "-D");
  TORCH_CHECK(out.scalar_type() == at::kFloat, "kfac_accumulate: out must be float32");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf,
              "kfac_accumulate: x must be float32, bfloat16 or float16");
  const int64_t n = x.size(0), c = x.size(1), width = c + (bias ? 1 : 0);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == width && out.size(1) == width,
              "kfac_accumulate: out must be [", width, ", ", width, "]");
  TORCH_CHECK(out.is_contiguous(), "kfac_accumulate: out must be contiguous");
  if (n == 0) return;
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t tiles = (c + kTile - 1) / kTile;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < tiles; ++i)
    for (int64_t j = i; j < tiles; ++j) pairs.emplace_back(i, j);
  at::Tensor full = at::empty({c, c}, out.options());
  at::parallel_for(0, static_cast<int64_t>(pairs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i0 = pairs[p].first * kTile, j0 = pairs[p].second * kTile;
      const int64_t ni = std::min(kTile, c - i0), nj = std::min(kTile, c - j0);
      at::Tensor tile = at::mm(xf.narrow(1, i0, ni).t(), xf.narrow(1, j0, nj));
      full.narrow(0, i0, ni).narrow(1, j0, nj).copy_(tile);
      if (i0 != j0) full.narrow(0, j0, nj).narrow(1, i0, ni).copy_(tile.t());
    }
  });
  out.narrow(0, 0, c).narrow(1, 0, c).add_(full, scale);
  if (bias) {
    at::Tensor sums = xf.sum(0);
    out.narrow(0, c, 1).squeeze(0).narrow(0, 0, c).add_(sums, scale);
    out.narrow(1, c, 1).squeeze(1).narrow(0, 0, c).add_(sums, scale);
    out.index_put_({c, c}, out.index({c, c}) + scale * static_cast<double>(n));
  }
}

TORCH_LIBRARY(surgeon, m) {
  m.def("kfac_accumulate(Tensor(a!) out, Tensor x, float scale, bool bias) -> ()");
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
