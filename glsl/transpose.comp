#version 450
// y[y_off + c * rows + r] = x[x_off + r * cols + c]: a float32 matrix [rows, cols] written transposed.
// Generation's lane-split decode step reads its weights k-major, so that a subgroup's lanes (one unit
// each) load one k's weights from consecutive words (docs/generation.md). 16 x 16 tiles pass through
// shared memory, so the reads and the writes both go along rows of the tile.
layout(local_size_x = 16, local_size_y = 16) in;

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint rows, cols, x_off, y_off; } pc;

shared float tile[16][17];  // a padded row: the column reads below hit 16 different banks

void main() {
    uint r0 = gl_WorkGroupID.y * 16u, c0 = gl_WorkGroupID.x * 16u;
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    if (r0 + ty < pc.rows && c0 + tx < pc.cols) tile[ty][tx] = x[pc.x_off + (r0 + ty) * pc.cols + c0 + tx];
    barrier();
    // y's row c0 + ty is x's column c0 + ty; its entries r0 + tx along x's rows
    if (c0 + ty < pc.cols && r0 + tx < pc.rows) y[pc.y_off + (c0 + ty) * pc.rows + r0 + tx] = tile[tx][ty];
}
