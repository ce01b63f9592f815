// SMMF forward kernels for at::Half (own translation unit: the six
// dtype x strategy units compile in parallel).
#include "fwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace fwd {
template void run_smmf<at::Half>(const Launch&);
}  // namespace fwd
}  // namespace pyg_dfgnn
