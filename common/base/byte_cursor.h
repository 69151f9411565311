// ReadWholeFile and ByteCursor: the file readers' shared way of decoding fixed-width fields
// from a file's bytes, so that every error names the file and the byte offset of the field
// that went wrong ("data/train.bin: offset 36: truncated in sample 1 label: need 4 bytes,
// file ends at offset 38").
//
// Errors: NotFound when the file does not exist, Unavailable when it cannot be opened for
// another reason, DataLoss when reading fails (each quoting the OS's reason) and when bytes are
// missing or wrong.
//
// Thread-safety: ReadWholeFile is thread-safe; a ByteCursor is not (it has a position), use
// one per thread.
#ifndef TESSERA_COMMON_BASE_BYTE_CURSOR_H_
#define TESSERA_COMMON_BASE_BYTE_CURSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/base/status.h"

namespace tessera {

// The file's contents. Errors name the path.
StatusOr<std::string> ReadWholeFile(const std::string& path);

// Reads fields front to back from `bytes`, which belong to `file_name` (used in errors only).
// REQUIRES: `bytes` outlives the cursor (it is not copied).
class ByteCursor {
 public:
  ByteCursor(std::string file_name, std::string_view bytes)
      : file_name_(std::move(file_name)), bytes_(bytes) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }
  size_t file_size() const { return bytes_.size(); }

  // Each reads the field at offset() and advances past it; `what` names the field in errors.
  // On error (too few bytes left) nothing is consumed.
  Status ReadU32BigEndian(std::string_view what, uint32_t* out);
  Status ReadU32LittleEndian(std::string_view what, uint32_t* out);
  Status ReadU64LittleEndian(std::string_view what, uint64_t* out);
  Status ReadI32LittleEndian(std::string_view what, int32_t* out);
  Status ReadF32LittleEndian(std::string_view what, float* out);
  // `*out` views `n` bytes inside the cursor's buffer.
  Status ReadBytes(std::string_view what, size_t n, std::string_view* out);

  // DataLoss "file_name: offset <offset>: message".
  Status ErrorAt(size_t offset, std::string_view message) const;

 private:
  Status Take(std::string_view what, size_t n, const unsigned char** field);

  std::string file_name_;
  std::string_view bytes_;
  size_t offset_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_BYTE_CURSOR_H_
