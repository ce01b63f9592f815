// BFloat16 instantiation of the fused backward (see fused_attention_bwd.cuh); a
// translation unit of its own so the dtypes compile in parallel.
#include "fused_attention_bwd.cuh"

namespace pyg_dfgnn {
namespace bwd {
template void run_bwd<at::BFloat16>(Args&);
}  // namespace bwd
}  // namespace pyg_dfgnn
