#include "server/ps/tensor_store.h"

#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include "common/metrics/metric_names.h"

namespace tessera::server {
namespace {

constexpr size_t kFloatBytes = sizeof(float);

// Elements of `shape`, or an error naming the tensor for a negative or overflowing dimension.
StatusOr<uint64_t> ElementCount(const std::string& name, const std::vector<int64_t>& shape) {
  uint64_t elements = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return InvalidArgumentError("tensor '" + name + "' has a negative dimension in shape " +
                                  FormatShape(shape));
    }
    uint64_t d = static_cast<uint64_t>(dim);
    if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / kFloatBytes / d) {
      return InvalidArgumentError("tensor '" + name + "' shape " + FormatShape(shape) +
                                  " overflows");
    }
    elements *= d;
  }
  return elements;
}

}  // namespace

TensorStoreOptions TensorStoreOptionsFrom(const FleetView& view, int server_rank) {
  TensorStoreOptions options;
  options.server_rank = server_rank;
  options.num_servers = view.num_servers;
  options.key_space = view.key_space;
  return options;
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::vector<float> StoredTensor::Values() const {
  std::vector<float> values(bytes->size() / kFloatBytes);
  if (!values.empty()) std::memcpy(values.data(), bytes->data(), values.size() * kFloatBytes);
  return values;
}

TensorStore::TensorStore(const TensorStoreOptions& options) : options_(options) {
  std::tie(key_begin_, key_end_) =
      ServerKeyRange(options.key_space, options.num_servers, options.server_rank);
}

StatusOr<std::unique_ptr<TensorStore>> TensorStore::Create(const TensorStoreOptions& options,
                                                           MetricsRegistry* metrics) {
  if (options.num_servers <= 0 || options.server_rank < 0 ||
      options.server_rank >= options.num_servers) {
    return InvalidArgumentError("tensor store: server rank " +
                                std::to_string(options.server_rank) + " is not in [0, " +
                                std::to_string(options.num_servers) + ")");
  }
  std::unique_ptr<TensorStore> store(new TensorStore(options));
  if (metrics != nullptr) RETURN_IF_ERROR(store->RegisterMetrics(metrics));
  return store;
}

Status TensorStore::RegisterMetrics(MetricsRegistry* metrics) {
  namespace names = metric_names;
  ASSIGN_OR_RETURN(GaugeFamily * keys,
                   metrics->RegisterGauge(names::kServerKeys.name, names::kServerKeys.help));
  ASSIGN_OR_RETURN(keys_gauge_, keys->WithLabels({}));
  ASSIGN_OR_RETURN(GaugeFamily * bytes,
                   metrics->RegisterGauge(names::kServerBytes.name, names::kServerBytes.help));
  ASSIGN_OR_RETURN(bytes_gauge_, bytes->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * pushes, metrics->RegisterCounter(
                                               names::kServerPushesTotal.name,
                                               names::kServerPushesTotal.help));
  ASSIGN_OR_RETURN(pushes_, pushes->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * pulls, metrics->RegisterCounter(names::kServerPullsTotal.name,
                                                                   names::kServerPullsTotal.help));
  ASSIGN_OR_RETURN(pulls_, pulls->WithLabels({}));
  return OkStatus();
}

int TensorStore::OwnerOf(uint64_t key) const {
  for (int rank = 0; rank < options_.num_servers; ++rank) {
    auto [begin, end] = ServerKeyRange(options_.key_space, options_.num_servers, rank);
    if (key >= begin && key < end) return rank;
  }
  return -1;
}

Status TensorStore::CheckOwnedKey(uint64_t key, const std::string& name) const {
  if (key >= key_begin_ && key < key_end_) return OkStatus();
  std::string where = "tensor '" + name + "' key " + std::to_string(key) + " is not on server " +
                      std::to_string(options_.server_rank) + " (which owns keys [" +
                      std::to_string(key_begin_) + ", " + std::to_string(key_end_) + "))";
  int owner = OwnerOf(key);
  if (owner < 0) {
    return InvalidArgumentError(where + ": it is outside the key space [0, " +
                                std::to_string(options_.key_space) + ")");
  }
  return InvalidArgumentError(where + ": it belongs to server " + std::to_string(owner));
}

Status TensorStore::Put(const std::vector<TensorValue>& tensors) {
  // Checks that need no stored state, and the copies, happen outside the lock.
  std::vector<StoredTensor> incoming;
  incoming.reserve(tensors.size());
  std::set<uint64_t> keys;
  for (const TensorValue& t : tensors) {
    RETURN_IF_ERROR(CheckOwnedKey(t.key, t.name));
    if (!keys.insert(t.key).second) {
      return InvalidArgumentError("tensor '" + t.name + "' key " + std::to_string(t.key) +
                                  " appears twice in one push to server " +
                                  std::to_string(options_.server_rank));
    }
    ASSIGN_OR_RETURN(uint64_t elements, ElementCount(t.name, t.shape));
    if (t.bytes.size() != elements * kFloatBytes) {
      return InvalidArgumentError("tensor '" + t.name + "' of shape " + FormatShape(t.shape) +
                                  " needs " + std::to_string(elements * kFloatBytes) +
                                  " bytes of float32 but " + std::to_string(t.bytes.size()) +
                                  " were given");
    }
    StoredTensor stored;
    stored.name = t.name;
    stored.key = t.key;
    stored.shape = t.shape;
    stored.bytes = std::make_shared<const std::vector<uint8_t>>(t.bytes.data(),
                                                                t.bytes.data() + t.bytes.size());
    incoming.push_back(std::move(stored));
  }

  std::lock_guard<std::mutex> lock(mu_);
  // Checks against what is stored, all before the first write: a push is stored whole or not
  // at all.
  for (const StoredTensor& t : incoming) {
    auto it = tensors_.find(t.key);
    if (it == tensors_.end()) continue;
    const StoredTensor& old = it->second;
    if (old.name != t.name) {
      return InvalidArgumentError("tensor '" + t.name + "' key " + std::to_string(t.key) +
                                  " on server " + std::to_string(options_.server_rank) +
                                  " already holds tensor '" + old.name + "'");
    }
    if (old.shape != t.shape) {
      return InvalidArgumentError("tensor '" + t.name + "' on server " +
                                  std::to_string(options_.server_rank) + " has shape " +
                                  FormatShape(old.shape) + "; a push of shape " +
                                  FormatShape(t.shape) + " cannot replace it");
    }
  }
  for (StoredTensor& t : incoming) {
    auto it = tensors_.find(t.key);
    if (it != tensors_.end()) total_bytes_ -= it->second.bytes->size();
    total_bytes_ += t.bytes->size();
    tensors_[t.key] = std::move(t);
  }
  if (pushes_ != nullptr) pushes_->Increment(static_cast<double>(incoming.size()));
  UpdateGaugesLocked();
  return OkStatus();
}

StatusOr<StoredTensor> TensorStore::Get(uint64_t key, const std::string& name) const {
  RETURN_IF_ERROR(CheckOwnedKey(key, name));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    return NotFoundError("tensor '" + name + "' (key " + std::to_string(key) +
                         ") is not on server " + std::to_string(options_.server_rank) +
                         ": nothing was pushed to it yet");
  }
  if (it->second.name != name) {
    return InvalidArgumentError("key " + std::to_string(key) + " on server " +
                                std::to_string(options_.server_rank) + " holds tensor '" +
                                it->second.name + "', not '" + name + "'");
  }
  if (pulls_ != nullptr) pulls_->Increment();
  return it->second;
}

size_t TensorStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_.size();
}

uint64_t TensorStore::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_bytes_;
}

void TensorStore::UpdateGaugesLocked() {
  if (keys_gauge_ != nullptr) keys_gauge_->Set(static_cast<double>(tensors_.size()));
  if (bytes_gauge_ != nullptr) bytes_gauge_->Set(static_cast<double>(total_bytes_));
}

}  // namespace tessera::server
