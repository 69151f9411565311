// DataType: the element type of a tensor, wherever tensors travel or are combined.
#ifndef TESSERA_COMMON_BASE_DATA_TYPE_H_
#define TESSERA_COMMON_BASE_DATA_TYPE_H_

#include <cstddef>
#include <string_view>

namespace tessera {

// 16-bit floating types travel in their 16-bit form; whoever computes with them (a reduction)
// does so in float32. kBool is one byte holding 0 or 1 (as a torch.bool tensor's elements).
// The numbering is part of the direct ring channels' frame header (a byte each): new types go
// at the end.
enum class DataType {
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kUInt8,
  kFloat64,
  kInt8,
  kBool,
};

// Bytes per element; 0 for a value outside the enum.
constexpr size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kUInt8: return 1;
    case DataType::kFloat64: return 8;
    case DataType::kInt8: return 1;
    case DataType::kBool: return 1;
  }
  return 0;
}

// float32, float64, float16 and bfloat16 (not the integers, not bool).
constexpr bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// "float32", "float16", "bfloat16", "int64", "int32", "uint8", "float64", "int8", "bool"
// ("invalid" outside the enum).
constexpr std::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt64: return "int64";
    case DataType::kInt32: return "int32";
    case DataType::kUInt8: return "uint8";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kBool: return "bool";
  }
  return "invalid";
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_DATA_TYPE_H_
