#include "server/ps/tensor_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

Payload Floats(const std::vector<float>& values) {
  return Payload::Copy(values.data(), values.size() * sizeof(float));
}

TensorValue Tensor(std::string name, uint64_t key, std::vector<int64_t> shape,
                   const std::vector<float>& values) {
  return TensorValue{std::move(name), key, std::move(shape), Floats(values)};
}

// Server 1 of 3 over 10 keys owns [4, 7) (ServerKeyRange: 4, 3, 3).
std::unique_ptr<TensorStore> MiddleServer(MetricsRegistry* metrics = nullptr) {
  TensorStoreOptions options;
  options.server_rank = 1;
  options.num_servers = 3;
  options.key_space = 10;
  auto store = TensorStore::Create(options, metrics);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

TEST(TensorStoreTest, OwnsItsFleetViewRange) {
  FleetView view;
  view.num_servers = 3;
  view.key_space = 10;
  auto store = TensorStore::Create(TensorStoreOptionsFrom(view, 1), nullptr);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->key_begin(), 4u);
  EXPECT_EQ((*store)->key_end(), 7u);
  EXPECT_EQ((*store)->OwnerOf(0), 0);
  EXPECT_EQ((*store)->OwnerOf(6), 1);
  EXPECT_EQ((*store)->OwnerOf(9), 2);
  EXPECT_EQ((*store)->OwnerOf(10), -1);
}

TEST(TensorStoreTest, RejectsARankOutsideTheFleet) {
  TensorStoreOptions options;
  options.server_rank = 2;
  options.num_servers = 2;
  auto store = TensorStore::Create(options, nullptr);
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("server rank 2"));
}

TEST(TensorStoreTest, PutThenGetReturnsAnUnchangingCopy) {
  auto store = MiddleServer();
  ASSERT_TRUE(store->Put({Tensor("w", 5, {2, 2}, {1, 2, 3, 4})}).ok());
  auto got = store->Get(5, "w");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->name, "w");
  EXPECT_EQ(got->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(got->Values(), (std::vector<float>{1, 2, 3, 4}));

  // A later Put replaces the value; the earlier snapshot keeps its bytes.
  ASSERT_TRUE(store->Put({Tensor("w", 5, {2, 2}, {5, 6, 7, 8})}).ok());
  EXPECT_EQ(got->Values(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(store->Get(5, "w")->Values(), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_EQ(store->size(), 1u);
  EXPECT_EQ(store->total_bytes(), 16u);
}

TEST(TensorStoreTest, ShapeMismatchNamesTheTensorAndBothShapes) {
  auto store = MiddleServer();
  ASSERT_TRUE(store->Put({Tensor("layer3.w", 4, {2, 2}, {1, 2, 3, 4})}).ok());
  Status s = store->Put({Tensor("layer3.w", 4, {4}, {1, 2, 3, 4})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer3.w"));
  EXPECT_THAT(s.message(), HasSubstr("[2, 2]"));
  EXPECT_THAT(s.message(), HasSubstr("[4]"));
}

TEST(TensorStoreTest, KeyOutsideTheRangeNamesKeyServerAndOwner) {
  auto store = MiddleServer();
  Status s = store->Put({Tensor("emb", 8, {1}, {1})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("key 8"));
  EXPECT_THAT(s.message(), HasSubstr("not on server 1"));
  EXPECT_THAT(s.message(), HasSubstr("belongs to server 2"));
  auto get = store->Get(0, "emb");
  EXPECT_THAT(get.status().message(), HasSubstr("belongs to server 0"));
  Status outside = store->Put({Tensor("emb", 10, {1}, {1})});
  EXPECT_THAT(outside.message(), HasSubstr("outside the key space [0, 10)"));
}

TEST(TensorStoreTest, MissingTensorIsNotFoundNamingTensorAndServer) {
  auto store = MiddleServer();
  auto got = store->Get(6, "layer9.b");
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("layer9.b"));
  EXPECT_THAT(got.status().message(), HasSubstr("server 1"));
}

TEST(TensorStoreTest, ByteCountMustMatchTheShape) {
  auto store = MiddleServer();
  Status s = store->Put({Tensor("w", 4, {3}, {1, 2})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs 12 bytes"));
  EXPECT_EQ(store->Put({Tensor("w", 4, {-1}, {})}).code(), StatusCode::kInvalidArgument);
}

TEST(TensorStoreTest, ABadTensorStoresNothingFromItsPush) {
  auto store = MiddleServer();
  ASSERT_TRUE(store->Put({Tensor("a", 4, {1}, {1})}).ok());
  // A key twice in one push, caught before anything is stored.
  Status s = store->Put({Tensor("a", 4, {1}, {2}), Tensor("b", 5, {1}, {3}),
                         Tensor("c", 4, {1}, {4})});
  EXPECT_THAT(s.message(), HasSubstr("appears twice"));
  // The last tensor clashes with the stored shape of "a"; "b" and "c" must not be stored.
  s = store->Put({Tensor("b", 5, {1}, {3}), Tensor("c", 6, {2}, {1, 2}),
                  Tensor("a", 4, {2}, {1, 2})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  EXPECT_EQ(store->Get(5, "b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Get(6, "c").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Get(4, "a")->Values(), std::vector<float>{1});
  EXPECT_EQ(store->size(), 1u);
}

TEST(TensorStoreTest, AKeyHoldsOneName) {
  auto store = MiddleServer();
  ASSERT_TRUE(store->Put({Tensor("a", 4, {1}, {1})}).ok());
  EXPECT_THAT(store->Put({Tensor("b", 4, {1}, {1})}).message(), HasSubstr("already holds tensor 'a'"));
  EXPECT_THAT(store->Get(4, "b").status().message(), HasSubstr("holds tensor 'a', not 'b'"));
}

TEST(TensorStoreTest, ExportsGaugesAndCounters) {
  MetricsRegistry metrics;
  auto store = MiddleServer(&metrics);
  ASSERT_TRUE(store->Put({Tensor("a", 4, {2}, {1, 2}), Tensor("b", 5, {1}, {3})}).ok());
  ASSERT_TRUE(store->Put({Tensor("a", 4, {2}, {4, 5})}).ok());
  ASSERT_TRUE(store->Get(4, "a").ok());
  std::string text = metrics.RenderText();
  EXPECT_THAT(text, HasSubstr("tessera_server_keys 2\n"));
  EXPECT_THAT(text, HasSubstr("tessera_server_bytes 12\n"));
  EXPECT_THAT(text, HasSubstr("tessera_server_pushes_total 3\n"));
  EXPECT_THAT(text, HasSubstr("tessera_server_pulls_total 1\n"));
}

TEST(TensorStoreTest, ConcurrentPutsAndGetsSeeWholeValues) {
  auto store = MiddleServer();
  constexpr int kElements = 1000;
  ASSERT_TRUE(store->Put({Tensor("w", 4, {kElements}, std::vector<float>(kElements, 0))}).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 200; ++i) {
        float v = static_cast<float>(t * 1000 + i);
        EXPECT_TRUE(store->Put({Tensor("w", 4, {kElements}, std::vector<float>(kElements, v))}).ok());
        auto got = store->Get(4, "w");
        ASSERT_TRUE(got.ok()) << got.status();
        std::vector<float> values = got->Values();
        for (float x : values) ASSERT_EQ(x, values[0]) << "a torn value";
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store->total_bytes(), kElements * sizeof(float));
}

}  // namespace
}  // namespace tessera::server
