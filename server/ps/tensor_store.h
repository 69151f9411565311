// TensorStore: the named float32 tensors of one server shard, by key.
//
// A minimal precursor of the parameter server's shard store: key -> {name, shape, bytes}, with
// no optimizer yet (a push replaces the value). The fleet's keys [0, key_space) are split into
// contiguous server ranges (ServerKeyRange); this store accepts only the keys of its own range,
// so a worker that computed the owner wrongly gets an error naming the right server instead of
// a value stored where nobody will look for it.
//
//   ASSIGN_OR_RETURN(auto store, TensorStore::Create(TensorStoreOptionsFrom(view, rank), &metrics));
//   RETURN_IF_ERROR(store->Put({{"layer0.w", 3, {2, 2}, Payload::Copy(values, 16)}}));
//   ASSIGN_OR_RETURN(StoredTensor w, store->Get(3, "layer0.w"));
//
// Values are immutable buffers: Put swaps in a new buffer and Get hands out a reference to the
// current one, so a reader (e.g. a pull reply still being sent by ZeroMQ) never sees a value
// change under it and the store never waits for readers.
//
// Metrics (when a registry is given): tessera_server_keys, tessera_server_bytes (gauges) and
// tessera_server_pushes_total, tessera_server_pulls_total (counters, one per tensor).
//
// Thread-safety: all methods are thread-safe; one mutex guards the map and is held only for
// map updates and checks, never while copying tensor bytes.
#ifndef TESSERA_SERVER_PS_TENSOR_STORE_H_
#define TESSERA_SERVER_PS_TENSOR_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metrics.h"

namespace tessera::server {

// Which keys this store owns: server `server_rank` of `num_servers` over [0, key_space).
struct TensorStoreOptions {
  int server_rank = 0;
  int num_servers = 1;
  uint64_t key_space = 0;
};

// The options for server `server_rank` of `view`.
TensorStoreOptions TensorStoreOptionsFrom(const FleetView& view, int server_rank);

// One tensor to store: its float32 values as raw bytes (shape's element count x 4 bytes).
// `bytes` is only read during Put (it is copied), so it may borrow a received frame.
struct TensorValue {
  std::string name;
  uint64_t key = 0;
  std::vector<int64_t> shape;
  Payload bytes;
};

// A stored tensor as Get returns it: a copy of the metadata and a reference to the bytes,
// which never change (a later Put replaces the store's buffer, not this one).
struct StoredTensor {
  std::string name;
  uint64_t key = 0;
  std::vector<int64_t> shape;
  std::shared_ptr<const std::vector<uint8_t>> bytes;  // never null

  // The values as floats (a copy).
  std::vector<float> Values() const;
};

// "[2, 3]".
std::string FormatShape(const std::vector<int64_t>& shape);

class TensorStore {
 public:
  // InvalidArgument for a rank outside [0, num_servers). `metrics` may be null; otherwise it
  // must outlive the store.
  static StatusOr<std::unique_ptr<TensorStore>> Create(const TensorStoreOptions& options,
                                                       MetricsRegistry* metrics);

  int server_rank() const { return options_.server_rank; }
  uint64_t key_begin() const { return key_begin_; }
  uint64_t key_end() const { return key_end_; }
  // The server that owns `key` (-1 when key >= key_space).
  int OwnerOf(uint64_t key) const;

  // Stores every tensor of `tensors`, or none of them: all are checked first, then all are
  // stored under one lock, so a reader never sees half of a push. Errors name the tensor:
  //   InvalidArgument  its key is outside this server's range (naming the owning server), its
  //                    byte count does not match its shape, its shape differs from the stored
  //                    one (both shapes), its key holds another tensor's name, or its key
  //                    appears twice in `tensors`.
  Status Put(const std::vector<TensorValue>& tensors);

  // The tensor stored under `key`. NotFound naming the tensor and this server if there is
  // none; InvalidArgument if `key` is outside this server's range or holds another name.
  StatusOr<StoredTensor> Get(uint64_t key, const std::string& name) const;

  // Tensors held and their total bytes.
  size_t size() const;
  uint64_t total_bytes() const;

 private:
  explicit TensorStore(const TensorStoreOptions& options);
  Status RegisterMetrics(MetricsRegistry* metrics);
  // OK when `key` is in this server's range, else an error naming `name` and the owner.
  Status CheckOwnedKey(uint64_t key, const std::string& name) const;
  void UpdateGaugesLocked();

  const TensorStoreOptions options_;
  uint64_t key_begin_ = 0;
  uint64_t key_end_ = 0;

  Gauge* keys_gauge_ = nullptr;   // null without a registry
  Gauge* bytes_gauge_ = nullptr;
  Counter* pushes_ = nullptr;
  Counter* pulls_ = nullptr;

  mutable std::mutex mu_;
  std::map<uint64_t, StoredTensor> tensors_;  // guarded by mu_
  uint64_t total_bytes_ = 0;                  // guarded by mu_
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_TENSOR_STORE_H_
