#include "server/ps/worker_regions.h"

#include <unistd.h>

#include <cstring>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

// This server's chunks: index 3 (2 floats, key 30) and index 1 (3 floats, key 10), so the
// region's halves hold chunk 1 at 0 and chunk 3 at 3 (5 floats each).
std::vector<DenseChunk> Chunks() {
  return {DenseChunk{3, 10, 2, 0, 30}, DenseChunk{1, 4, 3, 0, 10}};
}

PsPushPullRequest OfferOf(const SharedRegion& region) {
  PsPushPullRequest offer;
  offer.region_pid = getpid();
  offer.region_fd = region.fd();
  offer.region_token_high = region.token().high;
  offer.region_token_low = region.token().low;
  return offer;
}

TensorData Named(uint64_t key, int64_t size) {
  return TensorData{"chunk", key, DataType::kFloat32, {size}, Payload()};
}

TEST(WorkerRegionsTest, GradientsAreViewsAndValuesLandInTheRegion) {
  auto region = *SharedRegion::Create(2 * 5 * sizeof(float));
  float* floats = reinterpret_cast<float*>(region->data());
  for (int i = 0; i < 5; ++i) floats[i] = static_cast<float>(i + 1);  // gradients
  WorkerRegions regions(Chunks());
  ASSERT_TRUE(regions.Map(2, OfferOf(*region)).ok());

  auto tensors = regions.Tensors(2, {Named(30, 2), Named(10, 3)}, /*push=*/true);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 2u);
  EXPECT_EQ((*tensors)[0].Read<float>(), (std::vector<float>{4, 5}));
  EXPECT_EQ((*tensors)[1].Read<float>(), (std::vector<float>{1, 2, 3}));
  // Views of the worker's memory (the mapping is another address of the same pages).
  floats[3] = 40;
  EXPECT_EQ((*tensors)[0].Read<float>()[0], 40);

  PsPushPullReply sent;
  auto reply = regions.ReplyInto(2, [&sent](PsPushPullReply r) { sent = std::move(r); });
  PsPushPullReply values;
  values.tensors = {TensorData::Floats("chunk3", 30, {7, 8}),
                    TensorData::Floats("chunk1", 10, {9, 10, 11})};
  reply(std::move(values));
  ASSERT_EQ(sent.tensors.size(), 2u);
  EXPECT_TRUE(sent.tensors[0].bytes.empty());
  EXPECT_TRUE(sent.tensors[1].bytes.empty());
  EXPECT_EQ(sent.tensors[0].key, 30u);
  EXPECT_EQ(std::vector<float>(floats + 5, floats + 10), (std::vector<float>{9, 10, 11, 7, 8}));

  // A pull names the chunks without gradients.
  auto pulled = regions.Tensors(2, {Named(10, 3)}, /*push=*/false);
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE((*pulled)[0].bytes.empty());
}

// --replicas 3: the worker's region holds the gradients and a values half per copy; the copy
// with writer index 2 reads the same gradients and writes into the last half only.
TEST(WorkerRegionsTest, EachCopyWritesItsOwnValuesHalf) {
  auto region = *SharedRegion::Create(4 * 5 * sizeof(float));
  float* floats = reinterpret_cast<float*>(region->data());
  for (int i = 0; i < 5; ++i) floats[i] = static_cast<float>(i + 1);
  PsPushPullRequest offer = OfferOf(*region);
  offer.region_writers = 3;
  offer.region_writer = 2;
  WorkerRegions regions(Chunks());
  ASSERT_TRUE(regions.Map(1, offer).ok());
  auto tensors = regions.Tensors(1, {Named(10, 3)}, /*push=*/true);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ((*tensors)[0].Read<float>(), (std::vector<float>{1, 2, 3}));

  PsPushPullReply values;
  values.tensors = {TensorData::Floats("chunk1", 10, {9, 10, 11})};
  regions.ReplyInto(1, [](PsPushPullReply) {})(std::move(values));
  EXPECT_EQ(std::vector<float>(floats + 15, floats + 18), (std::vector<float>{9, 10, 11}));
  EXPECT_EQ(std::vector<float>(floats + 5, floats + 15), std::vector<float>(10, 0.0f));

  // A region the size of one values half, offered for three, is refused, as is a writer that
  // is not one of the halves.
  auto small = *SharedRegion::Create(2 * 5 * sizeof(float));
  PsPushPullRequest short_offer = OfferOf(*small);
  short_offer.region_writers = 3;
  EXPECT_THAT(regions.Map(2, short_offer).message(), HasSubstr("not the expected"));
  for (auto [writers, writer] : {std::pair{3, 3}, std::pair{0, 0}, std::pair{2, -1},
                                 std::pair{WorkerRegions::kMaxWriters + 1, 0}}) {
    offer.region_writers = writers;
    offer.region_writer = writer;
    Status refused = regions.Map(2, offer);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << writers << " " << writer;
    EXPECT_THAT(refused.message(), HasSubstr("worker 2's shared region offer names values half"));
  }
}

TEST(WorkerRegionsTest, RefusesWhatDoesNotFit) {
  WorkerRegions regions(Chunks());
  auto unmapped = regions.Tensors(0, {Named(10, 3)}, true);
  ASSERT_FALSE(unmapped.ok());
  EXPECT_THAT(unmapped.status().message(), HasSubstr("worker 0 sent chunks in a shared region"));

  auto small = *SharedRegion::Create(4 * sizeof(float));
  Status refused = regions.Map(0, OfferOf(*small));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("not the expected"));

  auto region = *SharedRegion::Create(10 * sizeof(float));
  ASSERT_TRUE(regions.Map(0, OfferOf(*region)).ok());
  auto unknown = regions.Tensors(0, {Named(99, 3)}, true);
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("key 99"));
  auto twice = regions.Tensors(0, {Named(10, 3), Named(10, 3)}, true);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("named twice"));
  // Another shape goes without bytes, for the shard to refuse.
  auto other = regions.Tensors(0, {Named(10, 4)}, true);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)[0].bytes.empty());
}

// A worker that offers a new region (a second job's engine of the same rank) while requests of
// its first are being served: both sides of the lock at once, for TSan.
TEST(WorkerRegionsTest, RemappingWhileServing) {
  auto first = *SharedRegion::Create(10 * sizeof(float));
  auto second = *SharedRegion::Create(10 * sizeof(float));
  WorkerRegions regions(Chunks());
  ASSERT_TRUE(regions.Map(1, OfferOf(*first)).ok());
  std::thread remap([&] {
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(regions.Map(1, OfferOf(i % 2 ? *first : *second)).ok());
    }
  });
  for (int i = 0; i < 200; ++i) {
    auto tensors = regions.Tensors(1, {Named(10, 3)}, true);
    ASSERT_TRUE(tensors.ok());
    PsPushPullReply values;
    values.tensors = {TensorData::Floats("chunk1", 10, {1, 2, 3})};
    regions.ReplyInto(1, [](PsPushPullReply) {})(std::move(values));
  }
  remap.join();
}

}  // namespace
}  // namespace tessera::server
