// One fusion group as one kernel: the group's nodes lowered, in order, into a kir::Kernel
// whose domain is the group's full shape S with its reduced dims R last (Note [Fusion
// groups]), reading each outside value once per broadcast pattern and writing every
// output the fusion pass asked for in the layout it chose (FusedGroup::output_metas).
// Its own file because it is the step between grouping (groups.h) and compiling: the one
// place graph values turn into kernel buffers, loads and stores.
// Preconditions: `gr` is a group of `grouping` (form_groups over `g`), `fg` lists its
// inputs and outputs. Postconditions: the kernel passes kir::verify, with size-1 dims
// dropped and adjacent dims that every access walks as one merged; a group the lowering
// cannot express throws a c10::Error (the caller leaves its nodes unfused).
#pragma once

#include "fuse/fusion.h"
#include "fuse/groups.h"
#include "kir/kir.h"

#include <tcap/graph.h>

namespace tcap::fuse {

kir::Kernel lower_group(const ir::Graph& g, const Grouping& grouping, const Group& gr, const FusedGroup& fg);

}  // namespace tcap::fuse
