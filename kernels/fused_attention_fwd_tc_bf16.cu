// Tensor-core window forward kernels for BFloat16 (own translation unit:
// the dtype x strategy units compile in parallel).
#include "fwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace fwd {
template void run_tc<at::BFloat16>(const Launch&);
}  // namespace fwd
}  // namespace pyg_dfgnn
