// Runtime value -> template parameter dispatch of the kernels' host code:
//   PYG_DFGNN_DISPATCH_FLOAT(dtype, NAME, ...)  -> scalar_t (float/half/bf16)
//   PYG_DFGNN_DISPATCH_INDEX(dtype, NAME, ...)  -> index_t (int32_t/int64_t)
//   PYG_DFGNN_DISPATCH_KIND(kind, ...)          -> constexpr int KIND
//   PYG_DFGNN_DISPATCH_BOOL(flag, NAME, ...)    -> constexpr bool NAME
//   PYG_DFGNN_DISPATCH_FEAT(level, SCORE, WEIGHTS, DROPOUT, NAME, ...) ->
//     constexpr int NAME, a training-feature level (training_features.cuh);
//     level 1 (the edge score alone) only where the constexpr bool SCORE
//     allows, level 3 (score and weights) only where WEIGHTS does, level 4
//     (dropout alone) only where DROPOUT does, else 2
//   with_bound<MAX>(n, f)                       -> f(integral_constant B),
//     the compile-time bound 4, 8 or MAX of a runtime size n <= MAX
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>





#define PYG_DFGNN_DISPATCH_FLOAT(dtype, NAME, ...)                        \
  [&] {                                                                   \
    switch (dtype) {                                                      \
      case at::kFloat: {                                                  \
        using scalar_t = float;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kHalf: {                                                   \
        using scalar_t = at::Half;                                        \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kBFloat16: {                                               \
        using scalar_t = at::BFloat16;                                    \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, NAME, ": unsupported dtype ", dtype,           \
                    " (expected float32, float16 or bfloat16)");          \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_INDEX(dtype, NAME, ...)                        \
  [&] {                                                                   \
    switch (dtype) {                                                      \
      case at::kInt: {                                                    \
        using index_t = int32_t;                                          \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case at::kLong: {                                                   \
        using index_t = int64_t;                                          \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, NAME, ": index dtype must be int32 or int64 "  \
                    "(got ", dtype, ")");                                 \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_KIND(kind, ...)                                \
  [&] {                                                                   \
    switch (kind) {                                                       \
      case 0: {                                                           \
        constexpr int KIND = 0;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case 1: {                                                           \
        constexpr int KIND = 1;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      case 2: {                                                           \
        constexpr int KIND = 2;                                           \
        return __VA_ARGS__();                                             \
      }                                                                   \
      default:                                                            \
        TORCH_CHECK(false, "unknown score kind ", kind,                   \
                    " (0 = dot, 1 = add, 2 = gatv2)");                    \
    }                                                                     \
  }()

#define PYG_DFGNN_DISPATCH_BOOL(flag, NAME, ...) \
  [&] {                                          \
    if (flag) {                                  \
      constexpr bool NAME = true;                \
      return __VA_ARGS__();                      \
    } else {                                     \
      constexpr bool NAME = false;               \
      return __VA_ARGS__();                      \
    }                                            \
  }()

// One level of PYG_DFGNN_DISPATCH_FEAT: where the constexpr bool HAS allows
// level L and the runtime level is L, the body with NAME = L.
#define PYG_DFGNN_FEAT_CASE(level, HAS, L, NAME, ...) \
  if constexpr (HAS) {                                \
    if ((level) == (L)) {                             \
      constexpr int NAME = (L);                       \
      return __VA_ARGS__();                           \
    }                                                 \
  }

#define PYG_DFGNN_DISPATCH_FEAT(level, SCORE, WEIGHTS, DROPOUT, NAME, ...) \
  [&] {                                                                    \
    PYG_DFGNN_FEAT_CASE(level, true, 0, NAME, __VA_ARGS__)                 \
    PYG_DFGNN_FEAT_CASE(level, SCORE, 1, NAME, __VA_ARGS__)                \
    PYG_DFGNN_FEAT_CASE(level, WEIGHTS, 3, NAME, __VA_ARGS__)              \
    PYG_DFGNN_FEAT_CASE(level, DROPOUT, 4, NAME, __VA_ARGS__)              \
    constexpr int NAME = 2;                                                \
    return __VA_ARGS__();                                                  \
  }()

namespace pyg_dfgnn {

// The bound of per-thread register arrays sized by a runtime n <= MAX
// (heads, edge attribute width): 4, 8 or MAX, each one instantiation.
template <int MAX, typename F>
void with_bound(int64_t n, F&& f) {
  if (n <= 4)
    f(std::integral_constant<int, 4>{});
  else if (n <= 8)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, MAX>{});
}

}  // namespace pyg_dfgnn
