// Kronecker-factor accumulation on the CPU: outs[g] += scale * [xs[g], 1]^T [xs[g], 1] for every
// factor g of a group, in one parallel region (paper eq. 6).
//
// xs[g]: [N_g, C_g] (float32, bfloat16 or float16). outs[g]: the packed symmetric factor of width
// C_g(+1) (surgeon_kernels/symmetric.py): its upper-triangle tiles [T, t, t], row-major over the
// upper triangle, diagonal tiles whole. Each x is converted once to float32, padded to whole tiles
// (the bias column, constant 1, lands in that copy, which the conversion makes anyway), so every
// product and sum is float32 (bfloat16 GEMMs through oneDNN measured 1.9× faster here but return
// bfloat16 sums: bench/RESULTS.md, session 6). The work
// is cut into strips of up to kStrip consecutive tiles of one tile row: one GEMM
// x[:, row i]^T x[:, strip] each, added to the strip's tiles (consecutive in storage). The strips
// of all factors of the group are spread over threads together with at::parallel_for (OpenMP),
// each GEMM single-threaded, so small factors share the threads instead of each starting its own
// parallel region.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <vector>

namespace surgeon {

namespace {
constexpr int64_t kStrip = 4;  // tiles per GEMM (bench/RESULTS.md: wider GEMMs, yet enough tasks)

struct Strip {
  int64_t group, row, col, count, first;  // factor, tile row, first tile column, tiles, storage index of the first
};

// x as float32 [n, nb * t]: zero padding beyond its columns, and the constant-1 bias column.
at::Tensor padded_float(const at::Tensor& x, int64_t nb, int64_t t, bool bias) {
  const int64_t n = x.size(0), c = x.size(1);
  at::Tensor xf = at::empty({n, nb * t}, x.options().dtype(at::kFloat));
  xf.narrow(1, 0, c).copy_(x);
  xf.narrow(1, c, nb * t - c).zero_();  // the padding (only)
  if (bias) xf.select(1, c).fill_(1.0);
  return xf;
}
}  // namespace

void kfac_accumulate_cpu(at::TensorList outs, at::TensorList xs, double scale, c10::List<bool> bias) {
  TORCH_CHECK(outs.size() == xs.size() && xs.size() == bias.size(), "kfac_accumulate: ", outs.size(),
              " outs, ", xs.size(), " xs and ", bias.size(), " bias flags: one of each per factor");
  std::vector<at::Tensor> padded_xs(xs.size());
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
    const int64_t width = x.size(1) + (bias[g] ? 1 : 0), t = out.size(1), nb = (width + t - 1) / t;
    TORCH_CHECK(out.size(0) == nb * (nb + 1) / 2, "kfac_accumulate: ", out.size(0),
                " tiles do not pack a symmetric matrix of width ", width, " in tiles of ", t);
    if (x.size(0) == 0) continue;
    padded_xs[g] = padded_float(x, nb, t, bias[g]);
    for (int64_t i = 0, first = 0; i < nb; first += nb - i, ++i)
      for (int64_t j = i; j < nb; j += kStrip)
        strips.push_back({static_cast<int64_t>(g), i, j, std::min(kStrip, nb - j), first + j - i});
  }
  at::parallel_for(0, static_cast<int64_t>(strips.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const Strip& strip = strips[s];
      const at::Tensor& xf = padded_xs[strip.group];
      const int64_t t = outs[strip.group].size(1);
      at::Tensor block = at::mm(xf.narrow(1, strip.row * t, t).t(), xf.narrow(1, strip.col * t, strip.count * t));
      outs[strip.group].narrow(0, strip.first, strip.count).add_(block.view({t, strip.count, t}).permute({1, 0, 2}), scale);
    }
  });
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
