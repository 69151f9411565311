#include "worker/nn/tensor_slice.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tessera::worker {
namespace {

TEST(TensorSliceTest, RowsColumnsAndWholeRoundTrip) {
  const std::vector<int64_t> shape = {4, 6};
  std::vector<float> full(24);
  std::iota(full.begin(), full.end(), 0.0f);
  const TensorSlice rows = EvenSlice(0, 4, 1, 2);  // rows 2..3
  EXPECT_EQ(rows.ShapeIn(shape), (std::vector<int64_t>{2, 6}));
  std::vector<float> local(12);
  ExtractSlice(rows, shape, full.data(), local.data());
  EXPECT_EQ(local[0], 12.0f);
  EXPECT_EQ(local[11], 23.0f);
  const TensorSlice columns = EvenSlice(1, 6, 2, 3);  // columns 4..5
  EXPECT_EQ(columns.ToString(), "columns 4..5");
  std::vector<float> narrow(8);
  ExtractSlice(columns, shape, full.data(), narrow.data());
  EXPECT_EQ(narrow, (std::vector<float>{4, 5, 10, 11, 16, 17, 22, 23}));
  // Every part of a split, inserted back, rebuilds the tensor.
  std::vector<float> rebuilt(24, -1.0f);
  for (int part = 0; part < 3; ++part) {
    const TensorSlice s = EvenSlice(1, 6, part, 3);
    std::vector<float> piece(8);
    ExtractSlice(s, shape, full.data(), piece.data());
    InsertSlice(s, shape, piece.data(), rebuilt.data());
  }
  EXPECT_EQ(rebuilt, full);
  std::vector<float> whole(24);
  ExtractSlice(TensorSlice{}, shape, full.data(), whole.data());
  EXPECT_EQ(whole, full);
}

TEST(TensorSliceTest, OneDimensionalRows) {
  std::vector<float> bias = {0, 1, 2, 3, 4, 5};
  std::vector<float> part(3);
  ExtractSlice(EvenSlice(0, 6, 1, 2), {6}, bias.data(), part.data());
  EXPECT_EQ(part, (std::vector<float>{3, 4, 5}));
}

}  // namespace
}  // namespace tessera::worker
