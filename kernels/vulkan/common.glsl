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

// Note for kernel authors: llvmpipe (lavapipe) stops any loop after 65535 iterations, so no loop may run
// longer than that; the host splits long reductions into several dispatches (vulkan_ops.hpp kMaxLoop).
