#include "worker/data/in_memory_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::worker::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(InMemoryDatasetTest, GetsRowsAndLabels) {
  auto dataset = InMemoryDataset::Create(2, 3, {1, 2, 3, 4, 5, 6}, {0, 2, 1});
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 3u);
  float features[2];
  int64_t label = -1;
  ASSERT_TRUE((*dataset)->Get(1, features, &label).ok());
  EXPECT_THAT(features, ElementsAre(3, 4));
  EXPECT_EQ(label, 2);
  Status out_of_range = (*dataset)->Get(3, features, &label);
  EXPECT_EQ(out_of_range.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(out_of_range.message(), HasSubstr("index 3 >= dataset size 3"));
}

TEST(InMemoryDatasetTest, RejectsInconsistentInputs) {
  EXPECT_THAT(InMemoryDataset::Create(2, 3, {1, 2, 3}, {0, 1}).status().message(),
              HasSubstr("3 features are not 2 samples x feature_dim 2"));
  EXPECT_THAT(InMemoryDataset::Create(1, 3, {1, 2}, {0, 3}).status().message(),
              HasSubstr("sample 1 label 3 is outside [0, 3)"));
  EXPECT_THAT(InMemoryDataset::Create(1, 3, {1}, {-1}).status().message(),
              HasSubstr("label -1"));
  EXPECT_FALSE(InMemoryDataset::Create(0, 3, {}, {}).ok());
  EXPECT_FALSE(InMemoryDataset::Create(1, 0, {}, {}).ok());
  EXPECT_TRUE(InMemoryDataset::Create(4, 2, {}, {}).ok());  // empty is fine
}

}  // namespace
}  // namespace tessera::worker::data
