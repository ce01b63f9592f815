// The short-owner kernels of one kernel tree (the forward's rows_fwd_kernel,
// the backward's rows and cols passes; 'dot', no training features) as a
// small shared library of their own, each pass launched and timed alone on
// raw pointers: scripts/short-pass-ab.sh builds one per tree (~35 s, no
// torch library linked), scripts/short_pass_ab.py compares them in one
// process. WALK_PARAM: the tree's kernels take the WALK parameter (session
// 45 on); grid_mode 0 is then the kernel without the walk, else the walking
// one (older trees: one kernel, only the grid differs).
#include <cuda_runtime.h>

#include "bwd_short_kernel.cuh"
#include "fwd_rows_kernel.cuh"

using namespace pyg_dfgnn;

// Pass 2 (forward): ptr / idx the CSR, own_a q, nbr_a k, nbr_b v, grad_a
// out, drow lse. Pass 0 (rows): CSR; own_a q, own_b dO, nbr_a k, nbr_b v.
// Pass 1 (cols): CSC and perm; nbr_a q, nbr_b dO, ebuf / drow the rows
// pass's. All features [n, H, F] of the pass's dtype.
struct Ptrs {
  const int64_t* ptr;
  const int* idx;
  const int* perm;
  const void *own_a, *own_b, *nbr_a, *nbr_b;
  const float* lse;
  float* drow;
  float2* ebuf;
  void *grad_a, *grad_b;
  int64_t n_owner;
  int H, F;
  float scale;
};

#ifdef WALK_PARAM
#define KERNEL(name, ...) \
  (grid_mode == 0 ? name<__VA_ARGS__, false> : name<__VA_ARGS__, true>)
#else
#define KERNEL(name, ...) name<__VA_ARGS__>
#endif

// grid_mode 0: every virtual block; -1: the resident blocks (at most);
// k > 0: at most k blocks. One launch untimed, then `iters` timed.
template <typename Kernel, typename Args>
static int time_launch(Kernel kernel, const Args& a, int64_t n_owner,
                       int lanes, int threads, int grid_mode, int iters,
                       float* ms) {
  const int64_t blocks = short_blocks(n_owner, lanes, threads);
  int64_t grid = blocks;
  if (grid_mode != 0) {
    int per_sm = 0, sms = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                  0);
    const int64_t cap = grid_mode > 0 ? grid_mode : (int64_t)per_sm * sms;
    grid = blocks < cap ? blocks : cap;
  }
  if (grid <= 0) return 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  kernel<<<(unsigned)grid, threads>>>(a, lanes);
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i) kernel<<<(unsigned)grid, threads>>>(a, lanes);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float t = 0.f;
  cudaEventElapsedTime(&t, start, stop);
  *ms = iters > 0 ? t / iters : 0.f;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return (int)cudaGetLastError();
}

template <typename T, int NV>
static int run_fwd(const Ptrs& p, int grid_mode, int iters, float* ms) {
  constexpr int VW = Vec<T>::kWidth;
  fwd::FwdArgs<T, int> a{};
  a.rowptr = p.ptr;
  a.col = p.idx;
  a.q = (const T*)p.own_a;
  a.k = (const T*)p.nbr_a;
  a.v = (const T*)p.nbr_b;
  a.out = (T*)p.grad_a;
  a.lse = p.drow;
  a.n_dst = p.n_owner;
  a.H = p.H, a.D = p.F, a.F = p.F;
  a.scale = p.scale;
  auto kernel = KERNEL(fwd::rows_fwd_kernel, T, int, kDot, VW, NV, 0);
  return time_launch(kernel, a, p.n_owner,
                     short_lanes((int64_t)p.H * p.F, VW * NV), fwd::kThreads,
                     grid_mode, iters, ms);
}

template <typename T, bool COLS, int NV>
static int run_bwd(const Ptrs& p, int grid_mode, int iters, float* ms) {
  constexpr int VW = Vec<T>::kWidth;
  bwd::BwdArgs<T, int> a{};
  a.ptr = p.ptr;
  a.idx = p.idx;
  a.perm = p.perm;
  a.own_a = (const T*)p.own_a;
  a.own_b = (const T*)p.own_b;
  a.nbr_a = (const T*)p.nbr_a;
  a.nbr_b = (const T*)p.nbr_b;
  a.lse = p.lse;
  a.drow = p.drow;
  a.ebuf = p.ebuf;
  a.grad_a = (T*)p.grad_a;
  a.grad_b = (T*)p.grad_b;
  a.n_owner = p.n_owner;
  a.H = p.H, a.D = p.F, a.F = p.F;
  a.scale = p.scale;
  auto kernel =
      COLS ? KERNEL(bwd::short_cols_bwd_kernel, T, int, kDot, VW, NV, 0)
           : KERNEL(bwd::short_rows_bwd_kernel, T, int, kDot, VW, NV, 0);
  return time_launch(kernel, a, p.n_owner,
                     short_lanes((int64_t)p.H * p.F, VW * NV),
                     bwd::kShortThreads, grid_mode, iters, ms);
}

template <typename T>
static int run_pass(int pass, int nv, const Ptrs& p, int g, int it,
                    float* ms) {
  switch (pass) {
    case 2:
      if constexpr (sizeof(T) == 4)
        if (nv == 4) return run_fwd<T, 4>(p, g, it, ms);
      return nv == 2 ? run_fwd<T, 2>(p, g, it, ms) : run_fwd<T, 1>(p, g, it, ms);
    case 1:
      return nv == 4   ? run_bwd<T, true, 4>(p, g, it, ms)
             : nv == 2 ? run_bwd<T, true, 2>(p, g, it, ms)
                       : run_bwd<T, true, 1>(p, g, it, ms);
    default:
      return nv == 4   ? run_bwd<T, false, 4>(p, g, it, ms)
             : nv == 2 ? run_bwd<T, false, 2>(p, g, it, ms)
                       : run_bwd<T, false, 1>(p, g, it, ms);
  }
}

// pass: 0 rows, 1 cols, 2 forward; returns the CUDA error code.
extern "C" int launch(int pass, int bf16, int nv, const Ptrs* p,
                      int grid_mode, int iters, float* ms) {
  return bf16 ? run_pass<at::BFloat16>(pass, nv, *p, grid_mode, iters, ms)
              : run_pass<float>(pass, nv, *p, grid_mode, iters, ms);
}
