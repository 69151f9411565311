// ParameterLayout: where each dense parameter lives in a model's one flat float32 buffer.
//
// A model's dense parameters, and its gradients, each live in one contiguous buffer in the
// same layout, so a distributed engine can bucket, shard, all-reduce or push them as plain
// ranges without copies (PyTorch DDP's flat buckets, ZeRO's flat partitions). A view is a
// name, a shape and an element offset; views are packed in the order they are added, with no
// padding between them. Sparse parameters (embedding tables) are not part of the layout.
//
// Thread-safety: build on one thread; a finished layout is immutable and may be shared.
#ifndef TESSERA_COMMON_TRAINING_PARAMETER_LAYOUT_H_
#define TESSERA_COMMON_TRAINING_PARAMETER_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tessera {

struct ParameterView {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element in the flat buffer
  uint64_t size = 0;    // elements: the product of the shape

  // "layer0.weight [256, 784] @ 0"
  std::string ToString() const;
};

class ParameterLayout {
 public:
  // Appends a parameter. InvalidArgument for an empty or duplicate name, a negative or zero
  // dimension, or a size that overflows.
  StatusOr<const ParameterView*> Add(std::string name, std::vector<int64_t> shape);

  const std::vector<ParameterView>& views() const { return views_; }
  uint64_t total_size() const { return total_size_; }
  // nullptr when there is no parameter of that name.
  const ParameterView* Find(std::string_view name) const;

  // A hash of the names, shapes and order: equal layouts give equal fingerprints, so ranks
  // can check they are about to exchange the same thing.
  uint64_t Fingerprint() const;

 private:
  std::vector<ParameterView> views_;
  uint64_t total_size_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_PARAMETER_LAYOUT_H_
