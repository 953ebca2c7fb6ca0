/* A trace writer in plain C99, no libraries: the format of docs/TRACE.md (version 1) written from
 * an engine's tensors, here read from raw files named by a plan.
 *
 *   trace_writer PLAN OUT_DIR
 *
 * PLAN has one header line and one line per tensor:
 *   model MODEL WORLD_SIZE RANK
 *   STAGE LAYER START_POS SEQLEN ROW DTYPE NDIM D0 D1 ... RAW_FILE
 * START_POS -1 marks a weight (step null).  DTYPE: F32 BF16 F16 U8 I32 I64 BOOL.  RAW_FILE holds the
 * tensor's little-endian bytes, row-major.  OUT_DIR gets tensors-00000.safetensors (an 8-byte length,
 * the JSON header padded with spaces to a multiple of 8, the data) and manifest.json, written last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TENSORS 4096
#define MAX_DIMS 8

typedef struct {
    char stage[64], dtype[8], raw[1024];
    int layer, row, ndim;
    long start_pos, seqlen, dims[MAX_DIMS];
    unsigned long long nbytes, offset;
} Tensor;

static Tensor tensors[MAX_TENSORS];

static void die(const char *what, const char *detail) {
    fprintf(stderr, "trace_writer: %s%s\n", what, detail);
    exit(1);
}

static unsigned long long element_size(const char *dtype) {
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16")) return 2;
    if (!strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "U8") || !strcmp(dtype, "BOOL")) return 1;
    die("unknown dtype ", dtype);
    return 0;
}

static int read_plan(const char *path, char *model, int *world, int *rank) {
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) die("cannot open plan ", path);
    if (fscanf(f, " model %31s %d %d", model, world, rank) != 3) die("plan: no header line in ", path);
    for (;;) {
        Tensor *t = &tensors[n];
        int i;
        if (fscanf(f, " %63s %d %ld %ld %d %7s %d", t->stage, &t->layer, &t->start_pos, &t->seqlen, &t->row,
                   t->dtype, &t->ndim) != 7) break;
        if (t->ndim < 0 || t->ndim > MAX_DIMS) die("plan: too many dimensions for ", t->stage);
        t->nbytes = element_size(t->dtype);
        for (i = 0; i < t->ndim; i++) {
            if (fscanf(f, " %ld", &t->dims[i]) != 1) die("plan: a dimension missing for ", t->stage);
            t->nbytes *= (unsigned long long)t->dims[i];
        }
        if (fscanf(f, " %1023s", t->raw) != 1) die("plan: no raw file for ", t->stage);
        if (++n == MAX_TENSORS) die("plan: too many tensors", "");
    }
    fclose(f);
    return n;
}

static void copy_raw(FILE *out, const Tensor *t) {
    char buffer[1 << 16];
    unsigned long long left = t->nbytes;
    FILE *in = fopen(t->raw, "rb");
    if (!in) die("cannot open raw file ", t->raw);
    while (left) {
        size_t chunk = left < sizeof buffer ? (size_t)left : sizeof buffer;
        if (fread(buffer, 1, chunk, in) != chunk) die("raw file shorter than its shape: ", t->raw);
        fwrite(buffer, 1, chunk, out);
        left -= chunk;
    }
    fclose(in);
}

/* the safetensors header: {"t0": {"dtype": ..., "shape": [...], "data_offsets": [a, b]}, ...} */
static size_t header(char *text, size_t size, int n) {
    size_t len = 0;
    unsigned long long offset = 0;
    int i, d;
    len += snprintf(text + len, size - len, "{");
    for (i = 0; i < n; i++) {
        tensors[i].offset = offset;
        len += snprintf(text + len, size - len, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", i,
                        tensors[i].dtype);
        for (d = 0; d < tensors[i].ndim; d++)
            len += snprintf(text + len, size - len, "%s%ld", d ? "," : "", tensors[i].dims[d]);
        len += snprintf(text + len, size - len, "],\"data_offsets\":[%llu,%llu]}", offset, offset + tensors[i].nbytes);
        offset += tensors[i].nbytes;
        if (len >= size) die("header too long", "");
    }
    len += snprintf(text + len, size - len, "}");
    while (len % 8) text[len++] = ' ';
    return len;
}

static void write_tensors(const char *dir, int n) {
    static char text[1 << 22];
    char path[2048];
    size_t len = header(text, sizeof text - 8, n);
    unsigned char prefix[8];
    int i;
    FILE *out;
    snprintf(path, sizeof path, "%s/tensors-00000.safetensors", dir);
    if (!(out = fopen(path, "wb"))) die("cannot write ", path);
    for (i = 0; i < 8; i++) prefix[i] = (unsigned char)(((unsigned long long)len >> (8 * i)) & 0xff);
    fwrite(prefix, 1, 8, out);
    fwrite(text, 1, len, out);
    for (i = 0; i < n; i++) copy_raw(out, &tensors[i]);
    if (fclose(out)) die("cannot finish ", path);
}

static void write_manifest(const char *dir, const char *model, int world, int rank, int n) {
    char path[2048], tmp[2048];
    int i;
    FILE *out;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    snprintf(tmp, sizeof tmp, "%s/manifest.json.tmp", dir);
    if (!(out = fopen(tmp, "w"))) die("cannot write ", tmp);
    fprintf(out, "{\"format\": \"dsv4spec-trace\", \"version\": 1, \"model\": \"%s\", \"config\": {},\n"
                 " \"tp\": {\"world_size\": %d, \"rank\": %d}, \"variants\": {},\n"
                 " \"files\": [\"tensors-00000.safetensors\"],\n \"records\": [", model, world, rank);
    for (i = 0; i < n; i++) {
        const Tensor *t = &tensors[i];
        fprintf(out, "%s\n  {\"layer\": %d, \"stage\": \"%s\", \"file\": \"tensors-00000.safetensors\", \"key\": \"t%d\", "
                     "\"step\": ", i ? "," : "", t->layer, t->stage, i);
        if (t->start_pos < 0) fprintf(out, "null}");
        else fprintf(out, "{\"kind\": \"%s\", \"start_pos\": %ld, \"seqlen\": %ld, \"row\": %d}}",
                     t->start_pos ? "decode" : "prefill", t->start_pos, t->seqlen, t->row);
    }
    fprintf(out, "]}\n");
    if (fclose(out)) die("cannot finish ", tmp);
    if (rename(tmp, path)) die("cannot rename to ", path);
}

int main(int argc, char **argv) {
    char model[32];
    int world, rank, n;
    if (argc != 3) die("usage: trace_writer PLAN OUT_DIR", "");
    n = read_plan(argv[1], model, &world, &rank);
    write_tensors(argv[2], n);
    write_manifest(argv[2], model, world, rank, n);
    return 0;
}
