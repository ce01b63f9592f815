// Host: resident blocks per SM of a kernel (the occupancy query, asked once
// per kernel, launch shape and device).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

namespace pyg_dfgnn {

// Resident blocks per SM of `kernel` at `threads` and `bytes` of dynamic
// shared memory on the current device, asked once (the occupancy query
// costs a few us of host time per call).
template <typename Kernel>
int resident_blocks_per_sm(Kernel kernel, int threads, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> cache;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const auto key =
      std::make_tuple((const void*)kernel, threads, bytes, device);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, kernel, threads, bytes));
  cache.emplace(key, blocks);
  return blocks;
}

}  // namespace pyg_dfgnn
