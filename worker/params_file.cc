#include "worker/params_file.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/base/atomic_file.h"

namespace tessera::worker {

Status SaveParams(const std::string& path, const ParameterLayout& layout,
                  const std::vector<float>& params) {
  if (params.size() != layout.total_size()) {
    return InvalidArgumentError("save params " + path + ": " + std::to_string(params.size()) +
                                " values for a layout of " + std::to_string(layout.total_size()));
  }
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the format is little-endian");
  nlohmann::json manifest;
  manifest["format"] = "tessera-params-v1";
  manifest["dtype"] = "float32";
  manifest["byte_order"] = "little";
  manifest["total_elements"] = layout.total_size();
  manifest["parameters"] = nlohmann::json::array();
  for (const ParameterView& view : layout.views()) {
    manifest["parameters"].push_back(
        {{"name", view.name}, {"shape", view.shape}, {"offset", view.offset}});
  }
  RETURN_IF_ERROR(WriteFileAtomically(path, params.data(), params.size() * sizeof(float)));
  const std::string text = manifest.dump(2) + "\n";
  return WriteFileAtomically(path + ".json", text.data(), text.size());
}

StatusOr<LoadedParams> LoadParams(const std::string& path) {
  const std::string manifest_path = path + ".json";
  std::ifstream manifest_file(manifest_path);
  if (!manifest_file) return NotFoundError("cannot open the manifest " + manifest_path);
  LoadedParams loaded;
  try {
    nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    if (manifest.value("format", "") != "tessera-params-v1") {
      return InvalidArgumentError(manifest_path + ": not a tessera-params-v1 manifest");
    }
    for (const auto& entry : manifest.at("parameters")) {
      ASSIGN_OR_RETURN(const ParameterView* view,
                       loaded.layout.Add(entry.at("name").get<std::string>(),
                                         entry.at("shape").get<std::vector<int64_t>>()));
      if (view->offset != entry.at("offset").get<uint64_t>()) {
        return InvalidArgumentError(manifest_path + ": parameter '" + view->name +
                                    "' has offset " + entry.at("offset").dump() +
                                    "; parameters must be contiguous in order (expected " +
                                    std::to_string(view->offset) + ")");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(manifest_path + ": " + e.what());
  }
  std::ifstream data(path, std::ios::binary | std::ios::ate);
  if (!data) return NotFoundError("cannot open the parameter file " + path);
  const uint64_t bytes = static_cast<uint64_t>(data.tellg());
  const uint64_t expected = loaded.layout.total_size() * sizeof(float);
  if (bytes != expected) {
    return DataLossError(path + " has " + std::to_string(bytes) + " bytes; its manifest describes " +
                         std::to_string(loaded.layout.total_size()) + " float32 values (" +
                         std::to_string(expected) + " bytes)");
  }
  loaded.values.resize(loaded.layout.total_size());
  data.seekg(0);
  data.read(reinterpret_cast<char*>(loaded.values.data()), static_cast<std::streamsize>(bytes));
  if (!data) return DataLossError("cannot read " + path);
  return loaded;
}

}  // namespace tessera::worker
