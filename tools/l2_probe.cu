// L2 read bandwidth when many SMs read the same small buffer at once (what a streamed GRU sweep's
// product does with its h_prev / dGh shadow every step), against each SM reading a buffer of its own.
// A measurement aid for the sweep designs (docs/benchmarks.md), not part of catchat:
//   nvcc -O3 -arch=sm_90 -o /tmp/l2_probe tools/l2_probe.cu && /tmp/l2_probe
// Each block of 512 threads reads `bytes` with 16-byte L2-only loads (ld.global.cg: the sweep's
// coherent loads bypass L1 too) `reps` times; prints per-block and aggregate GB/s for 1..132 blocks.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void read_shared_buffer(const int4* __restrict__ buf, unsigned n4, size_t block_stride4, int reps,
                                   int* out) {
    const int4* mine = buf + blockIdx.x * block_stride4;
    int acc = 0;
    for (int r = 0; r < reps; ++r) {
        unsigned start = ((blockIdx.x * 97u + r * 13u) % 8u) * blockDim.x;  // blocks out of lockstep
        for (unsigned i = threadIdx.x; i < n4; i += blockDim.x) {
            unsigned j = i + start;
            int4 v = __ldcg(mine + (j < n4 ? j : j - n4));
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x12345678) out[blockIdx.x] = acc;  // keeps the loads
}

int main() {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    printf("%s: %d SMs, L2 %d KB\n", p.name, p.multiProcessorCount, p.l2CacheSize / 1024);
    const size_t sizes[] = {131072, 393216, 786432};
    const int blocks[] = {1, 16, 32, 64, 96, 128, 132};
    int4* buf;
    int* out;
    cudaMalloc(&buf, 132 * 786432);
    cudaMemset(buf, 1, 132 * 786432);
    cudaMalloc(&out, 1024 * sizeof(int));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    printf("%-8s %-6s %-8s %12s %12s %10s\n", "buffer", "blocks", "same?", "GB/s/block", "GB/s total", "us/pass");
    for (size_t bytes : sizes) {
        for (int own = 0; own < 2; ++own) {
            for (int nb : blocks) {
                if (own && (size_t)nb * bytes > (size_t)p.l2CacheSize / 2) continue;  // own buffers stay in L2
                unsigned n4 = (unsigned)(bytes / 16);
                int reps = 400;
                read_shared_buffer<<<nb, 512>>>(buf, n4, own ? n4 : 0, 20, out);  // warm
                cudaEventRecord(a);
                read_shared_buffer<<<nb, 512>>>(buf, n4, own ? n4 : 0, reps, out);
                cudaEventRecord(b);
                cudaEventSynchronize(b);
                float ms;
                cudaEventElapsedTime(&ms, a, b);
                double per_block = (double)bytes * reps / (ms * 1e-3) / 1e9;
                printf("%-8zu %-6d %-8s %12.1f %12.1f %10.2f\n", bytes, nb, own ? "own" : "same", per_block,
                       per_block * nb, ms * 1e3 / reps);
            }
        }
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { printf("CUDA error: %s\n", cudaGetErrorString(e)); return 1; }
    return 0;
}
