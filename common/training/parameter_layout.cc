#include "common/training/parameter_layout.h"

#include <limits>

namespace tessera {
namespace {

// FNV-1a, 64-bit: stable across builds and machines, which std::hash is not.
void Mix(uint64_t* hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    *hash ^= bytes[i];
    *hash *= 1099511628211ull;
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

std::string ParameterView::ToString() const {
  return name + " " + ShapeString(shape) + " @ " + std::to_string(offset);
}

StatusOr<const ParameterView*> ParameterLayout::Add(std::string name, std::vector<int64_t> shape) {
  if (name.empty()) return InvalidArgumentError("parameter with an empty name");
  if (Find(name) != nullptr) return InvalidArgumentError("parameter '" + name + "' added twice");
  uint64_t size = 1;
  for (int64_t dim : shape) {
    if (dim <= 0) {
      return InvalidArgumentError("parameter '" + name + "' has shape " + ShapeString(shape) +
                                  ": every dimension must be positive");
    }
    if (size > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return InvalidArgumentError("parameter '" + name + "': shape " + ShapeString(shape) +
                                  " overflows");
    }
    size *= static_cast<uint64_t>(dim);
  }
  ParameterView view;
  view.name = std::move(name);
  view.shape = std::move(shape);
  view.offset = total_size_;
  view.size = size;
  total_size_ += size;
  views_.push_back(std::move(view));
  return &views_.back();
}

const ParameterView* ParameterLayout::Find(std::string_view name) const {
  for (const ParameterView& view : views_) {
    if (view.name == name) return &view;
  }
  return nullptr;
}

uint64_t ParameterLayout::Fingerprint() const {
  uint64_t hash = 14695981039346656037ull;
  for (const ParameterView& view : views_) {
    Mix(&hash, view.name.data(), view.name.size() + 1);  // with its terminator, so "ab"+"c" differs from "a"+"bc"
    uint64_t rank = view.shape.size();
    Mix(&hash, &rank, sizeof(rank));
    Mix(&hash, view.shape.data(), view.shape.size() * sizeof(int64_t));
  }
  return hash;
}

}  // namespace tessera
