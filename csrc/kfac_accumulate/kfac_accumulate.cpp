// Kronecker-factor accumulation on the CPU: out += scale * [x, 1]^T [x, 1]  (paper eq. 6).
//
// x: [N, C] (float32, bfloat16 or float16). out: the packed symmetric factor of width
// C(+1) (surgeon_kernels/symmetric.py): its upper-triangle tiles [T, t, t], row-major over the
// upper triangle, diagonal tiles whole. x is converted once to float32, padded to whole tiles
// (the bias column, constant 1, lands in that copy, which the conversion makes anyway). The work
// is cut into strips of up to kStrip consecutive tiles of one tile row: one GEMM
// x[:, row i]^T x[:, strip] each, added to the strip's tiles (consecutive in storage). Strips
// are spread over threads with at::parallel_for (OpenMP), each GEMM single-threaded.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

namespace surgeon {

namespace {
constexpr int64_t kStrip = 4;  // tiles per GEMM (bench/RESULTS.md: wider GEMMs, yet enough tasks)
}

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
  at::Tensor xf = at::empty({n, nb * t}, x.options().dtype(at::kFloat));
  xf.narrow(1, 0, c).copy_(x);
  xf.narrow(1, c, nb * t - c).zero_();  // the padding (only)
  if (bias) xf.select(1, c).fill_(1.0);
  struct Strip {
    int64_t row, col, count, first;  // tile row, first tile column, tiles, storage index of the first
  };
  std::vector<Strip> strips;
  for (int64_t i = 0, first = 0; i < nb; first += nb - i, ++i)
    for (int64_t j = i; j < nb; j += kStrip) strips.push_back({i, j, std::min(kStrip, nb - j), first + j - i});
  at::parallel_for(0, static_cast<int64_t>(strips.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const Strip& strip = strips[s];
      at::Tensor block = at::mm(xf.narrow(1, strip.row * t, t).t(), xf.narrow(1, strip.col * t, strip.count * t));
      out.narrow(0, strip.first, strip.count).add_(block.view({t, strip.count, t}).permute({1, 0, 2}), scale);
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
