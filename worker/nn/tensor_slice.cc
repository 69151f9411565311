#include "worker/nn/tensor_slice.h"

#include <algorithm>

namespace tessera::worker {
namespace {

// Rows and columns of a tensor seen as 2-d (a 1-d tensor is one column of rows).
int64_t Rows(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }
int64_t Columns(const std::vector<int64_t>& shape) {
  int64_t columns = 1;
  for (size_t d = 1; d < shape.size(); ++d) columns *= shape[d];
  return columns;
}

// Calls copy(full_offset, local_offset, count) for each contiguous run of the slice.
template <typename Copy>
void ForEachRun(const TensorSlice& slice, const std::vector<int64_t>& full_shape, Copy copy) {
  const int64_t rows = Rows(full_shape), columns = Columns(full_shape);
  if (slice.axis < 0) {
    copy(0, 0, rows * columns);
  } else if (slice.axis == 0) {
    copy(slice.begin * columns, 0, (slice.end - slice.begin) * columns);
  } else {
    const int64_t width = slice.end - slice.begin;
    for (int64_t r = 0; r < rows; ++r) copy(r * columns + slice.begin, r * width, width);
  }
}

}  // namespace

std::vector<int64_t> TensorSlice::ShapeIn(const std::vector<int64_t>& full_shape) const {
  std::vector<int64_t> shape = full_shape;
  if (axis >= 0) shape[static_cast<size_t>(axis)] = end - begin;
  return shape;
}

std::string TensorSlice::ToString() const {
  if (axis < 0) return "whole";
  return std::string(axis == 0 ? "rows " : "columns ") + std::to_string(begin) + ".." +
         std::to_string(end - 1);
}

TensorSlice EvenSlice(int axis, int64_t extent, int part, int parts) {
  const int64_t width = extent / parts;
  return TensorSlice{axis, width * part, width * (part + 1)};
}

void ExtractSlice(const TensorSlice& slice, const std::vector<int64_t>& full_shape,
                  const float* full, float* local) {
  ForEachRun(slice, full_shape, [&](int64_t at, int64_t local_at, int64_t count) {
    std::copy(full + at, full + at + count, local + local_at);
  });
}

void InsertSlice(const TensorSlice& slice, const std::vector<int64_t>& full_shape,
                 const float* local, float* full) {
  ForEachRun(slice, full_shape, [&](int64_t at, int64_t local_at, int64_t count) {
    std::copy(local + local_at, local + local_at + count, full + at);
  });
}

}  // namespace tessera::worker
