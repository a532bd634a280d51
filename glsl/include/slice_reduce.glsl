// Sum NV partial sums across the SL threads (slices) of a subgroup that hold them, the reduction
// of the register-resident sweeps (gru_*_resident.comp). The first NTR levels are transposed:
// each halves the values a thread holds (it keeps one half and adds its partner's copy of that
// half), so the shuffles move NV - NV/2^NTR values instead of NV*LOG2SL; the remaining levels are
// a plain butterfly (both partners get a + b, bitwise equal). Afterwards the thread holds
// NF = NV >> NTR sums in acc[0 .. NF), for the value indices returned + 0 .. NF-1; threads whose
// slice bits below SL >> NTR differ hold the same ones. The order of additions is fixed:
// deterministic. The includer defines NV, NF, SL, LOG2SL and NTR (SL = 1: nothing to do).
#ifndef CATCHAT_SLICE_REDUCE_GLSL
#define CATCHAT_SLICE_REDUCE_GLSL
#if SL > 1
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

uint slice_reduce(inout float acc[NV], uint sl) {
    uint off = 0u;
#if SL > 1
    [[unroll]] for (uint l = 0u; l < NTR; ++l) {
        uint m = SL >> (l + 1u), h = NV >> (l + 1u);
        bool up = (sl & m) != 0u;
        [[unroll]] for (uint i = 0u; i < h; ++i) {
            float mine = up ? acc[i + h] : acc[i];
            float send = up ? acc[i] : acc[i + h];
            acc[i] = mine + subgroupShuffleXor(send, m);
        }
        if (up) off += h;
    }
    [[unroll]] for (uint l = NTR; l < LOG2SL; ++l) {
        uint m = SL >> (l + 1u);
        [[unroll]] for (uint f = 0u; f < NF; ++f) acc[f] += subgroupShuffleXor(acc[f], m);
    }
#endif
    return off;
}

// Does slice sl write its NF sums (one writer per distinct set)?
bool slice_writes(uint sl) { return (sl & ((SL >> NTR) - 1u)) == 0u; }
#endif
