#include "worker/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/data/in_memory_dataset.h"

namespace tessera::worker::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<InMemoryDataset> ThreeSamples() {
  auto dataset = InMemoryDataset::Create(2, 4, {0, 1, 10, 11, 20, 21}, {3, 1, 2});
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return std::move(dataset).value();
}

TEST(MakeBatchTest, GathersRowsInIndexOrderIncludingRepeats) {
  auto dataset = ThreeSamples();
  Batch batch;
  ASSERT_TRUE(MakeBatch(*dataset, {2, 0, 2}, &batch).ok());
  EXPECT_EQ(batch.size, 3u);
  EXPECT_EQ(batch.feature_dim, 2u);
  EXPECT_THAT(batch.features, ElementsAre(20, 21, 0, 1, 20, 21));
  EXPECT_THAT(batch.labels, ElementsAre(2, 3, 2));

  // Reusing the batch for a smaller one shrinks it.
  ASSERT_TRUE(MakeBatch(*dataset, {1}, &batch).ok());
  EXPECT_EQ(batch.size, 1u);
  EXPECT_THAT(batch.features, ElementsAre(10, 11));
  EXPECT_THAT(batch.labels, ElementsAre(1));

  ASSERT_TRUE(MakeBatch(*dataset, {}, &batch).ok());
  EXPECT_EQ(batch.size, 0u);
  EXPECT_TRUE(batch.features.empty());
}

TEST(MakeBatchTest, ErrorNamesPositionAndIndex) {
  auto dataset = ThreeSamples();
  Batch batch;
  Status status = MakeBatch(*dataset, {0, 7}, &batch);
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("make batch: position 1 index 7"));
}

}  // namespace
}  // namespace tessera::worker::data
