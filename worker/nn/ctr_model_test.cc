#include "worker/nn/ctr_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "worker/data/synthetic_ctr.h"
#include "worker/engines/local_engine.h"
#include "worker/nn/cpu/cpu_backend.h"
#include "worker/trainer.h"

namespace tessera::worker {
namespace {

CtrModelOptions SmallOptions() {
  CtrModelOptions options;
  options.dense_dim = 3;
  options.field_sizes = {10, 4};
  options.embedding_dim = 2;
  options.hidden = {5};
  options.activation = Activation::kGelu;  // smooth: central differences are exact enough
  options.seed = 7;
  return options;
}

data::Batch SmallBatch() {
  data::Batch batch;
  batch.size = 4;
  batch.feature_dim = 3;
  batch.sparse_fields = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int i = 0; i < 12; ++i) batch.features.push_back(normal(rng));
  batch.sparse_ids = {9, 0, 2, 3, 9, 3, 5, 0};  // id 9 and 0/3 repeat: gradients must add up
  batch.labels = {1, 0, 0, 1};
  return batch;
}

TEST(CtrModelTest, TablesLayoutAndGrouping) {
  CpuBackend backend;
  auto model = std::move(CtrModel::Create(SmallOptions(), &backend)).value();
  ASSERT_EQ(model->embedding_tables().size(), 2u);
  EXPECT_EQ(model->embedding_tables()[1].name, "emb.1");
  EXPECT_EQ(model->embedding_tables()[1].rows, 4);
  EXPECT_NE(model->embedding_tables()[0].init_seed, model->embedding_tables()[1].init_seed);
  // MLP input: 3 dense + 2 tables x 2.
  EXPECT_EQ(model->layout().Find("top.0.weight")->shape, (std::vector<int64_t>{5, 7}));
  std::vector<SparseRows> sparse;
  ASSERT_TRUE(GroupSparseIds(SmallBatch(), model->embedding_tables(), &sparse).ok());
  EXPECT_EQ(sparse[0].ids, (std::vector<int64_t>{2, 5, 9}));
  EXPECT_EQ(sparse[0].slots, (std::vector<int32_t>{2, 0, 2, 1}));
  EXPECT_EQ(sparse[1].ids, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(sparse[1].values.size(), 4u);
  data::Batch bad = SmallBatch();
  bad.sparse_ids[3] = 4;  // table 1 has 4 rows
  Status status = GroupSparseIds(bad, model->embedding_tables(), &sparse);
  EXPECT_NE(status.message().find("sample 1 of the batch has id 4 for table 'emb.1'"),
            std::string::npos)
      << status;
  EXPECT_FALSE(CtrModel::Create({3, {}, 2, {5}}, &backend).ok());
  EXPECT_FALSE(CtrModel::Create({3, {10, 0}, 2, {5}}, &backend).ok());
}

// Dense parameters and the touched embedding rows against central differences of the loss.
TEST(CtrModelTest, GradientsMatchNumericalDifferentiation) {
  CpuBackend backend;
  auto model = std::move(CtrModel::Create(SmallOptions(), &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  model->InitializeParameters(1, params.data());
  data::Batch batch = SmallBatch();
  std::vector<SparseRows> sparse;
  ASSERT_TRUE(GroupSparseIds(batch, model->embedding_tables(), &sparse).ok());
  for (size_t t = 0; t < sparse.size(); ++t) {
    const auto& spec = model->embedding_tables()[t];
    for (size_t r = 0; r < sparse[t].ids.size(); ++r) {
      InitializeEmbeddingRow(spec.init_seed, sparse[t].ids[r], spec.dim,
                             sparse[t].values.data() + r * spec.dim);
    }
  }
  ASSERT_TRUE(model->ForwardBackward(params.data(), batch, &sparse, grads.data(), nullptr).ok());
  auto loss = [&]() { return model->Evaluate(params.data(), batch, &sparse)->loss; };
  const float h = 1e-2f;
  // float32 loss (~1e-7) / 2h plus O(h^2) truncation for smooth GELU / BCE: 1e-3 is ample.
  for (size_t i = 0; i < params.size(); ++i) {
    const float saved = params[i];
    params[i] = saved + h;
    double plus = loss();
    params[i] = saved - h;
    double minus = loss();
    params[i] = saved;
    EXPECT_NEAR(grads[i], (plus - minus) / (2 * h), 1e-3) << "dense parameter " << i;
  }
  for (size_t t = 0; t < sparse.size(); ++t) {
    std::vector<float> row_grads = sparse[t].grads;
    for (size_t i = 0; i < sparse[t].values.size(); ++i) {
      float& value = sparse[t].values[i];
      const float saved = value;
      value = saved + h;
      double plus = loss();
      value = saved - h;
      double minus = loss();
      value = saved;
      EXPECT_NEAR(row_grads[i], (plus - minus) / (2 * h), 1e-3) << "table " << t << " float " << i;
    }
  }
}

TEST(CtrModelTest, TrainsOnTheSyntheticCtrSetAndTouchesOnlyBatchRows) {
  CpuBackend backend;
  data::SyntheticCtrOptions data_options;
  data_options.num_samples = 20000;
  data_options.dense_dim = 4;
  data_options.field_sizes = {200, 50, 20};
  data_options.seed = 1;
  auto train = std::move(data::SyntheticCtr::Create(data_options)).value();
  CtrModelOptions options;
  options.dense_dim = 4;
  options.field_sizes = data_options.field_sizes;
  options.embedding_dim = 8;
  options.hidden = {32};
  auto model = std::move(CtrModel::Create(options, &backend)).value();
  OptimizerOptions adam = DefaultOptimizerOptions(OptimizerKind::kAdam);
  adam.lr = 0.01f;
  auto engine = std::move(LocalEngine::Create(adam, LrScheduleOptions())).value();
  TrainerOptions trainer;
  trainer.batch_size = 128;
  trainer.steps = 400;
  trainer.log_every = 0;
  trainer.eval_samples = 4096;
  std::vector<float> params;
  auto summary = Train(trainer, *train, train.get(), model.get(), &backend, engine.get(), &params);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // About 25% of the labels are clicks, so always answering "no click" scores 0.75; the teacher
  // is a small tanh network of the same inputs, which the model learns well beyond that.
  EXPECT_GT(summary->eval_accuracy, 0.85) << "eval loss " << summary->eval_loss;
  EXPECT_LT(summary->eval_loss, 0.4);
}

TEST(CtrModelTest, LocalEngineUpdatesOnlyTheTouchedRows) {
  CpuBackend backend;
  auto model = std::move(CtrModel::Create(SmallOptions(), &backend)).value();
  auto engine = std::move(LocalEngine::Create(DefaultOptimizerOptions(OptimizerKind::kAdam),
                                              LrScheduleOptions()))
                    .value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  model->InitializeParameters(1, params.data());
  ASSERT_TRUE(engine->Initialize(model->layout(), model->embedding_tables(), params.data()).ok());
  data::Batch batch = SmallBatch();
  std::vector<SparseRows> sparse;
  ASSERT_TRUE(GroupSparseIds(batch, model->embedding_tables(), &sparse).ok());
  for (size_t t = 0; t < sparse.size(); ++t) {
    ASSERT_TRUE(engine->LookupRows(t, sparse[t].ids, sparse[t].values.data()).ok());
  }
  ASSERT_TRUE(model->ForwardBackward(params.data(), batch, &sparse, grads.data(), nullptr).ok());
  ASSERT_TRUE(engine->Step(1, params.data(), grads.data(), sparse).ok());
  // Every row of table 0: only ids 2, 5, 9 moved away from their initial values.
  const auto& spec = model->embedding_tables()[0];
  for (int64_t id = 0; id < spec.rows; ++id) {
    std::vector<float> now(2), initial(2);
    ASSERT_TRUE(engine->LookupRows(0, {id}, now.data()).ok());
    InitializeEmbeddingRow(spec.init_seed, id, spec.dim, initial.data());
    const bool touched = id == 2 || id == 5 || id == 9;
    EXPECT_EQ(now != initial, touched) << "row " << id;
  }
}

}  // namespace
}  // namespace tessera::worker
