// tcap: graph capture and compilation for pure C++ LibTorch programs. The one include.
#pragma once

#define TCAP_VERSION_STRING "0.1.0"

#include <tcap/buffer_pool.h>
#include <tcap/capture.h>
#include <tcap/clip_grad.h>
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/export.h>
#include <tcap/graph.h>
#include <tcap/graph_json.h>
#include <tcap/interpreter.h>
#include <tcap/partition.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>
