#include "worker/collectives/element_reduction.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "worker/collectives/half_float.h"

namespace tessera::worker {
namespace {

// ---------------------------------------------------------------------------------------------
// Element arithmetic, as PyTorch's Gloo backend computes on the CPU (gloo/math.h: the sum,
// product, max or min of two elements in their own type), so that a torch.distributed backend
// on this ring gives what users get from Gloo:
//
//   dtype               combined in        sum          product      max, min       average
//   float32, float64    float, double      a + b        a * b        NaN wins       sum / W
//   float16, bfloat16   float32, rounded back to 16 bits wherever a partial result is stored
//   int8, uint8,        the type itself,   a + b        a * b        exact          rejected
//   int32, int64        wrapping around (two's complement, mod 2^bits)
//   bool                logical            a or b       a and b      or, and        rejected
//
// Average divides once, when the last rank's elements are added (CheckCall rejects it for
// non-floating dtypes, as torch does). Max and min propagate NaN, like torch.maximum and
// torch.minimum, so a NaN gradient is not silently dropped: the one departure from Gloo, whose
// std::max keeps or drops a NaN depending on which operand it is.
//
// The vocabulary: a codec per dtype (how an element is loaded into the Value it is combined in,
// and stored back; the received side may be unaligned), Apply (one op on two Values), and
// CombineAs, the one loop over a segment; float32 has a vector fast path inside it.

// Elements of type T, combined as T.
template <typename T>
struct PlainCodec {
  using Value = T;
  static constexpr size_t kBytes = sizeof(T);
  static T Load(const uint8_t* p) {
    T value;
    std::memcpy(&value, p, kBytes);
    return value;
  }
  static void Store(uint8_t* p, T value) { std::memcpy(p, &value, kBytes); }
};

using Float32Codec = PlainCodec<float>;
using Float64Codec = PlainCodec<double>;

struct Float16Codec {
  using Value = float;
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, kBytes);
    return HalfToFloat(bits);
  }
  static void Store(uint8_t* p, float value) {
    const uint16_t bits = FloatToHalf(value);
    std::memcpy(p, &bits, kBytes);
  }
};

struct BFloat16Codec {
  using Value = float;
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, kBytes);
    return BFloat16ToFloat(bits);
  }
  static void Store(uint8_t* p, float value) {
    const uint16_t bits = FloatToBFloat16(value);
    std::memcpy(p, &bits, kBytes);
  }
};

// A byte holding 0 or 1 (torch.bool); any other byte reads as true, and results are 0 or 1.
struct BoolCodec {
  using Value = bool;
  static constexpr size_t kBytes = 1;
  static bool Load(const uint8_t* p) { return *p != 0; }
  static void Store(uint8_t* p, bool value) { *p = value ? 1 : 0; }
};

template <ReduceOp kOp, typename Value>
Value Apply(Value a, Value b) {
  if constexpr (std::is_floating_point_v<Value>) {
    if constexpr (kOp == ReduceOp::kMax) {
      return (a > b || a != a) ? a : b;
    } else if constexpr (kOp == ReduceOp::kMin) {
      return (a < b || a != a) ? a : b;
    } else if constexpr (kOp == ReduceOp::kProduct) {
      return a * b;
    } else {
      return a + b;  // sum; average divides once, at the end
    }
  } else if constexpr (std::is_same_v<Value, bool>) {
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kMax) {
      return a || b;
    } else {
      return a && b;  // product, min
    }
  } else {
    // Wrapping around, in unsigned arithmetic (signed overflow is undefined), at least as wide
    // as unsigned int so that narrow types are not promoted to int (whose products overflow).
    using Unsigned = std::common_type_t<std::make_unsigned_t<Value>, unsigned>;
    if constexpr (kOp == ReduceOp::kMax) {
      return a > b ? a : b;
    } else if constexpr (kOp == ReduceOp::kMin) {
      return a < b ? a : b;
    } else if constexpr (kOp == ReduceOp::kProduct) {
      return static_cast<Value>(static_cast<Unsigned>(a) * static_cast<Unsigned>(b));
    } else {
      return static_cast<Value>(static_cast<Unsigned>(a) + static_cast<Unsigned>(b));
    }
  }
}

// The float32 fast path of CombineAs: whole vectors of 8 elements, loaded and stored with
// memcpy (the bytes may be unaligned), each loaded before any is stored, so `out` may be
// `mine`. Elementwise the same arithmetic as Apply, so the results are bit-identical.
// Returns how many leading elements it combined (a multiple of 8); CombineAs does the rest.
// About 2x faster than the batches through local arrays on a segment that is in cache.
using Float32x8 = float __attribute__((vector_size(32)));

template <ReduceOp kOp, bool kDivide>
size_t CombineFloat32Vectors(const uint8_t* mine, const uint8_t* theirs, uint8_t* out, size_t n,
                             float divisor) {
  constexpr size_t kLanes = 8;
  constexpr size_t kVectorBytes = sizeof(Float32x8);
  Float32x8 divisors;
  for (size_t j = 0; j < kLanes; ++j) divisors[j] = divisor;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const size_t at = i * sizeof(float);
    Float32x8 x, y;
    std::memcpy(&x, mine + at, kVectorBytes);
    std::memcpy(&y, theirs + at, kVectorBytes);
    if constexpr (kOp == ReduceOp::kMax) {
      x = (x > y || x != x) ? x : y;
    } else if constexpr (kOp == ReduceOp::kMin) {
      x = (x < y || x != x) ? x : y;
    } else if constexpr (kOp == ReduceOp::kProduct) {
      x = x * y;
    } else {
      x = x + y;
    }
    if constexpr (kDivide) x = x / divisors;
    std::memcpy(out + at, &x, kVectorBytes);
  }
  return i;
}

// out[i] = mine[i] (op) theirs[i] for i in [0, n), divided by `divisor` if kDivide. `out` may
// be `mine` exactly, and overlaps nothing else. Works in batches of kBatch elements through
// local arrays, which the compiler turns into SIMD code at -O2 (a plain loop over possibly
// aliasing byte pointers it does not).
template <typename Codec, ReduceOp kOp, bool kDivide>
void CombineAs(const uint8_t* mine, const uint8_t* theirs, uint8_t* out, size_t n,
               typename Codec::Value divisor) {
  using Value = typename Codec::Value;
  constexpr size_t kBatch = 16;
  auto combine = [divisor](const uint8_t* a, const uint8_t* b, uint8_t* o, size_t count) {
    Value x[kBatch], y[kBatch];
    for (size_t j = 0; j < count; ++j) {
      x[j] = Codec::Load(a + j * Codec::kBytes);
      y[j] = Codec::Load(b + j * Codec::kBytes);
    }
    for (size_t j = 0; j < count; ++j) {
      x[j] = Apply<kOp>(x[j], y[j]);
      if constexpr (kDivide) x[j] /= divisor;
    }
    for (size_t j = 0; j < count; ++j) Codec::Store(o + j * Codec::kBytes, x[j]);
  };
  size_t i = 0;
  if constexpr (std::is_same_v<Codec, Float32Codec>) {
    i = CombineFloat32Vectors<kOp, kDivide>(mine, theirs, out, n, divisor);
  }
  for (; i + kBatch <= n; i += kBatch) {
    const size_t at = i * Codec::kBytes;
    combine(mine + at, theirs + at, out + at, kBatch);
  }
  if (i < n) {
    const size_t at = i * Codec::kBytes;
    combine(mine + at, theirs + at, out + at, n - i);
  }
}

template <typename Codec>
void CombineWith(ReduceOp op, bool last, const uint8_t* mine, const uint8_t* theirs, uint8_t* out,
                 size_t n, int world) {
  using Value = typename Codec::Value;
  const Value none = Value(1);  // the divisor where nothing is divided
  switch (op) {
    case ReduceOp::kSum:
      return CombineAs<Codec, ReduceOp::kSum, false>(mine, theirs, out, n, none);
    case ReduceOp::kAverage:
      if constexpr (std::is_floating_point_v<Value>) {
        if (last) {
          return CombineAs<Codec, ReduceOp::kSum, true>(mine, theirs, out, n,
                                                       static_cast<Value>(world));
        }
        return CombineAs<Codec, ReduceOp::kSum, false>(mine, theirs, out, n, none);
      }
      return;  // not reached: CheckCall rejects an average of a non-floating dtype
    case ReduceOp::kMax:
      return CombineAs<Codec, ReduceOp::kMax, false>(mine, theirs, out, n, none);
    case ReduceOp::kMin:
      return CombineAs<Codec, ReduceOp::kMin, false>(mine, theirs, out, n, none);
    case ReduceOp::kProduct:
      return CombineAs<Codec, ReduceOp::kProduct, false>(mine, theirs, out, n, none);
  }
}

}  // namespace

void Combine(DataType dtype, ReduceOp op, bool last, const uint8_t* mine, const uint8_t* theirs,
             uint8_t* out, size_t n, int world) {
  switch (dtype) {
    case DataType::kFloat32:
      return CombineWith<Float32Codec>(op, last, mine, theirs, out, n, world);
    case DataType::kFloat64:
      return CombineWith<Float64Codec>(op, last, mine, theirs, out, n, world);
    case DataType::kFloat16:
      return CombineWith<Float16Codec>(op, last, mine, theirs, out, n, world);
    case DataType::kBFloat16:
      return CombineWith<BFloat16Codec>(op, last, mine, theirs, out, n, world);
    case DataType::kInt8:
      return CombineWith<PlainCodec<int8_t>>(op, last, mine, theirs, out, n, world);
    case DataType::kUInt8:
      return CombineWith<PlainCodec<uint8_t>>(op, last, mine, theirs, out, n, world);
    case DataType::kInt32:
      return CombineWith<PlainCodec<int32_t>>(op, last, mine, theirs, out, n, world);
    case DataType::kInt64:
      return CombineWith<PlainCodec<int64_t>>(op, last, mine, theirs, out, n, world);
    case DataType::kBool:
      return CombineWith<BoolCodec>(op, last, mine, theirs, out, n, world);
  }
}

}  // namespace tessera::worker
