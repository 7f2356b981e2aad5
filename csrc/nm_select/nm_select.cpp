// N:M group selection on the CPU (paper sec. 3.3): in every group of m consecutive costs of a row,
// the m-n cheapest (ties: lower index first) are marked for pruning and summed into the group's
// cost. Each element's rank in its group is counted pairwise (m is small), which is exactly the
// stable order of the PyTorch reference. Groups are spread over threads with at::parallel_for.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <tuple>

namespace surgeon {

std::tuple<at::Tensor, at::Tensor> nm_select_cpu(const at::Tensor& costs, int64_t n, int64_t m) {
  TORCH_CHECK(costs.dim() == 2, "nm_select: costs must be 2-D [R, C]");
  TORCH_CHECK(0 < n && n < m, "nm_select: needs 0 < n < m, got n=", n, ", m=", m);
  TORCH_CHECK(costs.size(1) % m == 0, "nm_select: m=", m, " does not divide the ", costs.size(1), " columns");
  const at::Tensor values = costs.contiguous();
  const int64_t rows = values.size(0), cols = values.size(1), per_row = cols / m, prune = m - n;
  at::Tensor group_costs = at::empty({rows, per_row}, values.options());
  at::Tensor mask = at::empty({rows, cols}, values.options().dtype(at::kBool));
  bool* chosen = mask.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "nm_select", [&] {
    const scalar_t* v = values.data_ptr<scalar_t>();
    scalar_t* sums = group_costs.data_ptr<scalar_t>();
    at::parallel_for(0, rows * per_row, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const scalar_t* group = v + g * m;
        scalar_t sum = 0;
        for (int64_t i = 0; i < m; ++i) {
          int64_t rank = 0;
          for (int64_t j = 0; j < m; ++j)
            rank += (group[j] < group[i]) || (group[j] == group[i] && j < i);
          const bool pruned = rank < prune;
          chosen[g * m + i] = pruned;
          if (pruned) sum += group[i];
        }
        sums[g] = sum;
      }
    });
  });
  return {group_costs, mask};
}

TORCH_LIBRARY_FRAGMENT(surgeon, m) { m.def("nm_select(Tensor costs, int n, int m) -> (Tensor, Tensor)"); }

TORCH_LIBRARY_IMPL(surgeon, CPU, m) { m.impl("nm_select", &nm_select_cpu); }

}  // namespace surgeon
