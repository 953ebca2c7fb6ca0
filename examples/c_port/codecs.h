/* The element formats and the three quantizers of dsv4spec (SPEC.md: FMT.*, FP4.*, FP8.*), on
 * IEEE binary32 bit patterns.  No floating-point arithmetic is used anywhere: every rounding is
 * integer arithmetic on the significand, so the results do not depend on the compiler, the FPU
 * or its flags. */
#ifndef DSV4_CODECS_H
#define DSV4_CODECS_H

#include <stddef.h>
#include <stdint.h>

/* Planted deviations (DSV4_PORT_DEVIATION), each a realistic mistake the suite must catch. */
struct deviations {
    int ties_away;            /* E2M1 ties away from zero instead of to even */
    int scale_reciprocal_six; /* KV scale from amax * fl32(1/6) instead of amax / 6 */
    int payload_reciprocal;   /* KV payload x * fl32(1/s) instead of x / s */
    int floor_6x2m6;          /* KV amax floor 6*2^-6 instead of 6*2^-9 */
};
extern struct deviations deviation;

#define F32_NAN 0x7FC00000u

/* fp32 arithmetic, correctly rounded to nearest even (subnormals included) */
uint32_t f32_mul(uint32_t a, uint32_t b);
uint32_t f32_div(uint32_t a, uint32_t b);
int f32_is_finite(uint32_t x);

/* element formats */
uint8_t e2m1_encode(uint32_t x);          /* x finite */
uint32_t e2m1_decode(uint8_t code);       /* code 0..15 */
uint8_t e4m3_encode(uint32_t x);          /* float8_e4m3fn, RNE, satfinite, NaN -> 0x7F */
uint32_t e4m3_decode(uint8_t byte);
uint32_t e8m0_decode(uint8_t byte);
uint32_t bf16_round(uint32_t x);

/* one block each: x[block] -> codes/values and the block's scale byte */
void fp4_e4m3_block(const uint32_t *x, uint8_t *codes, uint8_t *scale);   /* 16 values */
void fp4_e8m0_block(const uint32_t *x, uint8_t *codes, uint8_t *scale);   /* 32 values */
void fp8_block(const uint32_t *x, size_t block, uint8_t *q, uint8_t *scale);

#endif
