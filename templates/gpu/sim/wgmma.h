// convgen SIMT simulator, part 5: warpgroup MMA (wgmma.mma_async, sm_90a), both operands from shared
// memory by matrix descriptors. Included by cuda.h under -DCONVGEN_SIM (after async_copy.h) for its
// convgen_wgmma* wrappers.
//
// From the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate", its matrix descriptor
// format and shared-memory layouts), for m64nNk16 with 16-bit multiplicands and f32 accumulators:
//   - the descriptor: start address >> 4 in bits 0-13, leading-dimension byte offset (LBO) >> 4 in
//     16-29, stride-dimension byte offset (SBO) >> 4 in 32-45, base offset in 49-51, swizzle in 62-63
//     (1: 128-byte, 2: 64-byte, 3: 32-byte; 0, no swizzle, is not emulated: convgen never uses it);
//   - an operand is made of swizzle atoms of 8 rows of W bytes (W the swizzle's width): K-major, rows
//     along M (N) W bytes of K each, 8-row groups SBO apart (LBO unused); MN-major, rows along K of
//     W bytes of M (N), 8-row groups along K SBO apart, atoms along M (N) LBO apart;
//   - the swizzle acts on the shared address: its 16-byte chunk bits (from bit 4) are XORed with the
//     bits from bit 7 (3, 2 or 1 of them for W = 128, 64, 32), so an atom starts on a W * 8-byte
//     boundary (the base offset field, for atoms that do not, must be 0 here);
//   - thread t of the warpgroup (warp w = t / 32, lane l) holds accumulators d[0 .. N/2): d[i] at row
//     16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2.
// Each thread emulates its own accumulators (the instruction is a warpgroup's, its operands the same
// for all: each thread reads the rows and columns its accumulators need). The semantics are kept
// asynchronous, as the copies' are: an MMA only records what it will do at its issue; it reads shared
// memory and updates the accumulators when the thread's wgmma.wait_group covers its commit group. A
// kernel that reads its accumulators before that wait reads the old values, and one that overwrites a
// stage the MMA has not read yet feeds it the new bytes (and the racecheck sees the write and the
// read unordered): both show as wrong answers or a race, as on the device. Sums run in f32 in k order
// from the accumulator, a product at a time (exact for 16-bit operands), as for mma.sync.
#pragma once

namespace convgen_sim {

struct SharedMatrix {
    unsigned start, lbo, sbo, width;   // bytes; width: the swizzle's (128, 64, 32)
    bool mn_major;
};

CONVGEN_SIM_UNCHECKED inline SharedMatrix shared_matrix(unsigned long long desc, bool mn_major, const char* which,
                                                        const void* pc) {
    const unsigned mode = static_cast<unsigned>(desc >> 62), base_offset = static_cast<unsigned>(desc >> 49 & 7);
    const unsigned width = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
    if (!width || base_offset) {
        char text[240];
        std::snprintf(text, sizeof text, "wgmma at %s: %s descriptor 0x%016llx has %s; the simulator emulates the "
                      "128-, 64- and 32-byte swizzles with atoms on their boundary (base offset 0)",
                      pc_text(pc).c_str(), which, desc, !width ? "no swizzle (mode 0)" : "a non-zero base offset");
        fail(text);
    }
    return {static_cast<unsigned>(desc & 0x3fff) << 4, static_cast<unsigned>(desc >> 16 & 0x3fff) << 4,
            static_cast<unsigned>(desc >> 32 & 0x3fff) << 4, width, mn_major};
}

// The shared address of element (mn, k) (mn: a row of A or a column of B; k < 16) of an operand.
CONVGEN_SIM_UNCHECKED inline unsigned shared_element(const SharedMatrix& m, int mn, int k) {
    unsigned linear;
    if (!m.mn_major) {
        linear = m.start + static_cast<unsigned>(mn / 8) * m.sbo + static_cast<unsigned>(mn % 8) * m.width + 2u * k;
    } else {
        const int atom = static_cast<int>(m.width / 2);   // elements of M (N) an atom's row holds
        linear = m.start + static_cast<unsigned>(mn / atom) * m.lbo + static_cast<unsigned>(k / 8) * m.sbo +
                 static_cast<unsigned>(k % 8) * m.width + 2u * static_cast<unsigned>(mn % atom);
    }
    const unsigned bits = m.width / 16 - 1;   // 7, 3, 1
    return linear ^ ((linear >> 7 & bits) << 4);
}

CONVGEN_SIM_UNCHECKED inline float shared_value(const SharedMatrix& m, int mn, int k, const AsyncMma& op, const char* what) {
    unsigned char* const base = worker().checks->shared;   // the block's shared window starts at address 0
    const unsigned char* p = base + shared_element(m, mn, k);
    tensor_read(p, 2, what, op.pc);
    unsigned short bits;
    std::memcpy(&bits, p, 2);
    return op.to_f32(bits);
}

// One MMA, now: the thread's accumulators += A (64 x 16) B (16 x N) at its rows and columns.
CONVGEN_SIM_UNCHECKED inline void wgmma_run(const AsyncMma& op) {
    const unsigned t = worker().current->linear % 128, warp = t / 32, lane = t % 32;
    const SharedMatrix a = shared_matrix(op.a, op.trans_a, "A's", op.pc), b = shared_matrix(op.b, op.trans_b, "B's", op.pc);
    float rows[2][16];
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 16; ++k)
            rows[h][k] = shared_value(a, static_cast<int>(16 * warp + lane / 4 + 8 * h), k, op, "wgmma's A operand");
    for (int j = 0; j < op.n / 8; ++j)
        for (int c = 0; c < 2; ++c) {
            const int col = 8 * j + 2 * static_cast<int>(lane % 4) + c;
            float column[16];
            for (int k = 0; k < 16; ++k) column[k] = shared_value(b, col, k, op, "wgmma's B operand");
            for (int h = 0; h < 2; ++h) {
                float& d = op.d[4 * j + 2 * h + c];
                float sum = d;
                for (int k = 0; k < 16; ++k) sum = std::fmaf(rows[h][k], column[k], sum);
                d = sum;
            }
        }
}

// Issued by the thread: recorded, run at the wait that covers its group.
template <class Bits>
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void wgmma_issue(float* d, int n, unsigned long long a,
                                                                        unsigned long long b, bool trans_a, bool trans_b) {
    Inside inside;
    Fiber& f = *worker().current;
    if (blockDim.x * blockDim.y * blockDim.z % 128)
        fail("wgmma: the block's threads are not whole warpgroups of 128");
    if (f.linear % CONVGEN_SIM_WARP == 0) tensor_instruction();
    f.mmas.push_back({d, n, a, b, trans_a, trans_b, &Bits::to_f32, f.mma_groups, __builtin_return_address(0)});
}

CONVGEN_SIM_UNCHECKED inline void wgmma_commit() { ++worker().current->mma_groups; }

CONVGEN_SIM_UNCHECKED inline void wgmma_wait(unsigned newest_pending) {
    Inside inside;
    Fiber& f = *worker().current;
    const unsigned long long done_below = f.mma_groups > newest_pending ? f.mma_groups - newest_pending : 0;
    std::vector<AsyncMma> still;
    for (const AsyncMma& op : f.mmas) {
        if (op.group >= done_below) still.push_back(op);
        else wgmma_run(op);
    }
    f.mmas.swap(still);
}

}  // namespace convgen_sim
