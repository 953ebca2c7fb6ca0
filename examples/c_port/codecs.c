/* dsv4spec's element formats and quantizers, written from SPEC.md and spec/formats.py,
 * spec/quant.py, on binary32 bit patterns with integer arithmetic only. */
#include "codecs.h"

struct deviations deviation;

#define SIGN 0x80000000u
#define MAG(x) ((x) & 0x7FFFFFFFu)
#define ONE 0x3F800000u
#define SIX 0x40C00000u             /* 6, the largest E2M1 magnitude */
#define E4M3_MAX 0x43E00000u        /* 448 */
#define INV_SIX 0x3E2AAAABu         /* fl32(1/6), a little above 1/6 */
#define INV_448 0x3B124925u         /* fl32(1/448) */
#define KV_FLOOR 0x3C400000u        /* 6 * 2^-9: the smallest KV scale is 2^-9 */
#define KV_FLOOR_6X2M6 0x3DC00000u  /* 6 * 2^-6 (the planted deviation) */
#define IDX_FLOOR 0x01C00000u       /* 6 * 2^-126 */
#define FP8_FLOOR 0x38D1B717u       /* fl32(1e-4) */

static int bit_length(uint64_t m)
{
    int n = 0;
    while (m) {
        n++;
        m >>= 1;
    }
    return n;
}

/* round(m / 2^d), to nearest, ties to even; `sticky`: the exact value lies a little above m */
static uint64_t shift_rne(uint64_t m, int d, int sticky)
{
    uint64_t q, rest, half;
    if (d <= 0)
        return m << -d;
    if (d > 62)
        return 0;                   /* m < 2^62: below half of the last unit */
    q = m >> d;
    rest = m & ((1ull << d) - 1);
    half = 1ull << (d - 1);
    if (rest > half || (rest == half && (sticky || (q & 1))))
        q++;
    return q;
}

/* the binary32 nearest to (m + sticky tail) * 2^e, m < 2^62 */
static uint32_t round_f32(uint32_t sign, uint64_t m, int e, int sticky)
{
    int top, lsb;
    uint64_t q, bits;
    if (m == 0)
        return sign;
    top = e + bit_length(m) - 1;            /* m * 2^e lies in [2^top, 2^(top+1)) */
    lsb = top >= -126 ? top - 23 : -149;    /* the weight of the result's last significand bit */
    q = shift_rne(m, lsb - e, sticky);
    if (lsb == -149)                        /* subnormal (q = 2^23 is the smallest normal) */
        return sign | (uint32_t)q;
    bits = ((uint64_t)(lsb + 150) << 23) + (q - (1ull << 23));   /* a carry to 2^24 bumps the exponent */
    return bits >= 0x7F800000u ? sign | 0x7F800000u : sign | (uint32_t)bits;
}

/* x = m * 2^e with m < 2^24 (finite x) */
static void split(uint32_t x, uint64_t *m, int *e)
{
    uint32_t exponent = (x >> 23) & 0xFF, fraction = x & 0x7FFFFF;
    *m = exponent ? (fraction | 0x800000u) : fraction;
    *e = exponent ? (int)exponent - 150 : -149;
}

int f32_is_finite(uint32_t x)
{
    return (x & 0x7F800000u) != 0x7F800000u;
}

static int is_nan(uint32_t x)
{
    return MAG(x) > 0x7F800000u;
}

uint32_t f32_mul(uint32_t a, uint32_t b)
{
    uint32_t sign = (a ^ b) & SIGN;
    uint64_t ma, mb;
    int ea, eb;
    if (is_nan(a) || is_nan(b))
        return F32_NAN;
    if (!f32_is_finite(a) || !f32_is_finite(b))
        return (MAG(a) == 0 || MAG(b) == 0) ? F32_NAN : sign | 0x7F800000u;
    split(a, &ma, &ea);
    split(b, &mb, &eb);
    return round_f32(sign, ma * mb, ea + eb, 0);
}

/* a / b for finite a and finite nonzero b (all the codecs need) */
uint32_t f32_div(uint32_t a, uint32_t b)
{
    uint32_t sign = (a ^ b) & SIGN;
    uint64_t ma, mb, num;
    int ea, eb;
    if (is_nan(a) || is_nan(b) || !f32_is_finite(a) || !f32_is_finite(b) || MAG(b) == 0)
        return F32_NAN;
    split(a, &ma, &ea);
    split(b, &mb, &eb);
    if (ma == 0)
        return sign;
    while (ma < 0x800000u) {
        ma <<= 1;
        ea--;
    }
    while (mb < 0x800000u) {
        mb <<= 1;
        eb--;
    }
    num = ma << 38;                  /* the quotient gets 38 or 39 bits, the remainder the sticky bit */
    return round_f32(sign, num / mb, ea - 38 - eb, num % mb != 0);
}

/* ceil(log2 v) of a positive finite v, from its bits (FMT.CEIL_LOG2) */
static int ceil_log2(uint32_t v)
{
    uint32_t exponent = (v >> 23) & 0xFF, fraction = v & 0x7FFFFF;
    if (exponent)
        return (int)exponent - 127 + (fraction != 0);
    return bit_length(fraction - 1) - 149;
}

static uint32_t pow2(int e)
{
    return round_f32(0, 1, e, 0);
}

static uint32_t clamp_mag(uint32_t x, uint32_t limit)
{
    return MAG(x) > limit ? (x & SIGN) | limit : x;
}

/* ------------------------------------------------------------------------------------------ */
/* E2M1: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7), bit 3 the sign                     */
/* ------------------------------------------------------------------------------------------ */

static const uint32_t E2M1_MIDPOINT[7] = {      /* 0.25 0.75 1.25 1.75 2.5 3.5 5 */
    0x3E800000u, 0x3F400000u, 0x3FA00000u, 0x3FE00000u, 0x40200000u, 0x40600000u, 0x40A00000u};
static const uint32_t E2M1_MAGNITUDE[8] = {
    0, 0x3F000000u, 0x3F800000u, 0x3FC00000u, 0x40000000u, 0x40400000u, 0x40800000u, 0x40C00000u};

uint8_t e2m1_encode(uint32_t x)
{
    uint32_t mag = MAG(x);
    int code = 0;
    while (code < 7 && mag > E2M1_MIDPOINT[code])      /* the nearest magnitude, a tie the smaller */
        code++;
    if (code < 7 && mag == E2M1_MIDPOINT[code] && (deviation.ties_away || code % 2 == 1))
        code++;                                          /* a tie to the even code */
    return (uint8_t)(code | (x >> 31) << 3);             /* -0 and negatives rounding to 0 keep the sign */
}

uint32_t e2m1_decode(uint8_t code)
{
    return E2M1_MAGNITUDE[code & 7] | (code & 8 ? SIGN : 0);
}

/* ------------------------------------------------------------------------------------------ */
/* E4M3 (float8_e4m3fn): bias 7, subnormals m * 2^-9, max 448, 0x7F NaN, no Inf               */
/* ------------------------------------------------------------------------------------------ */

uint8_t e4m3_encode(uint32_t x)
{
    uint8_t sign = (uint8_t)(x >> 24 & 0x80);
    uint64_t m, q;
    int e, binade, code;
    if (is_nan(x))
        return sign | 0x7F;
    if (!f32_is_finite(x))
        return sign | 0x7E;
    split(x, &m, &e);
    if (m == 0)
        return sign;
    binade = e + bit_length(m) - 1;
    if (binade < -6)
        binade = -6;                        /* below 2^-6 the spacing stays 2^-9 */
    q = shift_rne(m, binade - 3 - e, 0);    /* x in units of the spacing 2^(binade-3) */
    code = ((binade + 6) << 3) + (int)q;    /* q = 16 carries into the next binade by itself */
    return sign | (uint8_t)(code > 0x7E ? 0x7E : code);
}

uint32_t e4m3_decode(uint8_t byte)
{
    uint32_t sign = byte & 0x80 ? SIGN : 0;
    int exponent = byte >> 3 & 0xF, mantissa = byte & 7;
    if ((byte & 0x7F) == 0x7F)
        return F32_NAN;
    if (exponent == 0)
        return round_f32(sign, (uint64_t)mantissa, -9, 0);
    return round_f32(sign, (uint64_t)(8 + mantissa), exponent - 10, 0);
}

uint32_t e8m0_decode(uint8_t byte)
{
    return byte == 0xFF ? F32_NAN : pow2((int)byte - 127);
}

uint32_t bf16_round(uint32_t x)
{
    uint64_t rounded;
    if (is_nan(x))
        return ((x >> 16) | 0x40) << 16;
    rounded = ((uint64_t)x + 0x7FFF + (x >> 16 & 1)) >> 16;
    return (uint32_t)(rounded << 16);
}

/* ------------------------------------------------------------------------------------------ */
/* The quantizers, one block at a time                                                          */
/* ------------------------------------------------------------------------------------------ */

/* max |x| of a block, or 0xFFFFFFFF when it holds a NaN or an Inf */
static uint32_t block_amax(const uint32_t *x, size_t n)
{
    uint32_t amax = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        if (!f32_is_finite(x[i]))
            return 0xFFFFFFFFu;
        if (MAG(x[i]) > amax)
            amax = MAG(x[i]);
    }
    return amax;
}

/* A block holding NaN or Inf is this port's own choice (FP4.NONFINITE, FP8.NONFINITE leave it
 * open): codes 0 and a NaN scale; every other block is quantized as if it were not there. */
static void nonfinite_block(uint8_t *codes, size_t n, uint8_t *scale, uint8_t nan_scale)
{
    size_t i;
    for (i = 0; i < n; i++)
        codes[i] = 0;
    *scale = nan_scale;
}

static void fp4_codes(const uint32_t *x, size_t n, uint32_t s, int reciprocal, uint8_t *codes)
{
    uint32_t inv = f32_div(ONE, s);
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t r = reciprocal ? f32_mul(x[i], inv) : f32_div(x[i], s);
        codes[i] = e2m1_encode(clamp_mag(r, SIX));
    }
}

/* V4.1 main KV: s = E4M3_RNE(fl32(max(amax, 6*2^-9) / 6)); codes E2M1_RNE(clamp(x / s, +-6)) */
void fp4_e4m3_block(const uint32_t *x, uint8_t *codes, uint8_t *scale)
{
    uint32_t amax = block_amax(x, 16), floor = deviation.floor_6x2m6 ? KV_FLOOR_6X2M6 : KV_FLOOR, v;
    if (amax == 0xFFFFFFFFu) {
        nonfinite_block(codes, 16, scale, 0x7F);
        return;
    }
    if (amax < floor)
        amax = floor;
    v = deviation.scale_reciprocal_six ? f32_mul(amax, INV_SIX) : f32_div(amax, SIX);
    *scale = e4m3_encode(v);
    fp4_codes(x, 16, e4m3_decode(*scale), deviation.payload_reciprocal, codes);
}

/* the E8M0 exponent 2^ceil_log2(fl32(amax * inv)) of a power-of-two scale, within E8M0's range */
static int pow2_exponent(uint32_t amax, uint32_t inv)
{
    int e = ceil_log2(f32_mul(amax, inv));
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* indexer Q/K: s = 2^ceil_log2(fl32(max(amax, 6*2^-126) * fl32(1/6))); codes E2M1_RNE(clamp(x / s)) */
void fp4_e8m0_block(const uint32_t *x, uint8_t *codes, uint8_t *scale)
{
    uint32_t amax = block_amax(x, 32);
    int e;
    if (amax == 0xFFFFFFFFu) {
        nonfinite_block(codes, 32, scale, 0xFF);
        return;
    }
    e = pow2_exponent(amax < IDX_FLOOR ? IDX_FLOOR : amax, INV_SIX);
    *scale = (uint8_t)(e + 127);
    fp4_codes(x, 32, pow2(e), 0, codes);
}

/* act_quant: s = 2^ceil_log2(fl32(max(amax, fl32(1e-4)) * fl32(1/448))); q = E4M3_RNE(clamp(x / s)) */
void fp8_block(const uint32_t *x, size_t block, uint8_t *q, uint8_t *scale)
{
    uint32_t amax = block_amax(x, block), s;
    size_t i;
    int e;
    if (amax == 0xFFFFFFFFu) {
        nonfinite_block(q, block, scale, 0xFF);
        return;
    }
    e = pow2_exponent(amax < FP8_FLOOR ? FP8_FLOOR : amax, INV_448);
    *scale = (uint8_t)(e + 127);
    s = pow2(e);
    for (i = 0; i < block; i++)
        q[i] = e4m3_encode(clamp_mag(f32_div(x[i], s), E4M3_MAX));
}
