// DeviceMesh: a communicator's ranks laid out as an n-dimensional array with named axes, and
// for each axis the group of the ranks that differ from this one along it alone: the rows and
// columns of a 2 x 2 mesh, HSDP's shard and replicate groups, DP x PP x TP. As later PyTorch
// releases' init_device_mesh (torch.distributed.device_mesh).
//
//   // 4 ranks as 2 x 2: rank = 2 * dp + tp.
//   ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(*world, {2, 2}, {"dp", "tp"}, tag));
//   ASSIGN_OR_RETURN(Communicator* tp, mesh.along("tp"));  // ranks {0,1} or {2,3}
//   RETURN_IF_ERROR(tp->AllReduce(...));
//   RETURN_IF_ERROR(mesh.along(0).AllReduce(...));         // dp: ranks {0,2} or {1,3}
//
// Ranks are laid out row-major: the last axis varies fastest. Every axis's groups are made by
// one Split of the parent, so a mesh of D axes costs D collectives to make, and its groups
// share the parent's endpoint (communicator.h).
//
// Thread-safety: the axes' communicators are thread-safe; the mesh itself is read-only.
#ifndef TESSERA_WORKER_COLLECTIVES_DEVICE_MESH_H_
#define TESSERA_WORKER_COLLECTIVES_DEVICE_MESH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "worker/collectives/communicator.h"

namespace tessera::worker {

class DeviceMesh {
 public:
  // Collective over `parent` (every rank calls it alike): tags first_tag .. first_tag + D - 1
  // in the parent. InvalidArgument if the dims' product is not the parent's size, a dim is not
  // positive, or the names are not one per dim and distinct (empty names: "0", "1", ...).
  static StatusOr<DeviceMesh> Create(Communicator& parent, std::vector<int> dims,
                                     std::vector<std::string> names, uint64_t first_tag);

  const std::vector<int>& dims() const { return dims_; }
  const std::vector<std::string>& names() const { return names_; }
  // This rank's place: coordinate()[d] is its index along axis d.
  const std::vector<int>& coordinate() const { return coordinate_; }
  // The parent's rank at `coordinate`.
  int RankAt(const std::vector<int>& coordinate) const;

  // The group along axis `dim` through this rank; its rank is this rank's coordinate on that
  // axis. REQUIRES: 0 <= dim < dims().size().
  Communicator& along(int dim) const { return *groups_[static_cast<size_t>(dim)]; }
  // The same for the axis named `name`; NotFound (AxisOf) for a name the mesh has not.
  StatusOr<Communicator*> along(const std::string& name) const;
  // The index of the axis named `name`; NotFound naming the mesh's axes.
  StatusOr<int> AxisOf(const std::string& name) const;

 private:
  std::vector<int> dims_;
  std::vector<std::string> names_;
  std::vector<int> coordinate_;
  std::vector<std::shared_ptr<Communicator>> groups_;  // by axis
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_DEVICE_MESH_H_
