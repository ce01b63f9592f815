// BFloat16 instantiation of the fused backward (see bwd_common.cuh); a
// translation unit of its own so the dtypes compile in parallel.
#include "bwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace bwd {
template void run_bwd<at::BFloat16>(Args&);
template void run_tc_bwd<at::BFloat16>(Args&);
}  // namespace bwd
}  // namespace pyg_dfgnn
