// TensorData: one tensor as a message carries it: what it is (name, key, dtype, shape) and,
// when its elements travel, their bytes.
//
// On receipt, `bytes` views the tensor's slice of the frame it arrived in (no copy): the wire
// layer checked that the slice lies inside its frame and holds exactly dtype x shape elements.
// The bytes need not be aligned for their type: read them with memcpy (ReadFloats). On
// sending, every tensor with bytes becomes a frame of its own, sent as the Payload says (an
// owned payload without a copy).
//
// Thread-safety: a value type; copies share the bytes.
#ifndef TESSERA_COMMON_MESSAGES_TENSOR_DATA_H_
#define TESSERA_COMMON_MESSAGES_TENSOR_DATA_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/data_type.h"
#include "common/base/payload.h"

namespace tessera {

struct TensorData {
  std::string name;
  uint64_t key = 0;  // partition key (a dense chunk's id); 0 where unused
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  // Empty when no elements travel (a request for them, or a tensor of no elements).
  Payload bytes;

  // A one-dimensional float32 tensor of `count` elements at `values`, which `owner` keeps
  // alive and unchanged until the message is sent (null owner: see Payload::Borrow).
  static TensorData Floats(std::string name, uint64_t key, const float* values, size_t count,
                           std::shared_ptr<const void> owner) {
    TensorData tensor{std::move(name), key, DataType::kFloat32,
                      {static_cast<int64_t>(count)}, Payload()};
    if (count > 0) tensor.bytes = Payload::Borrow(values, count * sizeof(float), std::move(owner));
    return tensor;
  }
  // The same for a vector the tensor takes over.
  static TensorData Floats(std::string name, uint64_t key, std::vector<float> values) {
    auto owned = std::make_shared<std::vector<float>>(std::move(values));
    const float* data = owned->data();
    const size_t count = owned->size();
    return Floats(std::move(name), key, data, count, std::move(owned));
  }
  static TensorData Int64s(std::string name, std::vector<int64_t> values) {
    auto owned = std::make_shared<std::vector<int64_t>>(std::move(values));
    const int64_t* data = owned->data();
    const size_t count = owned->size();
    TensorData tensor{std::move(name), 0, DataType::kInt64, {static_cast<int64_t>(count)},
                      Payload()};
    if (count > 0) tensor.bytes = Payload::Borrow(data, count * sizeof(int64_t), std::move(owned));
    return tensor;
  }

  // The bytes as elements of T (copied: frames need not be aligned). REQUIRES: T matches dtype.
  template <typename T>
  std::vector<T> Read() const {
    std::vector<T> values(bytes.size() / sizeof(T));
    if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
    return values;
  }
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_TENSOR_DATA_H_
