#pragma once
// Links between threads of one process. A send only publishes (pointer, header); the receiver
// copies or reduces straight out of the sender's buffer, so a message costs one pass over memory
// and no staging copy. The sender's request completes once the receiver has consumed it.
#include <memory>
#include <vector>

#include "transport/link.h"
#include "transport/notifier.h"

namespace pycollective {

struct InprocChannel;

// Owns the channels between `size` ranks; links(rank) gives that rank's links (nullptr at rank).
class InprocFabric {
 public:
  explicit InprocFabric(int size);
  ~InprocFabric();
  int size() const { return size_; }
  std::vector<std::unique_ptr<Link>> links(int rank);

 private:
  int size_;
  std::vector<std::shared_ptr<InprocChannel>> channels_;  // [src * size + dst]
  std::vector<std::shared_ptr<Notifier>> notifiers_;      // one per rank
};

}  // namespace pycollective
