// convgen SIMT simulator, part 3: matrix instructions. Included by cuda.h/hip.h under -DCONVGEN_SIM
// (after simt.h), which turn their `convgen_mma_sync` into one of the emulations below.
//
// Each emulation is a warp collective (Coll::Matrix): every lane of a full warp must reach the same
// call site (simt.h's resolve_collectives checks it, as for shuffles), each lane offering a record
// with pointers to its own fragment registers. When all have arrived the emulation gathers the
// whole warp's A, B and C fragments into matrices by the vendor's documented fragment layout,
// computes D = A B + C in f32 -- every product exact (a 16-bit float or a tf32 value has at most 11
// significant bits, so a product fits f32's 24), the sum in f32 in k order, starting from C -- and scatters D
// back by the same layout. The hardware's order of accumulation inside one instruction is not
// documented; results may differ from a device in the last bits of a sum, never in which element
// goes where. Every layout is checked to cover each matrix element exactly once.
#pragma once

#include <cmath>

#pragma GCC visibility push(hidden)   // the library's own, as simt.h's
namespace convgen_sim {

// 16-bit float bits to f32, exactly (no rounding is involved in either direction here).
struct Bf16Bits {
    CONVGEN_SIM_UNCHECKED static float to_f32(unsigned short bits) {
        uint32_t word = static_cast<uint32_t>(bits) << 16;
        float v;
        std::memcpy(&v, &word, sizeof v);
        return v;
    }
};
struct F16Bits {
    CONVGEN_SIM_UNCHECKED static float to_f32(unsigned short bits) {
        int exponent = bits >> 10 & 31, mantissa = bits & 1023;
        float magnitude = exponent == 0    ? std::ldexp(static_cast<float>(mantissa), -24)
                          : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                           : std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
        return bits >> 15 ? -magnitude : magnitude;
    }
};

// One lane's operands of a matrix instruction, as registers: `a` and `b` hold 16-bit elements
// (packed two per 32-bit register on CUDA), `d` holds the f32 accumulator (C in, D out).
struct MatrixLane {
    const unsigned short* a;
    const unsigned short* b;
    float* d;
};

template <int M, int N, int K>
struct Tile {
    float a[M][K], b[K][N], d[M][N];
    unsigned char seen_a[M][K] = {}, seen_b[K][N] = {}, seen_d[M][N] = {};
};

[[noreturn]] CONVGEN_SIM_UNCHECKED inline void layout_bug(const char* what) {
    std::fprintf(stderr, "convgen simulator: %s fragment layout does not cover the matrix once\n", what);
    std::abort();   // a defect of this header, not of a kernel
}

template <int M, int N, int K>
CONVGEN_SIM_UNCHECKED inline void multiply(Tile<M, N, K>& t, const char* name) {
    for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k)
            if (t.seen_a[i][k] != 1) layout_bug(name);
    for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j)
            if (t.seen_b[k][j] != 1) layout_bug(name);
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            if (t.seen_d[i][j] != 1) layout_bug(name);
            float sum = t.d[i][j];
            // one rounding per step: the product of two 16-bit or tf32 values is exact in f32, so this is
            // their sum; true f32 operands (v_mfma_f32_16x16x4f32) get a fused multiply-add each
            for (int k = 0; k < K; ++k) sum = std::fmaf(t.a[i][k], t.b[k][j], sum);
            t.d[i][j] = sum;
        }
}

// PTX ISA, "Matrix Fragments for mma.m16n8k16" (.f16/.bf16 multiplicands, .f32 accumulators), with
// groupID = lane >> 2 and threadID_in_group = lane % 4:
//   A (16x16, row): elements a0..a7 (two per register, lower index in the low half);
//      row = groupID for a0, a1, a4, a5 and groupID + 8 for the others;
//      col = threadID_in_group * 2 + (i & 1), plus 8 for a4..a7.
//   B (16x8, col): elements b0..b3; row = threadID_in_group * 2 + (i & 1), plus 8 for b2, b3;
//      col = groupID.
//   C, D (16x8): c0..c3; row = groupID for c0, c1 and groupID + 8 for c2, c3;
//      col = threadID_in_group * 2 + (i & 1).
template <class Bits>
CONVGEN_SIM_UNCHECKED inline void emulate_mma_m16n8k16(void* const* lanes) {
    Tile<16, 8, 16> t;
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane& l = *static_cast<const MatrixLane*>(lanes[lane]);
        int group = lane >> 2, in_group = lane & 3;
        for (int i = 0; i < 8; ++i) {
            int row = group + ((i & 2) ? 8 : 0), col = in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            t.a[row][col] = Bits::to_f32(l.a[i]);
            t.seen_a[row][col]++;
        }
        for (int i = 0; i < 4; ++i) {
            int row = in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = group;
            t.b[row][col] = Bits::to_f32(l.b[i]);
            t.seen_b[row][col]++;
        }
        for (int i = 0; i < 4; ++i) {
            int row = group + (i >= 2 ? 8 : 0), col = in_group * 2 + (i & 1);
            t.d[row][col] = l.d[i];
            t.seen_d[row][col]++;
        }
    }
    multiply(t, "mma.m16n8k16");
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane& l = *static_cast<const MatrixLane*>(lanes[lane]);
        int group = lane >> 2, in_group = lane & 3;
        for (int i = 0; i < 4; ++i) l.d[i] = t.d[group + (i >= 2 ? 8 : 0)][in_group * 2 + (i & 1)];
    }
}

// AMD CDNA2/CDNA3 ISA and AMD's matrix instruction calculator, v_mfma_f32_16x16x16{f16,bf16_1k}
// (one block, 64 lanes; each lane holds four 16-bit A and B elements in two registers, low half
// first, and four f32 C/D elements):
//   A (16x16): lane l, item j holds A[l % 16][4 * (l / 16) + j];
//   B (16x16): lane l, item j holds B[4 * (l / 16) + j][l % 16];
//   C, D (16x16): lane l, item j holds D[4 * (l / 16) + j][l % 16].
template <class Bits>
CONVGEN_SIM_UNCHECKED inline void emulate_mfma_16x16x16(void* const* lanes) {
    Tile<16, 16, 16> t;
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane& l = *static_cast<const MatrixLane*>(lanes[lane]);
        int across = lane % 16, block = 4 * (lane / 16);
        for (int j = 0; j < 4; ++j) {
            t.a[across][block + j] = Bits::to_f32(l.a[j]);
            t.seen_a[across][block + j]++;
            t.b[block + j][across] = Bits::to_f32(l.b[j]);
            t.seen_b[block + j][across]++;
            t.d[block + j][across] = l.d[j];
            t.seen_d[block + j][across]++;
        }
    }
    multiply(t, "v_mfma_f32_16x16x16");
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane& l = *static_cast<const MatrixLane*>(lanes[lane]);
        for (int j = 0; j < 4; ++j) l.d[j] = t.d[4 * (lane / 16) + j][lane % 16];
    }
}

// f32 to tf32 as cvt.rna.tf32.f32 does (PTX ISA, cvt: ".rna: round to nearest, ties away from
// zero"): the result is a .b32 whose low 13 mantissa bits are zero. Adding half of the dropped
// unit (0x1000) to the magnitude's bits and clearing the low 13 bits rounds the magnitude half
// away from zero; a carry into the exponent is exact (up to infinity for the largest finite
// values, as rounding to nearest must). NaN stays NaN (its payload's high bits kept, quiet bit set:
// the device's NaN payload is not documented), infinities and zeros are unchanged.
CONVGEN_SIM_UNCHECKED inline uint32_t round_tf32(uint32_t bits) {
    if ((bits & 0x7f800000u) == 0x7f800000u) return (bits & 0x007fffffu) ? ((bits | 0x00400000u) & ~0x1fffu) : bits;
    uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
    return sign | ((magnitude + 0x1000u) & ~0x1fffu);
}

CONVGEN_SIM_UNCHECKED inline float tf32_value(uint32_t bits) {   // matrix_instruction32 checked the low 13 bits are zero
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

// One lane's operands of a tf32 matrix instruction: 32-bit A and B registers, the f32 accumulator.
struct MatrixLane32 {
    const uint32_t* a;
    const uint32_t* b;
    float* d;
};

// PTX ISA, "Matrix Fragments for mma.m16n8k8" (.tf32 multiplicands, .f32 accumulators), with
// groupID = lane >> 2 and threadID_in_group = lane % 4:
//   A (16x8, row): a0..a3, one per register; row = groupID for a0, a2 and groupID + 8 for a1, a3;
//      col = threadID_in_group for a0, a1 and threadID_in_group + 4 for a2, a3.
//   B (8x8, col): b0, b1; row = threadID_in_group for b0 and threadID_in_group + 4 for b1;
//      col = groupID.
//   C, D (16x8): as for m16n8k16.
// Each operand must already be a tf32 value (the wrappers round with cvt.rna); a product of two
// (11 significant bits each) is exact in f32, and the sum is taken in f32 in k order from C, as
// for the 16-bit shapes (the hardware's internal order and rounding of the sum are not documented).
CONVGEN_SIM_UNCHECKED inline void emulate_mma_m16n8k8_tf32(void* const* lanes) {
    Tile<16, 8, 8> t;
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane32& l = *static_cast<const MatrixLane32*>(lanes[lane]);
        int group = lane >> 2, in_group = lane & 3;
        for (int i = 0; i < 4; ++i) {
            int row = group + (i & 1) * 8, col = in_group + (i >> 1) * 4;
            t.a[row][col] = tf32_value(l.a[i]);
            t.seen_a[row][col]++;
        }
        for (int i = 0; i < 2; ++i) {
            int row = in_group + i * 4, col = group;
            t.b[row][col] = tf32_value(l.b[i]);
            t.seen_b[row][col]++;
        }
        for (int i = 0; i < 4; ++i) {
            int row = group + (i >= 2 ? 8 : 0), col = in_group * 2 + (i & 1);
            t.d[row][col] = l.d[i];
            t.seen_d[row][col]++;
        }
    }
    multiply(t, "mma.m16n8k8.tf32");
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane32& l = *static_cast<const MatrixLane32*>(lanes[lane]);
        int group = lane >> 2, in_group = lane & 3;
        for (int i = 0; i < 4; ++i) l.d[i] = t.d[group + (i >= 2 ? 8 : 0)][in_group * 2 + (i & 1)];
    }
}

// AMD's v_mfma_f32_16x16x4f32 (one 16x16x4 block, true f32 operands), wave 64: lane l holds
// A[l % 16][l / 16], B[l / 16][l % 16] and D[4(l / 16) + j][l % 16], j < 4 (AMD's matrix instruction
// calculator's layout for this shape, the 16x16x16 layout with one k per group of 16 lanes). The
// products of f32 operands are not exact in f32: each step is a fused multiply-add here; the
// device's internal precision and order are not documented (results may differ in the last bits).
CONVGEN_SIM_UNCHECKED inline void emulate_mfma_16x16x4_f32(void* const* lanes) {
    Tile<16, 16, 4> t;
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane32& l = *static_cast<const MatrixLane32*>(lanes[lane]);
        int across = lane % 16, k = lane / 16;
        t.a[across][k] = tf32_value(l.a[0]);   // (the bits as f32; any f32 is a valid operand here)
        t.seen_a[across][k]++;
        t.b[k][across] = tf32_value(l.b[0]);
        t.seen_b[k][across]++;
        for (int j = 0; j < 4; ++j) {
            t.d[4 * k + j][across] = l.d[j];
            t.seen_d[4 * k + j][across]++;
        }
    }
    multiply(t, "v_mfma_f32_16x16x4f32");
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane32& l = *static_cast<const MatrixLane32*>(lanes[lane]);
        for (int j = 0; j < 4; ++j) l.d[j] = t.d[4 * (lane / 16) + j][lane % 16];
    }
}

// PTX ISA, "Warp-level matrix load instruction: ldmatrix" (ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}
// .shared.b16): lane 8 j + i gives the address of row i (8 16-bit elements, 16 bytes, 16-byte
// aligned) of matrix j; the lanes past 8 x NUM give none. Lane l receives, of each matrix j, one
// 32-bit register: the elements of row l / 4 at columns 2 (l % 4) and 2 (l % 4) + 1, the first in
// the low half; with .trans, those of column l / 4 at rows 2 (l % 4) and 2 (l % 4) + 1.
struct MatrixRows {
    unsigned short row[8];   // the row this lane gives, read (and checked) when the lane arrives
    uint32_t* out;           // the lane's Num registers
};

template <int Num, bool Trans>
CONVGEN_SIM_UNCHECKED inline void emulate_ldmatrix(void* const* lanes) {
    unsigned short m[Num][8][8];
    for (int j = 0; j < Num; ++j)
        for (int i = 0; i < 8; ++i) std::memcpy(m[j][i], static_cast<const MatrixRows*>(lanes[8 * j + i])->row, 16);
    for (int lane = 0; lane < 32; ++lane) {
        uint32_t* out = static_cast<const MatrixRows*>(lanes[lane])->out;
        const int g = lane >> 2, c = 2 * (lane & 3);
        for (int j = 0; j < Num; ++j) {
            uint32_t lo = Trans ? m[j][c][g] : m[j][g][c], hi = Trans ? m[j][c + 1][g] : m[j][g][c + 1];
            out[j] = lo | hi << 16;
        }
    }
}

// The calling lane's part of an ldmatrix (a warp collective; CUDA's warps of 32 only): its row is
// read now, as its own 16-byte shared load (aligned, in bounds, racecheck, initcheck).
template <int Num, bool Trans>
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void matrix_load(const char* site, uint32_t* out, const void* row) {
    static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix loads 1, 2 or 4 matrices");
    static_assert(Num > 0 && CONVGEN_SIM_WARP == 32, "ldmatrix is CUDA's: warps of 32");
    Inside inside;
    MatrixRows lane{};
    lane.out = out;
    if (worker().current->linear % CONVGEN_SIM_WARP < 8 * Num) {
        shared_load(row, 16, "ldmatrix's row", __builtin_return_address(0));
        std::memcpy(lane.row, row, 16);
    }
    collective(site, Coll::MatrixLoad, false, 0, reinterpret_cast<unsigned long long>(&lane),
               reinterpret_cast<long long>(&emulate_ldmatrix<Num, Trans>), CONVGEN_SIM_WARP);
}

// The calling lane's part of a matrix instruction: waits for the whole warp, which `emulate` then
// serves at once. `a`, `b`: the lane's 16-bit elements in register order; `d`: its accumulator.
CONVGEN_SIM_UNCHECKED inline void matrix_instruction(const char* site, void (*emulate)(void* const*), const unsigned short* a,
                               const unsigned short* b, float* d) {
    Inside inside;
    MatrixLane lane{a, b, d};
    collective(site, Coll::Matrix, false, 0, reinterpret_cast<unsigned long long>(&lane),
               reinterpret_cast<long long>(emulate), CONVGEN_SIM_WARP);
}

// The same for a matrix instruction on 32-bit operands (tf32).
CONVGEN_SIM_UNCHECKED inline void matrix_instruction32(const char* site, void (*emulate)(void* const*), const uint32_t* a, const uint32_t* b,
                                 float* d) {
    Inside inside;
    // A .tf32 operand must be a tf32 value: the hardware's use of the low 13 bits of an unrounded
    // f32 is not documented, so an operand that skipped the wrappers' rounding is a kernel defect.
    for (int i = 0; i < 6; ++i) {
        uint32_t bits = i < 4 ? a[i] : b[i - 4];
        if (bits & 0x1fffu) {
            char text[160];
            std::snprintf(text, sizeof text, "tf32 matrix instruction at %s: %s operand %d is 0x%08x, not a tf32 value "
                          "(low 13 bits nonzero: not rounded with cvt.rna.tf32.f32)", site, i < 4 ? "A" : "B",
                          i < 4 ? i : i - 4, static_cast<unsigned>(bits));
            fail(text);
        }
    }
    MatrixLane32 lane{a, b, d};
    collective(site, Coll::Matrix, false, 0, reinterpret_cast<unsigned long long>(&lane),
               reinterpret_cast<long long>(emulate), CONVGEN_SIM_WARP);
}

// The same for a matrix instruction on true f32 operands (any bits: no rounding is asked of them).
CONVGEN_SIM_UNCHECKED inline void matrix_instruction_f32(const char* site, void (*emulate)(void* const*), const uint32_t* a,
                                   const uint32_t* b, float* d) {
    Inside inside;
    MatrixLane32 lane{a, b, d};
    collective(site, Coll::Matrix, false, 0, reinterpret_cast<unsigned long long>(&lane),
               reinterpret_cast<long long>(emulate), CONVGEN_SIM_WARP);
}

// One lane's operands of an f64 matrix instruction: one A and one B double, two accumulators.
struct MatrixLane64 {
    const double* a;
    const double* b;
    double* d;
};
// PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f64 floating point type", with groupID = lane >> 2
// and threadID_in_group = lane % 4:
//   A (8x4, row): a0 at row groupID, col threadID_in_group.
//   B (4x8, col): b0 at row threadID_in_group, col groupID.
//   C, D (8x8): c0, c1 at row groupID, col threadID_in_group * 2 + i.
// D = A B + C in f64, a fused multiply-add per step in k order from C (the device's internal order
// is not documented: results may differ in the last bits of a sum, never in which element goes where).
CONVGEN_SIM_UNCHECKED inline void emulate_dmma_m8n8k4(void* const* lanes) {
    double a[8][4], b[4][8], d[8][8];
    unsigned char seen_a[8][4] = {}, seen_b[4][8] = {}, seen_d[8][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane64& l = *static_cast<const MatrixLane64*>(lanes[lane]);
        int group = lane >> 2, in_group = lane & 3;
        a[group][in_group] = l.a[0];
        seen_a[group][in_group]++;
        b[in_group][group] = l.b[0];
        seen_b[in_group][group]++;
        for (int i = 0; i < 2; ++i) {
            d[group][in_group * 2 + i] = l.d[i];
            seen_d[group][in_group * 2 + i]++;
        }
    }
    for (int i = 0; i < 8; ++i)
        for (int k = 0; k < 4; ++k)
            if (seen_a[i][k] != 1 || seen_b[k][i] != 1) layout_bug("mma.m8n8k4.f64");
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) {
            if (seen_d[i][j] != 1) layout_bug("mma.m8n8k4.f64");
            for (int k = 0; k < 4; ++k) d[i][j] = std::fma(a[i][k], b[k][j], d[i][j]);
        }
    for (int lane = 0; lane < 32; ++lane) {
        const MatrixLane64& l = *static_cast<const MatrixLane64*>(lanes[lane]);
        for (int i = 0; i < 2; ++i) l.d[i] = d[lane >> 2][(lane & 3) * 2 + i];
    }
}

// AMD's v_mfma_f64_16x16x4f64 (one 16x16x4 block of doubles), wave 64: lane l holds A[l % 16][l / 16]
// and B[l / 16][l % 16] as the f32 16x16x4 shape does, and D[4j + l / 16][l % 16], j < 4: each group
// of 16 lanes takes every fourth row (AMD's "AMD matrix cores" lab notes, its v_mfma_f64_16x16x4f64
// example, unlike the f32 shapes' four consecutive rows). D = A B + C in f64, a fused multiply-add
// per step in k order from C (the device's internal order is not documented).
CONVGEN_SIM_UNCHECKED inline void emulate_mfma_16x16x4_f64(void* const* lanes) {
    double a[16][4], b[4][16], d[16][16];
    unsigned char seen_a[16][4] = {}, seen_b[4][16] = {}, seen_d[16][16] = {};
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane64& l = *static_cast<const MatrixLane64*>(lanes[lane]);
        int across = lane % 16, k = lane / 16;
        a[across][k] = l.a[0];
        seen_a[across][k]++;
        b[k][across] = l.b[0];
        seen_b[k][across]++;
        for (int j = 0; j < 4; ++j) {
            d[4 * j + k][across] = l.d[j];
            seen_d[4 * j + k][across]++;
        }
    }
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 4; ++k)
            if (seen_a[i][k] != 1 || seen_b[k][i] != 1) layout_bug("v_mfma_f64_16x16x4f64");
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            if (seen_d[i][j] != 1) layout_bug("v_mfma_f64_16x16x4f64");
            for (int k = 0; k < 4; ++k) d[i][j] = std::fma(a[i][k], b[k][j], d[i][j]);
        }
    for (int lane = 0; lane < 64; ++lane) {
        const MatrixLane64& l = *static_cast<const MatrixLane64*>(lanes[lane]);
        for (int j = 0; j < 4; ++j) l.d[j] = d[4 * j + lane / 16][lane % 16];
    }
}

// The calling lane's part of an f64 matrix instruction (`emulate`: mma.m8n8k4 or v_mfma_f64_16x16x4):
// `a`, `b` one double each, `d` its accumulators.
CONVGEN_SIM_UNCHECKED inline void matrix_instruction64(const char* site, void (*emulate)(void* const*), const double* a, const double* b,
                                 double* d) {
    MatrixLane64 lane{a, b, d};
    collective(site, Coll::Matrix, false, 0, reinterpret_cast<unsigned long long>(&lane),
               reinterpret_cast<long long>(emulate), CONVGEN_SIM_WARP);
}

}  // namespace convgen_sim
#pragma GCC visibility pop
