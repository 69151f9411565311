#include "worker/collectives/device_mesh.h"

#include <algorithm>
#include <utility>

namespace tessera::worker {

StatusOr<DeviceMesh> DeviceMesh::Create(Communicator& parent, std::vector<int> dims,
                                        std::vector<std::string> names, uint64_t first_tag) {
  std::string shape;
  int64_t size = 1;
  for (int dim : dims) {
    shape += (shape.empty() ? "" : " x ") + std::to_string(dim);
    if (dim <= 0) return InvalidArgumentError("device mesh " + shape + ": a dim is not positive");
    size *= dim;
  }
  const std::string who = "device mesh " + shape + " over " + parent.name();
  if (dims.empty() || size != parent.world_size()) {
    return InvalidArgumentError(who + ": holds " + std::to_string(size) + " ranks; " +
                                parent.name() + " has " + std::to_string(parent.world_size()));
  }
  if (names.empty()) {
    for (size_t d = 0; d < dims.size(); ++d) names.push_back(std::to_string(d));
  }
  if (names.size() != dims.size()) {
    return InvalidArgumentError(who + ": " + std::to_string(names.size()) + " names for " +
                                std::to_string(dims.size()) + " dims");
  }
  for (const std::string& name : names) {
    if (std::count(names.begin(), names.end(), name) > 1) {
      return InvalidArgumentError(who + ": the axis name " + name + " is used twice");
    }
  }
  DeviceMesh mesh;
  mesh.dims_ = std::move(dims);
  mesh.names_ = std::move(names);
  // Row-major: the last axis varies fastest.
  int rest = parent.rank();
  mesh.coordinate_.assign(mesh.dims_.size(), 0);
  for (size_t d = mesh.dims_.size(); d-- > 0;) {
    mesh.coordinate_[d] = rest % mesh.dims_[d];
    rest /= mesh.dims_[d];
  }
  for (size_t d = 0; d < mesh.dims_.size(); ++d) {
    // The ranks along axis d through this rank share every other coordinate: their color is
    // this rank's place with axis d at 0.
    std::vector<int> line = mesh.coordinate_;
    line[d] = 0;
    StatusOr<std::unique_ptr<Communicator>> group =
        parent.Split(mesh.RankAt(line), first_tag + d);
    if (!group.ok()) {
      return group.status().WithContext(who + ": making the groups along " + mesh.names_[d]);
    }
    mesh.groups_.push_back(std::move(group).value());
  }
  return mesh;
}

int DeviceMesh::RankAt(const std::vector<int>& coordinate) const {
  int rank = 0;
  for (size_t d = 0; d < dims_.size(); ++d) rank = rank * dims_[d] + coordinate[d];
  return rank;
}

StatusOr<int> DeviceMesh::AxisOf(const std::string& name) const {
  const auto at = std::find(names_.begin(), names_.end(), name);
  if (at == names_.end()) {
    std::string axes;
    for (const std::string& axis : names_) axes += (axes.empty() ? "" : ", ") + axis;
    return NotFoundError("device mesh: no axis " + name + " (its axes: " + axes + ")");
  }
  return static_cast<int>(at - names_.begin());
}

StatusOr<Communicator*> DeviceMesh::along(const std::string& name) const {
  ASSIGN_OR_RETURN(const int dim, AxisOf(name));
  return &along(dim);
}

}  // namespace tessera::worker
