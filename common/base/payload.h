// Payload: a read-only byte range with shared ownership, sent and received as one ZeroMQ frame
// without copying.
//
// A payload either owns its bytes (FromVector, Copy) or borrows memory that `owner` keeps
// alive (Borrow: e.g. a slice of a flat gradient buffer held by a shared_ptr). The transport
// hands the owner to ZeroMQ, which releases it once the bytes are on the wire; on receive, the
// ZeroMQ frame itself becomes the owner. The bytes must not change while any Payload refers to
// them.
//
// Thread-safety: immutable after construction; copies share the bytes.
#ifndef TESSERA_COMMON_BASE_PAYLOAD_H_
#define TESSERA_COMMON_BASE_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

class Payload {
 public:
  Payload() = default;

  static Payload FromVector(std::vector<uint8_t> bytes) {
    auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    const uint8_t* data = owned->data();
    size_t size = owned->size();
    return Payload(data, size, std::move(owned));
  }
  static Payload Copy(const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    return FromVector(std::vector<uint8_t>(bytes, bytes + size));
  }
  static Payload FromString(const std::string& text) { return Copy(text.data(), text.size()); }
  // REQUIRES: `owner` keeps [data, data + size) alive and unchanged.
  static Payload Borrow(const void* data, size_t size, std::shared_ptr<const void> owner) {
    return Payload(static_cast<const uint8_t*>(data), size, std::move(owner));
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  Payload(const uint8_t* data, size_t size, std::shared_ptr<const void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

// One message on the wire: a FlatBuffers `tessera.proto.Header` plus raw payload frames.
struct Message {
  Payload header;
  std::vector<Payload> payloads;

  uint64_t TotalBytes() const {
    uint64_t total = header.size();
    for (const Payload& p : payloads) total += p.size();
    return total;
  }
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_PAYLOAD_H_
