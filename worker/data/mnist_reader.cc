#include "worker/data/mnist_reader.h"

#include <string_view>
#include <utility>
#include <vector>

#include "common/base/byte_cursor.h"

namespace tessera::worker::data {
namespace {

constexpr size_t kImagesHeaderBytes = 16;
constexpr size_t kLabelsHeaderBytes = 8;

// The files are usually downloaded as .gz; say so rather than just "bad magic".
std::string GzipHint(std::string_view bytes) {
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
      static_cast<unsigned char>(bytes[1]) == 0x8b) {
    return " (the file is gzip-compressed: gunzip it first)";
  }
  return "";
}

Status CheckMagic(const ByteCursor& cursor, std::string_view bytes, uint32_t magic,
                  uint32_t expected, const char* kind) {
  if (magic == expected) return OkStatus();
  return cursor.ErrorAt(0, "bad magic " + std::to_string(magic) + " (expected " +
                               std::to_string(expected) + " for an idx " + kind + " file)" +
                               GzipHint(bytes));
}

// The file must be exactly `expected` bytes (header + body). A short file's error points at
// the first missing byte, which name_element(body offset) names, e.g. "image 3 pixel 17".
template <typename NameElement>
Status CheckLength(const ByteCursor& cursor, uint64_t header_bytes, uint64_t expected,
                   const std::string& declared, NameElement name_element) {
  const uint64_t actual = cursor.file_size();
  if (actual < expected) {
    return cursor.ErrorAt(actual, "truncated in " + name_element(actual - header_bytes) +
                                      ": file ends at offset " + std::to_string(actual) + "; " +
                                      declared);
  }
  if (actual > expected) {
    return cursor.ErrorAt(expected, std::to_string(actual - expected) +
                                        " unexpected bytes after the last element; " + declared);
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<InMemoryDataset>> ReadMnist(const std::string& images_path,
                                                     const std::string& labels_path) {
  // Images.
  ASSIGN_OR_RETURN(const std::string image_bytes, ReadWholeFile(images_path));
  ByteCursor images(images_path, image_bytes);
  uint32_t magic = 0, image_count = 0, rows = 0, cols = 0;
  RETURN_IF_ERROR(images.ReadU32BigEndian("magic", &magic));
  RETURN_IF_ERROR(CheckMagic(images, image_bytes, magic, kMnistImagesMagic, "images"));
  RETURN_IF_ERROR(images.ReadU32BigEndian("image count", &image_count));
  RETURN_IF_ERROR(images.ReadU32BigEndian("rows", &rows));
  RETURN_IF_ERROR(images.ReadU32BigEndian("cols", &cols));
  if (rows == 0) return images.ErrorAt(8, "rows is 0 (must be >= 1)");
  if (cols == 0) return images.ErrorAt(12, "cols is 0 (must be >= 1)");
  // rows * cols < 2^64; times a u32 count it may overflow.
  const uint64_t pixels_per_image = uint64_t{rows} * cols;
  uint64_t pixel_bytes = 0, images_expected = 0;
  if (__builtin_mul_overflow(pixels_per_image, uint64_t{image_count}, &pixel_bytes) ||
      __builtin_add_overflow(pixel_bytes, uint64_t{kImagesHeaderBytes}, &images_expected)) {
    return images.ErrorAt(4, std::to_string(image_count) + " images of " +
                                 std::to_string(rows) + "x" + std::to_string(cols) +
                                 " pixels overflow a 64-bit file size");
  }
  RETURN_IF_ERROR(CheckLength(
      images, kImagesHeaderBytes, images_expected,
      "header declares " + std::to_string(image_count) + " images of " + std::to_string(rows) +
          "x" + std::to_string(cols) + " = " + std::to_string(images_expected) + " bytes",
      [&](uint64_t body_offset) {
        return "image " + std::to_string(body_offset / pixels_per_image) + " pixel " +
               std::to_string(body_offset % pixels_per_image);
      }));

  // Labels.
  ASSIGN_OR_RETURN(const std::string label_bytes, ReadWholeFile(labels_path));
  ByteCursor labels(labels_path, label_bytes);
  uint32_t label_count = 0;
  RETURN_IF_ERROR(labels.ReadU32BigEndian("magic", &magic));
  RETURN_IF_ERROR(CheckMagic(labels, label_bytes, magic, kMnistLabelsMagic, "labels"));
  RETURN_IF_ERROR(labels.ReadU32BigEndian("label count", &label_count));
  if (label_count != image_count) {
    return labels.ErrorAt(4, "label count " + std::to_string(label_count) +
                                 " does not match image count " + std::to_string(image_count) +
                                 " in " + images_path);
  }
  const uint64_t labels_expected = uint64_t{kLabelsHeaderBytes} + label_count;
  RETURN_IF_ERROR(CheckLength(
      labels, kLabelsHeaderBytes, labels_expected,
      "header declares " + std::to_string(label_count) + " labels = " +
          std::to_string(labels_expected) + " bytes",
      [](uint64_t body_offset) { return "label " + std::to_string(body_offset); }));

  // Both files have exactly the declared sizes, so the allocations below are bounded by the
  // bytes already in memory.
  const auto n = static_cast<size_t>(image_count);
  const auto dim = static_cast<size_t>(pixels_per_image);
  std::vector<int64_t> label_values(n);
  for (size_t i = 0; i < n; ++i) {
    const auto label = static_cast<unsigned char>(label_bytes[kLabelsHeaderBytes + i]);
    if (label >= kMnistNumClasses) {
      return labels.ErrorAt(kLabelsHeaderBytes + i,
                            "label " + std::to_string(i) + " is " + std::to_string(label) +
                                " (must be in [0, " + std::to_string(kMnistNumClasses) + "))");
    }
    label_values[i] = label;
  }
  std::vector<float> features(n * dim);
  const auto* pixels = reinterpret_cast<const unsigned char*>(image_bytes.data()) +
                       kImagesHeaderBytes;
  for (size_t k = 0; k < features.size(); ++k) features[k] = pixels[k] / 255.0f;

  auto dataset = InMemoryDataset::Create(dim, kMnistNumClasses, std::move(features),
                                         std::move(label_values));
  if (!dataset.ok()) return dataset.status().WithContext(images_path);  // a bug: validated
  return dataset;
}

}  // namespace tessera::worker::data
