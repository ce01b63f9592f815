// Tensor-core window forward kernels for float (3xTF32, opt-in 1xTF32;
// own translation unit: the dtype x strategy units compile in parallel).
#include "fwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace fwd {
template void run_tc<float>(const Launch&);
}  // namespace fwd
}  // namespace pyg_dfgnn
