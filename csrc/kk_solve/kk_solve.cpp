// K×K correlated-update solves on the CPU, gathered and solved chunk by chunk (paper eq. 4).
//
// The pruned weights of a layer are cut into chunks S_b = [offsets[b], offsets[b+1]) of the flat
// (rows, cols, w). Each chunk's system M_S[i, j] = G⁻¹[r_i, r_j]·A⁻¹[c_i, c_j] is gathered straight
// from the two inverse factors into a matrix of exactly its own size k_b × k_b (ragged chunks: no
// padding) and solved by Cholesky, u_S = M_S⁻¹ w_S. Chunks are spread over threads with
// at::parallel_for, each factorisation single-threaded. A chunk whose M_S is not numerically
// positive definite is flagged in `failed` and left zero in u (the caller solves it by the eigen
// path).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <tuple>

namespace surgeon {

std::tuple<at::Tensor, at::Tensor> kk_solve_cpu(const at::Tensor& G_inv, const at::Tensor& A_inv,
                                                const at::Tensor& rows, const at::Tensor& cols,
                                                const at::Tensor& w, const at::Tensor& offsets) {
  TORCH_CHECK(G_inv.dim() == 2 && G_inv.size(0) == G_inv.size(1), "kk_solve: G_inv must be square");
  TORCH_CHECK(A_inv.dim() == 2 && A_inv.size(0) == A_inv.size(1), "kk_solve: A_inv must be square");
  TORCH_CHECK(G_inv.scalar_type() == A_inv.scalar_type() && G_inv.scalar_type() == w.scalar_type(),
              "kk_solve: G_inv, A_inv and w must share one dtype");
  TORCH_CHECK(rows.scalar_type() == at::kLong && cols.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong,
              "kk_solve: rows, cols and offsets must be int64");
  TORCH_CHECK(rows.dim() == 1 && rows.sizes() == cols.sizes() && rows.sizes() == w.sizes(),
              "kk_solve: rows, cols and w must be 1-D of one length");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1, "kk_solve: offsets must be 1-D [chunks + 1]");
  const at::Tensor off = offsets.contiguous(), r = rows.contiguous(), c = cols.contiguous();
  const int64_t chunks = off.size(0) - 1, total = r.size(0);
  const int64_t* o = off.data_ptr<int64_t>();
  TORCH_CHECK(o[0] == 0 && o[chunks] == total, "kk_solve: offsets must run from 0 to the number of weights");
  for (int64_t b = 0; b < chunks; ++b) TORCH_CHECK(o[b] <= o[b + 1], "kk_solve: offsets must not decrease");
  if (total > 0) {
    TORCH_CHECK(r.min().item<int64_t>() >= 0 && r.max().item<int64_t>() < G_inv.size(0), "kk_solve: a row is out of range");
    TORCH_CHECK(c.min().item<int64_t>() >= 0 && c.max().item<int64_t>() < A_inv.size(0), "kk_solve: a column is out of range");
  }
  const at::Tensor G = G_inv.contiguous(), A = A_inv.contiguous(), rhs = w.contiguous();
  at::Tensor u = at::zeros_like(rhs);
  at::Tensor failed = at::zeros({chunks}, off.options().dtype(at::kBool));
  const int64_t* ri = r.data_ptr<int64_t>();
  const int64_t* ci = c.data_ptr<int64_t>();
  bool* flag = failed.data_ptr<bool>();
  const int64_t ng = G.size(0), na = A.size(0);
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "kk_solve", [&] {
    const scalar_t* g = G.data_ptr<scalar_t>();
    const scalar_t* a = A.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t start = o[b], k = o[b + 1] - o[b];
        if (k == 0) continue;
        at::Tensor M = at::empty({k, k}, G.options());
        scalar_t* m = M.data_ptr<scalar_t>();
        for (int64_t i = 0; i < k; ++i) {
          const scalar_t* grow = g + ri[start + i] * ng;
          const scalar_t* arow = a + ci[start + i] * na;
          for (int64_t j = 0; j < k; ++j) m[i * k + j] = grow[ri[start + j]] * arow[ci[start + j]];
        }
        auto [L, info] = at::linalg_cholesky_ex(M);
        if (info.item<int>() != 0) {
          flag[b] = true;
          continue;
        }
        u.narrow(0, start, k).copy_(at::cholesky_solve(rhs.narrow(0, start, k).unsqueeze(1), L).squeeze(1));
      }
    });
  });
  return {u, failed};
}

TORCH_LIBRARY_FRAGMENT(surgeon, m) {
  m.def("kk_solve(Tensor G_inv, Tensor A_inv, Tensor rows, Tensor cols, Tensor w, Tensor offsets) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(surgeon, CPU, m) { m.impl("kk_solve", &kk_solve_cpu); }

}  // namespace surgeon
