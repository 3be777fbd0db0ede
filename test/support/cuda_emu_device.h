// The device side of the CUDA host emulator (cuda_emu.h): what a kernel rendered by
// codegen/cuda needs from CUDA, for the host compiler. It is force-included (-include)
// before the rendered source, which is compiled unchanged except for one guard: with
// TCAP_CUDA_HOST_EMULATION the prelude's two inline-PTX half conversions come from here.
//
// Plain C++17 and the C library only (no LibTorch, not even <cmath>): it is compiled once
// per kernel, so it is kept cheap to parse.
//
// Threads are fibers run by cuda_emu.cpp, which owns their state (reached through the
// tcap_emu_api it binds into each kernel library); __syncthreads and the warp shuffles
// switch fibers there. __shared__ variables are function statics: the emulator runs one
// block at a time on one OS thread and never relies on their initial values (CUDA does
// not define them either).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

// The C library's math functions the renderer calls (declared here rather than through
// <cmath>, whose parsing was most of each kernel's compile time).
extern "C" {
#define TCAP_EMU_MATH(name) float name##f(float); double name(double);
TCAP_EMU_MATH(fabs) TCAP_EMU_MATH(exp) TCAP_EMU_MATH(log) TCAP_EMU_MATH(log1p) TCAP_EMU_MATH(expm1)
TCAP_EMU_MATH(sin) TCAP_EMU_MATH(cos) TCAP_EMU_MATH(tan) TCAP_EMU_MATH(tanh) TCAP_EMU_MATH(erf)
TCAP_EMU_MATH(sqrt) TCAP_EMU_MATH(floor) TCAP_EMU_MATH(ceil) TCAP_EMU_MATH(rint) TCAP_EMU_MATH(trunc)
TCAP_EMU_MATH(nearbyint)
#undef TCAP_EMU_MATH
float powf(float, float);
double pow(double, double);
float fmaf(float, float, float);
double fma(double, double, double);
}
inline bool signbit(float x) { return __builtin_signbit(x) != 0; }
inline bool signbit(double x) { return __builtin_signbit(x) != 0; }

#define TCAP_CUDA_HOST_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct tcap_emu_dim3 {
  unsigned int x, y, z;
};
struct tcap_emu_thread {
  tcap_emu_dim3 thread_idx, block_idx, block_dim, grid_dim;
};

inline float __uint_as_float(unsigned int u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
inline double __longlong_as_double(long long u) {
  double d;
  __builtin_memcpy(&d, &u, sizeof d);
  return d;
}

// cvt.rzi.sat: truncate, saturate to the destination range, NaN -> 0.
template <typename I, typename F>
inline I tcap_emu_cvt_rzi(F x) {
  if (x != x) return 0;
  const double t = trunc(static_cast<double>(x));
  constexpr double lo = sizeof(I) == 8 ? -9223372036854775808.0 : -2147483648.0;
  constexpr double past = sizeof(I) == 8 ? 9223372036854775808.0 : 2147483648.0;  // first value above the range
  if (t <= lo) return sizeof(I) == 8 ? static_cast<I>(INT64_MIN) : static_cast<I>(INT32_MIN);
  if (t >= past) return sizeof(I) == 8 ? static_cast<I>(INT64_MAX) : static_cast<I>(INT32_MAX);
  return static_cast<I>(t);
}
inline int __float2int_rz(float x) { return tcap_emu_cvt_rzi<int>(x); }
inline int __double2int_rz(double x) { return tcap_emu_cvt_rzi<int>(x); }
inline long long __float2ll_rz(float x) { return tcap_emu_cvt_rzi<long long>(x); }
inline long long __double2ll_rz(double x) { return tcap_emu_cvt_rzi<long long>(x); }

// IEEE half <-> float, round to nearest even (what cvt.rn.f16.f32 / cvt.f32.f16 do).
inline float tcap_f16_load(unsigned short h) {
  const unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  unsigned int u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: man * 2^-24
    const float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  return __uint_as_float(u);
}
inline unsigned short tcap_f16_bits(float f) {
  const unsigned int u = __float_as_uint(f);
  const unsigned short sign = static_cast<unsigned short>((u >> 16) & 0x8000u);
  const unsigned int a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<unsigned short>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<unsigned short>(sign | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {
    // Subnormal or zero in half: scale to units of 2^-24 and round to nearest even.
    const float x = __uint_as_float(a) * 16777216.0f;  // exact (power of two)
    return static_cast<unsigned short>(sign | static_cast<unsigned short>(nearbyintf(x)));
  }
  // Normal: drop 13 mantissa bits with round to nearest even.
  const unsigned int r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<unsigned short>(sign | ((r - 0x38000000u) >> 13));
}


// The host side's entry points, handed over once per kernel library by tcap_emu_bind.
struct tcap_emu_api {
  tcap_emu_thread* const* current;  // the running fiber's coordinates
  void (*syncthreads)();
  // Exchanges `bytes` bytes of *value with lane (lane ^ lane_mask) of the calling warp.
  void (*shfl_xor)(void* value, int bytes, int lane_mask, unsigned int mask);
  // Runs the whole grid of kernel `slot`; `call` runs one thread. `numbers`: the kernel's
  // numbers read at launch (Note [CUDA sizes at launch]), or null.
  void (*launch)(void* slot, void (*call)(void* const* args, int vec_ok), void* const* args, const int64_t* numbers);
};
static const tcap_emu_api* tcap_emu = nullptr;

#define threadIdx ((*tcap_emu->current)->thread_idx)
#define blockIdx ((*tcap_emu->current)->block_idx)
#define blockDim ((*tcap_emu->current)->block_dim)
#define gridDim ((*tcap_emu->current)->grid_dim)
#define __syncthreads() tcap_emu->syncthreads()

// One block runs at a time and fibers switch only at barriers and shuffles, so atomics are
// plain read-modify-writes and fences have nothing to order.
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = old + v;
  return old;
}
inline void __threadfence() {}

template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
  tcap_emu->shfl_xor(&v, static_cast<int>(sizeof v), lane_mask, mask);
  return v;
}

// Calls a kernel `f(T0* b0, ..., int vec_ok)` with the buffer pointers of `args` (a
// parameter's number, or the numbers read at launch, read from its address: Note [Kernel
// parameters], Note [CUDA sizes at launch]).
template <typename P>
inline P tcap_emu_arg(void* const* args, std::size_t i, int vec_ok) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(args[i]);
  } else if constexpr (std::is_floating_point_v<P> || std::is_class_v<P>) {  // args[i] is its address
    return *static_cast<const P*>(args[i]);
  } else {
    return vec_ok;
  }
}
template <typename... P, std::size_t... I>
inline void tcap_emu_invoke_impl(void (*f)(P...), void* const* args, int vec_ok, std::index_sequence<I...>) {
  f(tcap_emu_arg<P>(args, I, vec_ok)...);
}
template <typename... P>
inline void tcap_emu_invoke(void (*f)(P...), void* const* args, int vec_ok) {
  tcap_emu_invoke_impl(f, args, vec_ok, std::index_sequence_for<P...>{});
}
