#include "common/training/embedding_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace tessera {
namespace {

EmbeddingTableSpec Spec() { return {"emb.0", 50, 4, 99}; }

TEST(EmbeddingTableTest, RowsStartFromTheSeededInitialValuesAndAreCreatedLazily) {
  EmbeddingTable table(Spec(), DefaultOptimizerOptions(OptimizerKind::kSgd));
  std::vector<float> expected(4), got(8);
  InitializeEmbeddingRow(99, 7, 4, expected.data());
  for (float v : expected) EXPECT_LE(std::abs(v), 0.5f);  // 1/sqrt(4)
  const int64_t ids[] = {7, 7};
  ASSERT_TRUE(table.Lookup(ids, 2, got.data()).ok());
  EXPECT_EQ(table.materialized_rows(), 1u);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(got[j], expected[j]);
    EXPECT_EQ(got[4 + j], expected[j]);
  }
  // Another seed or id gives other values.
  std::vector<float> other(4);
  InitializeEmbeddingRow(100, 7, 4, other.data());
  EXPECT_NE(other, expected);
  InitializeEmbeddingRow(99, 8, 4, other.data());
  EXPECT_NE(other, expected);
}

// The lazily created, hashed storage must give exactly what SparseRowUpdate gives on a dense
// table holding the same initial rows (bitwise: the same per-element math).
TEST(EmbeddingTableTest, ApplyGradientsMatchesADenseTableUpdateBitwise) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                             OptimizerKind::kAdagrad}) {
    OptimizerOptions options = DefaultOptimizerOptions(kind);
    options.weight_decay = 0.01f;
    EmbeddingTable table(Spec(), options);
    std::vector<float> dense(50 * 4);
    for (int64_t id = 0; id < 50; ++id) InitializeEmbeddingRow(99, id, 4, dense.data() + id * 4);
    std::vector<float> state(StateFloatsPerElement(kind) * dense.size());
    InitOptimizerState(options, state.data(), dense.size());
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<int64_t> ids = {3, 41, 3, static_cast<int64_t>(10 + step)};
      std::vector<float> grads(ids.size() * 4);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.1f * static_cast<float>(i) - 0.5f;
      ASSERT_TRUE(table.ApplyGradients(0.1f, step, ids.data(), grads.data(), ids.size()).ok());
      ASSERT_TRUE(SparseRowUpdate(options, 0.1f, step, dense.data(), 50, 4, ids.data(),
                                  grads.data(), ids.size(), state.data())
                      .ok());
    }
    for (int64_t id = 0; id < 50; ++id) {
      std::vector<float> row(4);
      table.Read(id, row.data());
      for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(row[j], dense[id * 4 + j]) << OptimizerKindName(kind) << " id " << id;
      }
    }
    EXPECT_EQ(table.materialized_rows(), 5u);  // 3, 41, 11, 12, 13
  }
}

TEST(EmbeddingTableTest, ExportImportRoundTripsRowsAndState) {
  OptimizerOptions adam = DefaultOptimizerOptions(OptimizerKind::kAdam);
  EmbeddingTable table(Spec(), adam);
  const int64_t ids[] = {9, 2, 9};
  std::vector<float> grads(12, 0.25f);
  ASSERT_TRUE(table.ApplyGradients(0.1f, 1, ids, grads.data(), 3).ok());
  std::vector<int64_t> exported_ids;
  std::vector<float> values, state;
  table.Export(&exported_ids, &values, &state);
  EXPECT_EQ(exported_ids, (std::vector<int64_t>{2, 9}));
  EXPECT_EQ(state.size(), 2u * 2 * 4);
  EmbeddingTable copy(Spec(), adam);
  ASSERT_TRUE(copy.Import(exported_ids, values, state).ok());
  // Both continue identically.
  ASSERT_TRUE(table.ApplyGradients(0.1f, 2, ids, grads.data(), 3).ok());
  ASSERT_TRUE(copy.ApplyGradients(0.1f, 2, ids, grads.data(), 3).ok());
  for (int64_t id : {2, 9, 4}) {
    std::vector<float> a(4), b(4);
    table.Read(id, a.data());
    copy.Read(id, b.data());
    EXPECT_EQ(a, b) << "row " << id;
  }
  EXPECT_FALSE(copy.Import({1}, {1, 2}, {}).ok());
  EXPECT_FALSE(copy.Import({50}, std::vector<float>(4), std::vector<float>(8)).ok());
}

TEST(EmbeddingTableTest, BadIdsAreRejectedBeforeAnythingChanges) {
  EmbeddingTable table(Spec(), DefaultOptimizerOptions(OptimizerKind::kSgd));
  const int64_t ids[] = {1, 50};
  std::vector<float> out(8), grads(8, 1.0f);
  Status lookup = table.Lookup(ids, 2, out.data());
  EXPECT_EQ(lookup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lookup.message().find("'emb.0': id 50 at position 1"), std::string::npos)
      << lookup.ToString();
  EXPECT_FALSE(table.ApplyGradients(0.1f, 1, ids, grads.data(), 2).ok());
  EXPECT_EQ(table.materialized_rows(), 0u);
  const int64_t negative[] = {-1};
  EXPECT_FALSE(table.Lookup(negative, 1, out.data()).ok());
}

}  // namespace
}  // namespace tessera
