#version 450
// The float32 streamed forward sweep's copy of W_hh (glsl/gru_forward_stream.comp with F32 and
// W_SLICES): y holds W_hh [3H, H] (rows g * H + j: gate g, unit j) slice by slice, each slice's 16
// units k quad by k quad, each quad its 48 rows (g * 16 + j % 16) of 4 floats:
//   y[y_off + ((j / 16) * (H / 4) + k / 4) * 192 + (g * 16 + j % 16) * 4 + k % 4] = x[x_off + (g * H + j) * H + k]
// so the 6 load instructions of a subgroup's k quad each read 128 contiguous bytes (row-major, each
// read 8 rows 8 KB apart). Refreshed after every parameter change; grid-stride over the 3 H^2 floats.
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint H; uint x_off; uint y_off; } pc;

void main() {
    uint H = pc.H, n = 3u * H * H, stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {  // i: the destination, so writes coalesce
        uint e = (i / 4u) % 48u, q = (i / 192u) % (H / 4u), s = i / (48u * H);
        uint row = (e / 16u) * H + 16u * s + e % 16u, k = 4u * q + i % 4u;
        y[pc.y_off + i] = x[pc.x_off + row * H + k];
    }
}
