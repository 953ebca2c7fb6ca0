/* A dsv4spec port in plain C99: the element codecs, both FP4 quantizers and FP8 act_quant,
 * spoken over the exec protocol, version 1 (PROTOCOL.md), on standard input and output.
 *
 *     make -C examples/c_port
 *     dsv4spec verify --target exec:examples/c_port/port --rules FMT,FP4,FP8
 *
 * DSV4_PORT_DEVIATION plants one realistic mistake, which the suite must report on its rule:
 *     ties_away             E2M1 ties away from zero               (FMT.E2M1.RNE, FP4.E2M1.RNE)
 *     scale_reciprocal_six  KV scale from amax * fl32(1/6)          (FP4.KV.SCALE)
 *     payload_reciprocal    KV payload x * fl32(1/s)                (FP4.KV.DIVIDE)
 *     floor_6x2m6           KV amax floor 6*2^-6                    (FP4.KV.FLOOR)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs.h"

#define MAX_LINE 65536
#define MAX_WORDS 64
#define MAX_DIMS 16
#define MAX_ARGS 8

/* ------------------------------------------------------------------------------------------ */
/* Records: a header line of key=value words, then raw bytes for a tensor                       */
/* ------------------------------------------------------------------------------------------ */

static char line[MAX_LINE + 2];
static char *words[MAX_WORDS];
static int nwords;

static void die(const char *why)
{
    fprintf(stderr, "c-port: %s\n", why);
    exit(1);
}

/* Read one header line and split it into words; 0 at the end of the input. */
static int read_header(void)
{
    size_t n;
    char *p;
    if (!fgets(line, sizeof line, stdin))
        return 0;
    n = strlen(line);
    if (n == 0 || line[n - 1] != '\n')
        die("a header line without its line feed (or longer than 64 KiB)");
    line[n - 1] = '\0';
    nwords = 0;
    for (p = line; p && nwords < MAX_WORDS; ) {
        words[nwords++] = p;
        p = strchr(p, ' ');
        if (p)
            *p++ = '\0';
    }
    return 1;
}

static const char *field(const char *key)
{
    size_t k = strlen(key);
    int i;
    for (i = 1; i < nwords; i++)
        if (strncmp(words[i], key, k) == 0 && words[i][k] == '=')
            return words[i] + k + 1;
    return NULL;
}

static long long int_field(const char *key)
{
    const char *v = field(key);
    char *end;
    long long n;
    if (!v)
        die("a record lacks a required key");
    n = strtoll(v, &end, 10);
    if (*end)
        die("a key's value is not an integer");
    return n;
}

enum { V_TENSOR, V_INT, V_OTHER };

struct value {
    int kind;
    char dtype[16];
    int ndim;
    size_t shape[MAX_DIMS];
    size_t nbytes;
    unsigned char *data;
    long long integer;
    char key[64];
};

static void read_value(struct value *v)
{
    const char *key, *shape;
    memset(v, 0, sizeof *v);
    if (!read_header())
        die("the input ended inside a request");
    key = field("key");
    if (key)
        strncpy(v->key, key, sizeof v->key - 1);
    if (strcmp(words[0], "tensor") == 0) {
        v->kind = V_TENSOR;
        strncpy(v->dtype, field("dtype") ? field("dtype") : "", sizeof v->dtype - 1);
        shape = field("shape");
        if (!shape)
            die("a tensor record without shape=");
        while (*shape) {
            if (v->ndim == MAX_DIMS)
                die("a tensor of more than 16 dimensions");
            v->shape[v->ndim++] = (size_t)strtoull(shape, (char **)&shape, 10);
            if (*shape == ',')
                shape++;
        }
        v->nbytes = (size_t)int_field("nbytes");
        v->data = malloc(v->nbytes ? v->nbytes : 1);
        if (!v->data || fread(v->data, 1, v->nbytes, stdin) != v->nbytes)
            die("a tensor's bytes are missing");
    } else if (strcmp(words[0], "int") == 0) {
        v->kind = V_INT;
        v->integer = int_field("value");
    } else {
        long long i, n;
        v->kind = V_OTHER;      /* float, str, bool, none: not needed here; list, dict: skip their items */
        if (strcmp(words[0], "list") == 0 || strcmp(words[0], "dict") == 0) {
            struct value item;
            n = int_field("n");
            for (i = 0; i < n; i++) {
                read_value(&item);
                free(item.data);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Replies                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void reply_error(const char *kind, const char *message)
{
    printf("error kind=%s message=%s\n", kind, message);
}

static void put_tensor(const char *dtype, const size_t *shape, int ndim, const void *data, size_t nbytes)
{
    int i;
    printf("tensor dtype=%s shape=", dtype);
    for (i = 0; i < ndim; i++)
        printf(i ? ",%lu" : "%lu", (unsigned long)shape[i]);
    printf(" nbytes=%lu\n", (unsigned long)nbytes);
    fwrite(data, 1, nbytes, stdout);
}

static size_t count(const struct value *v)
{
    size_t n = 1;
    int i;
    for (i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void set32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* float32 or bfloat16 values as binary32 bit patterns (NULL and a TypeError reply otherwise) */
static uint32_t *values_of(const struct value *v)
{
    size_t i, n = count(v);
    uint32_t *x;
    int bf16 = strcmp(v->dtype, "bfloat16") == 0;
    if (v->kind != V_TENSOR || !(bf16 || strcmp(v->dtype, "float32") == 0)) {
        reply_error("TypeError", "expected a float32 or bfloat16 tensor of values");
        return NULL;
    }
    x = malloc(n * sizeof *x + 1);
    for (i = 0; i < n; i++)
        x[i] = bf16 ? (uint32_t)(v->data[2 * i] | v->data[2 * i + 1] << 8) << 16 : get32(v->data + 4 * i);
    return x;
}

static int is_bytes(const struct value *v)
{
    if (v->kind == V_TENSOR && strcmp(v->dtype, "uint8") == 0)
        return 1;
    reply_error("TypeError", "expected a uint8 tensor of codes, bytes or scales");
    return 0;
}

/* the output shape: the input's, with the last dimension `last` */
static void shaped(const struct value *v, size_t last, size_t *shape)
{
    memcpy(shape, v->shape, sizeof v->shape);
    if (v->ndim)
        shape[v->ndim - 1] = last;
}

static size_t last_dim(const struct value *v)
{
    return v->ndim ? v->shape[v->ndim - 1] : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef void operation(struct value *args, int nargs);

static void values_to_codes(struct value *a, uint8_t (*encode)(uint32_t), int finite_only)
{
    size_t i, n = count(a);
    uint32_t *x = values_of(a);
    uint8_t *out;
    if (!x)
        return;
    for (i = 0; i < n; i++)
        if (finite_only && !f32_is_finite(x[i])) {
            reply_error("ValueError", "E2M1 has no Inf or NaN; the input must be finite");
            free(x);
            return;
        }
    out = malloc(n + 1);
    for (i = 0; i < n; i++)
        out[i] = encode(x[i]);
    printf("ok n=1\n");
    put_tensor("uint8", a->shape, a->ndim, out, n);
    free(x);
    free(out);
}

static void codes_to_values(struct value *a, uint32_t (*decode)(uint8_t), int nibbles)
{
    size_t i, n = count(a);
    unsigned char *out;
    if (!is_bytes(a))
        return;
    for (i = 0; i < n; i++)
        if (nibbles && a->data[i] > 15) {
            reply_error("ValueError", "e2m1_decode: codes must be nibbles 0..15");
            return;
        }
    out = malloc(4 * n + 1);
    for (i = 0; i < n; i++)
        set32(out + 4 * i, decode(a->data[i]));
    printf("ok n=1\n");
    put_tensor("float32", a->shape, a->ndim, out, 4 * n);
    free(out);
}

static void op_e2m1_encode(struct value *a, int n) { (void)n; values_to_codes(a, e2m1_encode, 1); }
static void op_e4m3_encode(struct value *a, int n) { (void)n; values_to_codes(a, e4m3_encode, 0); }
static void op_e2m1_decode(struct value *a, int n) { (void)n; codes_to_values(a, e2m1_decode, 1); }
static void op_e4m3_decode(struct value *a, int n) { (void)n; codes_to_values(a, e4m3_decode, 0); }
static void op_e8m0_decode(struct value *a, int n) { (void)n; codes_to_values(a, e8m0_decode, 0); }

static void op_bf16_round(struct value *a, int nargs)
{
    size_t i, n = count(a);
    uint32_t *x = values_of(a);
    unsigned char *out;
    (void)nargs;
    if (!x)
        return;
    out = malloc(4 * n + 1);
    for (i = 0; i < n; i++)
        set32(out + 4 * i, bf16_round(x[i]));
    printf("ok n=1\n");
    put_tensor("float32", a->shape, a->ndim, out, 4 * n);
    free(x);
    free(out);
}

/* codes[n] -> bytes[n/2], element 2i in the low nibble (FP4.PACK.NIBBLE) */
static void pack(const uint8_t *codes, size_t n, uint8_t *out)
{
    size_t i;
    for (i = 0; i < n / 2; i++)
        out[i] = (uint8_t)((codes[2 * i] & 0xF) | (codes[2 * i + 1] & 0xF) << 4);
}

static void op_fp4_pack(struct value *a, int nargs)
{
    size_t n = count(a), shape[MAX_DIMS];
    uint8_t *out;
    (void)nargs;
    if (!is_bytes(a))
        return;
    if (a->ndim == 0 || last_dim(a) % 2) {
        reply_error("ValueError", "fp4_pack: the last dimension must be even");
        return;
    }
    out = malloc(n / 2 + 1);
    pack(a->data, n, out);
    shaped(a, last_dim(a) / 2, shape);
    printf("ok n=1\n");
    put_tensor("uint8", shape, a->ndim, out, n / 2);
    free(out);
}

static void op_fp4_unpack(struct value *a, int nargs)
{
    size_t i, n = count(a), shape[MAX_DIMS];
    uint8_t *out;
    (void)nargs;
    if (!is_bytes(a))
        return;
    if (a->ndim == 0) {
        reply_error("ValueError", "fp4_unpack: expected at least one dimension");
        return;
    }
    out = malloc(2 * n + 1);
    for (i = 0; i < n; i++) {
        out[2 * i] = a->data[i] & 0xF;
        out[2 * i + 1] = a->data[i] >> 4;
    }
    shaped(a, last_dim(a) * 2, shape);
    printf("ok n=1\n");
    put_tensor("uint8", shape, a->ndim, out, 2 * n);
    free(out);
}

/* x[..., k*block] -> (packed [..., k*block/2], scales [..., k]) with one of the FP4 block codecs */
static void fp4_quantize(struct value *a, size_t block, void (*quantize)(const uint32_t *, uint8_t *, uint8_t *))
{
    size_t i, n = count(a), shape[MAX_DIMS];
    uint32_t *x;
    uint8_t codes[32], *packed, *scales;
    if (a->ndim == 0 || last_dim(a) % block) {
        reply_error("ValueError", block == 16 ? "the last dimension must be a multiple of 16"
                                              : "the last dimension must be a multiple of 32");
        return;
    }
    if (!(x = values_of(a)))
        return;
    packed = malloc(n / 2 + 1);
    scales = malloc(n / block + 1);
    for (i = 0; i < n / block; i++) {
        quantize(x + i * block, codes, scales + i);
        pack(codes, block, packed + i * block / 2);
    }
    printf("ok n=2\n");
    shaped(a, last_dim(a) / 2, shape);
    put_tensor("uint8", shape, a->ndim, packed, n / 2);
    shaped(a, last_dim(a) / block, shape);
    put_tensor("uint8", shape, a->ndim, scales, n / block);
    free(x);
    free(packed);
    free(scales);
}

static void op_fp4_e4m3_quantize(struct value *a, int n) { (void)n; fp4_quantize(a, 16, fp4_e4m3_block); }
static void op_fp4_e8m0_quantize(struct value *a, int n) { (void)n; fp4_quantize(a, 32, fp4_e8m0_block); }

/* packed [..., k*block/2] and scales [..., k] -> values [..., k*block] */
static void fp4_dequantize(struct value *a, size_t block, uint32_t (*decode)(uint8_t))
{
    size_t i, n, shape[MAX_DIMS];
    unsigned char *out;
    if (!is_bytes(&a[0]) || !is_bytes(&a[1]))
        return;
    n = 2 * count(&a[0]);
    if (a[0].ndim == 0 || count(&a[1]) * block != n) {
        reply_error("ValueError", "expected one scale per block of the unpacked values");
        return;
    }
    out = malloc(4 * n + 1);
    for (i = 0; i < n; i++) {
        uint8_t byte = a[0].data[i / 2], code = i % 2 ? byte >> 4 : byte & 0xF;
        set32(out + 4 * i, f32_mul(e2m1_decode(code), decode(a[1].data[i / block])));
    }
    printf("ok n=1\n");
    shaped(&a[0], 2 * last_dim(&a[0]), shape);
    put_tensor("float32", shape, a[0].ndim, out, 4 * n);
    free(out);
}

static void op_fp4_e4m3_dequantize(struct value *a, int n) { (void)n; fp4_dequantize(a, 16, e4m3_decode); }
static void op_fp4_e8m0_dequantize(struct value *a, int n) { (void)n; fp4_dequantize(a, 32, e8m0_decode); }

/* the block size: positional argument `pos`, or the keyword argument block= */
static size_t block_of(struct value *a, int nargs, int pos)
{
    int i;
    for (i = 0; i < nargs; i++)
        if (a[i].kind == V_INT && (i == pos || strcmp(a[i].key, "block") == 0))
            return a[i].integer > 0 ? (size_t)a[i].integer : 0;
    return 0;
}

/* act_quant of x [..., k*block]: q [..., k*block] and scales [..., k]; `qdq` returns q * s instead */
static void fp8(struct value *a, int nargs, int qdq)
{
    size_t i, j, n = count(a), block = block_of(a, nargs, 1), shape[MAX_DIMS];
    uint32_t *x;
    uint8_t *q, *scales;
    if (!block || a->ndim == 0 || last_dim(a) % block) {
        reply_error("ValueError", "expected a positive block size dividing the last dimension");
        return;
    }
    if (!(x = values_of(a)))
        return;
    q = malloc(n + 1);
    scales = malloc(n / block + 1);
    for (i = 0; i < n / block; i++)
        fp8_block(x + i * block, block, q + i * block, scales + i);
    if (qdq) {
        unsigned char *out = malloc(4 * n + 1);
        for (i = 0; i < n / block; i++)
            for (j = 0; j < block; j++)
                set32(out + 4 * (i * block + j), f32_mul(e4m3_decode(q[i * block + j]), e8m0_decode(scales[i])));
        printf("ok n=1\n");
        put_tensor("float32", a->shape, a->ndim, out, 4 * n);
        free(out);
    } else {
        printf("ok n=2\n");
        put_tensor("uint8", a->shape, a->ndim, q, n);
        shaped(a, last_dim(a) / block, shape);
        put_tensor("uint8", shape, a->ndim, scales, n / block);
    }
    free(x);
    free(q);
    free(scales);
}

static void op_fp8_quantize(struct value *a, int n) { fp8(a, n, 0); }
static void op_fp8_qdq(struct value *a, int n) { fp8(a, n, 1); }

static void op_fp8_dequantize(struct value *a, int nargs)
{
    size_t i, n, block = block_of(a, nargs, 2);
    unsigned char *out;
    if (!is_bytes(&a[0]) || !is_bytes(&a[1]))
        return;
    n = count(&a[0]);
    if (!block || count(&a[1]) * block != n) {
        reply_error("ValueError", "expected one scale per block of values");
        return;
    }
    out = malloc(4 * n + 1);
    for (i = 0; i < n; i++)
        set32(out + 4 * i, f32_mul(e4m3_decode(a[0].data[i]), e8m0_decode(a[1].data[i / block])));
    printf("ok n=1\n");
    put_tensor("float32", a[0].shape, a[0].ndim, out, 4 * n);
    free(out);
}

static const struct {
    const char *name;
    int nargs;              /* at least this many arguments */
    operation *run;
} OPS[] = {
    {"e2m1_encode", 1, op_e2m1_encode},       {"e2m1_decode", 1, op_e2m1_decode},
    {"e4m3_encode", 1, op_e4m3_encode},       {"e4m3_decode", 1, op_e4m3_decode},
    {"e8m0_decode", 1, op_e8m0_decode},       {"bf16_round", 1, op_bf16_round},
    {"fp4_pack", 1, op_fp4_pack},             {"fp4_unpack", 1, op_fp4_unpack},
    {"fp4_e4m3_quantize", 1, op_fp4_e4m3_quantize}, {"fp4_e4m3_dequantize", 2, op_fp4_e4m3_dequantize},
    {"fp4_e8m0_quantize", 1, op_fp4_e8m0_quantize}, {"fp4_e8m0_dequantize", 2, op_fp4_e8m0_dequantize},
    {"fp8_quantize", 2, op_fp8_quantize},     {"fp8_dequantize", 3, op_fp8_dequantize},
    {"fp8_qdq", 2, op_fp8_qdq},
};
#define NOPS (sizeof OPS / sizeof OPS[0])

/* ------------------------------------------------------------------------------------------ */
/* The session                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static const char *choose_deviation(void)
{
    const char *d = getenv("DSV4_PORT_DEVIATION");
    if (!d || !*d)
        return "";
    if (strcmp(d, "ties_away") == 0)
        deviation.ties_away = 1;
    else if (strcmp(d, "scale_reciprocal_six") == 0)
        deviation.scale_reciprocal_six = 1;
    else if (strcmp(d, "payload_reciprocal") == 0)
        deviation.payload_reciprocal = 1;
    else if (strcmp(d, "floor_6x2m6") == 0)
        deviation.floor_6x2m6 = 1;
    else
        return NULL;
    return d;
}

static void call(void)
{
    struct value args[MAX_ARGS];
    const char *op = field("op");
    char name[64];
    long long nargs = int_field("args") + int_field("kwargs"), i;
    size_t k;
    if (!op || nargs < 0 || nargs > MAX_ARGS)
        die("a call without op= or with more than 8 arguments");
    strncpy(name, op, sizeof name - 1);
    name[sizeof name - 1] = '\0';
    for (i = 0; i < nargs; i++)
        read_value(&args[i]);
    for (k = 0; k < NOPS && strcmp(OPS[k].name, name) != 0; k++)
        ;
    if (k == NOPS)
        reply_error("NotImplementedError", "this port does not implement it");
    else if (nargs < OPS[k].nargs)
        reply_error("TypeError", "too few arguments");
    else
        OPS[k].run(args, (int)nargs);
    for (i = 0; i < nargs; i++)
        free(args[i].data);
}

int main(void)
{
    const char *chosen = choose_deviation();
    size_t k;
    if (!read_header() || strcmp(words[0], "hello") != 0)
        die("expected the suite's hello");
    if (!chosen) {
        printf("error message=unknown DSV4_PORT_DEVIATION %s; expected ties_away, scale_reciprocal_six, "
               "payload_reciprocal or floor_6x2m6\n", getenv("DSV4_PORT_DEVIATION"));
        return 2;
    }
    printf("hello protocol=1 name=c-port%s%s version=1 claims_conformance=1 input_dtype=float32 ops=",
           *chosen ? "%20" : "", chosen);
    for (k = 0; k < NOPS; k++)
        printf(k ? ",%s" : "%s", OPS[k].name);
    printf("\n");
    fflush(stdout);
    while (read_header()) {
        if (strcmp(words[0], "call") != 0)
            die("expected a call record");
        call();
        fflush(stdout);
    }
    return 0;
}
