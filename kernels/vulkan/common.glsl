// Shared by every Kiln compute kernel. Conventions (the host side is backends/vulkan/encoder.cpp):
//  - storage buffers of float at set 0, bindings 0..7, declared with BUF_RO / BUF_RW / BUF_WO;
//  - the push-constant block starts with base0..base7: the element offset of each binding inside its
//    descriptor range (views need not be aligned to minStorageBufferOffsetAlignment); the kernel's own
//    parameters follow (at most 96 bytes of 4-byte scalars).
#extension GL_GOOGLE_include_directive : require

#define KILN_PUSH_BEGIN                         \
  layout(push_constant, std430) uniform Push {  \
    uint base0; uint base1; uint base2; uint base3; \
    uint base4; uint base5; uint base6; uint base7;
#define KILN_PUSH_END } pc;

#define BUF_RO(b, name) layout(set = 0, binding = b, std430) readonly buffer Buf##b { float name[]; };
#define BUF_WO(b, name) layout(set = 0, binding = b, std430) writeonly buffer Buf##b { float name[]; };
#define BUF_RW(b, name) layout(set = 0, binding = b, std430) buffer Buf##b { float name[]; };

// Grid-stride loop over [0, n) for a 1-D dispatch.
#define FOR_EACH_INDEX(i, n) \
  for (uint i = gl_GlobalInvocationID.x; i < (n); i += gl_NumWorkGroups.x * gl_WorkGroupSize.x)
// The same over [begin, end): a dispatch covering one range of a longer loop (the loop budget below).
#define FOR_EACH_INDEX_IN(i, begin, end) \
  for (uint i = (begin) + gl_GlobalInvocationID.x; i < (end); i += gl_NumWorkGroups.x * gl_WorkGroupSize.x)

// Note for kernel authors: llvmpipe (lavapipe) counts the loop iterations of each invocation, all loops
// together (nested and sequential), and silently leaves the running loop once 65535 have run. Every kernel must
// keep the total per invocation within vulkan_ops.hpp kLoopBudget: the host splits long work into dispatches
// (split_loops), and constant loops meant not to count are marked KILN_UNROLL.
#extension GL_EXT_control_flow_attributes : require
#define KILN_UNROLL [[unroll]]
