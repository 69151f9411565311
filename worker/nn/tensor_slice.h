// TensorSlice: where a tensor of one process's layout lies in the same-named tensor of the
// full model, for tensor parallelism (tensor_parallel_linear.h) and pipeline stages: the whole
// tensor (replicated), or a range of its rows (axis 0) or of its columns (axis 1; 2-d only).
//
//   TensorSlice s{/*axis=*/0, /*begin=*/32, /*end=*/64};   // rows 32..63 of [128, 16]
//   ExtractSlice(s, {128, 16}, full, local);               // full -> local (32 x 16)
//   InsertSlice(s, {128, 16}, local, full);                // local -> its place in full
//
// Thread-safety: plain functions.
#ifndef TESSERA_WORKER_NN_TENSOR_SLICE_H_
#define TESSERA_WORKER_NN_TENSOR_SLICE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::worker {

struct TensorSlice {
  int axis = -1;      // -1: the whole tensor; 0: rows [begin, end); 1: columns [begin, end)
  int64_t begin = 0;
  int64_t end = 0;

  // The slice's shape within a tensor of `full_shape`.
  std::vector<int64_t> ShapeIn(const std::vector<int64_t>& full_shape) const;
  // "rows 32..63", "columns 0..7", "whole".
  std::string ToString() const;
};

// Part `part` of `parts` equal ranges along `axis` of a dimension of `extent` (REQUIRES:
// parts divides extent).
TensorSlice EvenSlice(int axis, int64_t extent, int part, int parts);

// Copies the slice of `full` (a row-major tensor of full_shape) to `local` (the slice's
// shape), and back.
void ExtractSlice(const TensorSlice& slice, const std::vector<int64_t>& full_shape,
                  const float* full, float* local);
void InsertSlice(const TensorSlice& slice, const std::vector<int64_t>& full_shape,
                 const float* local, float* full);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_TENSOR_SLICE_H_
