#include "common/base/byte_cursor.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>
#include <utility>

namespace tessera {
namespace {

std::string ErrnoText(int error) { return std::generic_category().message(error); }

Status OpenError(const std::string& path, int error) {
  std::string message = path + ": cannot open: " + ErrnoText(error);
  if (error == ENOENT) return NotFoundError(std::move(message));
  return UnavailableError(std::move(message));
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

}  // namespace

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return OpenError(path, errno);
  // Read in chunks rather than trusting a size from fseek/ftell: works for pipes and for files
  // that change size while we read, and the size we report is what we actually got.
  std::string contents;
  char chunk[1 << 16];
  while (true) {
    const size_t got = std::fread(chunk, 1, sizeof(chunk), file.get());
    contents.append(chunk, got);
    if (got < sizeof(chunk)) break;
  }
  if (std::ferror(file.get())) {
    return DataLossError(path + ": read error at offset " + std::to_string(contents.size()) +
                         ": " + ErrnoText(errno));
  }
  return contents;
}

Status ByteCursor::ErrorAt(size_t offset, std::string_view message) const {
  std::string text = file_name_ + ": offset " + std::to_string(offset) + ": ";
  text += message;
  return DataLossError(std::move(text));
}

Status ByteCursor::Take(std::string_view what, size_t n, const unsigned char** field) {
  if (remaining() < n) {
    std::string message = "truncated in ";
    message += what;
    message += ": need " + std::to_string(n) + " bytes, file ends at offset " +
               std::to_string(bytes_.size());
    return ErrorAt(offset_, message);
  }
  *field = reinterpret_cast<const unsigned char*>(bytes_.data()) + offset_;
  offset_ += n;
  return OkStatus();
}

// Fields are assembled byte by byte, so decoding does not depend on the host's byte order or
// on the field's alignment.
Status ByteCursor::ReadU32BigEndian(std::string_view what, uint32_t* out) {
  const unsigned char* p;
  RETURN_IF_ERROR(Take(what, 4, &p));
  *out = uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
  return OkStatus();
}

Status ByteCursor::ReadU32LittleEndian(std::string_view what, uint32_t* out) {
  const unsigned char* p;
  RETURN_IF_ERROR(Take(what, 4, &p));
  *out = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  return OkStatus();
}

Status ByteCursor::ReadU64LittleEndian(std::string_view what, uint64_t* out) {
  const unsigned char* p;
  RETURN_IF_ERROR(Take(what, 8, &p));
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | p[i];
  *out = value;
  return OkStatus();
}

Status ByteCursor::ReadI32LittleEndian(std::string_view what, int32_t* out) {
  uint32_t bits;
  RETURN_IF_ERROR(ReadU32LittleEndian(what, &bits));
  *out = static_cast<int32_t>(bits);  // two's complement (guaranteed since C++20, universal)
  return OkStatus();
}

Status ByteCursor::ReadF32LittleEndian(std::string_view what, float* out) {
  uint32_t bits;
  RETURN_IF_ERROR(ReadU32LittleEndian(what, &bits));
  static_assert(sizeof(float) == 4, "float32 expected");
  std::memcpy(out, &bits, sizeof(bits));
  return OkStatus();
}

Status ByteCursor::ReadBytes(std::string_view what, size_t n, std::string_view* out) {
  const unsigned char* p;
  RETURN_IF_ERROR(Take(what, n, &p));
  *out = std::string_view(reinterpret_cast<const char*>(p), n);
  return OkStatus();
}

}  // namespace tessera
