// Half x 'add' instantiation of the fused backward (see bwd_common.cuh);
// a translation unit of its own so the nine dtype x kind units compile in
// parallel.
#include "bwd_launch_template.cuh"

namespace pyg_dfgnn {
namespace bwd {
template void run_bwd_kind<at::Half, kAdd>(Args&, int, bool);
}  // namespace bwd
}  // namespace pyg_dfgnn
