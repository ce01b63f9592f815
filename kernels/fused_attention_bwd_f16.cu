// Half instantiation of the fused backward (see bwd_common.cuh); a
// translation unit of its own so the dtypes compile in parallel.
#include "bwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace bwd {
template void run_bwd<at::Half>(Args&);
template void run_tc_bwd<at::Half>(Args&);
}  // namespace bwd
}  // namespace pyg_dfgnn
