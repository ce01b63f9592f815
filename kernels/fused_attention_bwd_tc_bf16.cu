// BFloat16 instantiation of the tensor-core windows' backward
// (bwd_tc_kernel.cuh); a translation unit of its own.
#include "bwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace bwd {
template void run_tc_bwd<at::BFloat16>(Args&, bool);
}  // namespace bwd
}  // namespace pyg_dfgnn
