// Kronecker-factor accumulation on the CPU: out += scale * [x, 1]^T [x, 1]  (paper eq. 6).
//
// x: [N, C] (float32, bfloat16 or float16). out: the packed symmetric factor of width
// C(+1) (surgeon_kernels/symmetric.py): its upper-triangle tiles [T, t, t], row-major over the
// upper triangle, diagonal tiles whole. Each stored tile is one BLAS product of two column slabs
// of x (converted to float32 once) added in place; tiles are spread over threads with
// at::parallel_for (OpenMP). The bias column (constant 1) is added from column sums, never
// materialised.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

namespace surgeon {

void kfac_accumulate_cpu(at::Tensor out, const at::Tensor& x, double scale, bool bias) {
  TORCH_CHECK(x.dim() == 2, "kfac_accumulate: x must be 2-D [tokens, features], got ", x.dim(), "-D");
  TORCH_CHECK(out.scalar_type() == at::kFloat, "kfac_accumulate: out must be float32");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                  x.scalar_type() == at::kHalf,
              "kfac_accumulate: x must be float32, bfloat16 or float16");
  TORCH_CHECK(out.dim() == 3 && out.size(1) == out.size(2) && out.size(1) > 0,
              "kfac_accumulate: out must be packed tiles [T, t, t]");
  TORCH_CHECK(out.is_contiguous(), "kfac_accumulate: out must be contiguous");
  const int64_t n = x.size(0), c = x.size(1), width = c + (bias ? 1 : 0), t = out.size(1);
  const int64_t nb = (width + t - 1) / t;
  TORCH_CHECK(out.size(0) == nb * (nb + 1) / 2, "kfac_accumulate: ", out.size(0),
              " tiles do not pack a symmetric matrix of width ", width, " in tiles of ", t);
  if (n == 0) return;
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor sums = bias ? xf.sum(0) : at::Tensor();
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = i; j < nb; ++j) pairs.emplace_back(i, j);
  at::parallel_for(0, static_cast<int64_t>(pairs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i0 = pairs[p].first * t, j0 = pairs[p].second * t;
      const int64_t ni = std::max<int64_t>(0, std::min(t, c - i0)), nj = std::max<int64_t>(0, std::min(t, c - j0));
      at::Tensor tile = out.select(0, p);
      if (ni > 0 && nj > 0)
        tile.narrow(0, 0, ni).narrow(1, 0, nj).addmm_(xf.narrow(1, i0, ni).t(), xf.narrow(1, j0, nj), 1.0, scale);
      if (bias && c >= j0 && c < j0 + t) {  // the bias column c lies in this tile's columns
        if (ni > 0) tile.select(1, c - j0).narrow(0, 0, ni).add_(sums.narrow(0, i0, ni), scale);
        if (i0 == j0) {  // diagonal tile: the bias row and the corner as well
          if (nj > 0) tile.select(0, c - i0).narrow(0, 0, nj).add_(sums.narrow(0, j0, nj), scale);
          tile.select(0, c - i0).select(0, c - j0).add_(scale * static_cast<double>(n));
        }
      }
    }
  });
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
