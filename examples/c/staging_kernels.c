/* Pattern-aware staging (Arima & Schulz) over C arrays: the six kernels RandomAccess,
 * PTRANS, Jacobi 2D, Jacobi 3D, CG and FFT with OpenMP. For each, the loop's index stream
 * over the array it would stage is sampled (tm_analyse), the staging decision taken on a
 * break-even line (tm_stage_decide), and the kernel run on a fast copy chunk by chunk
 * (tm_stage_run) when it says so, else in place; either way its result is checked.
 * Build: cc -fopenmp staging_kernels.c $(pkg-config --cflags --libs tiermem) -lm
 * Usage: staging_kernels LINE.json [DUMP_DIR]
 *   LINE.json: a break-even line (tiermem calibrate's "staging" entry, or Python's
 *   tiermem.hpc.staging.BreakEven.as_dict()); DUMP_DIR: where each kernel's index stream is
 *   written (NAME.i64, native int64) so another tool can decide on the same stream. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tiermem.h"

#define CHECK(call)                                                                          \
    do {                                                                                     \
        tm_status s_ = (call);                                                               \
        if (s_ != TM_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tm_status_name(s_), tm_last_error()); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

typedef struct {
    const char *name;
    int64_t *idx;     /* the loop's accesses to the staged array, in loop order */
    size_t n_idx;
    double u;         /* accesses per element */
    int read, write;
    uint64_t elem;    /* bytes per element */
} stream_t;

static tm_manager *mgr;
static tm_break_even *line;
static const char *dump_dir;
static int failures;

/* ---- the kernels, each over a pointer to the array that may be staged ---- */

enum { RA_LOG = 16, PT_N = 384, J2_N = 384, J3_N = 48, CG_M = 128, FFT_LOG = 14 };

static uint64_t ra_next(uint64_t r) { return (r << 1) ^ ((int64_t)r < 0 ? 7u : 0u); }

static int random_access(void *t, size_t off, size_t len, void *ctx) {
    (void)off; (void)len; (void)ctx;
    uint64_t *table = t, mask = ((uint64_t)1 << RA_LOG) - 1;
    size_t updates = (size_t)4 << RA_LOG;
    uint64_t r = 1;
    for (size_t i = 0; i < updates; i++) { /* serial: HPCC's updates race; these are exact */
        r = ra_next(r);
        table[r & mask] ^= r;
    }
    return 0;
}

typedef struct { const double *a; double *b; } pt_ctx;
static int ptrans(void *a, size_t off, size_t len, void *ctx) {
    (void)off; (void)len;
    const double *A = a;
    double *B = ((pt_ctx *)ctx)->b;
#pragma omp parallel for
    for (int i = 0; i < PT_N; i++)
        for (int j = 0; j < PT_N; j++) B[(size_t)i * PT_N + j] = A[(size_t)j * PT_N + i];
    return 0;
}

static int jacobi2d(void *in, size_t off, size_t len, void *ctx) {
    (void)off; (void)len;
    const double *x = in;
    double *y = ctx;
#pragma omp parallel for
    for (int i = 1; i < J2_N - 1; i++)
        for (int j = 1; j < J2_N - 1; j++)
            y[i * J2_N + j] = 0.25 * (x[(i - 1) * J2_N + j] + x[(i + 1) * J2_N + j] +
                                      x[i * J2_N + j - 1] + x[i * J2_N + j + 1]);
    return 0;
}

#define J3(i, j, k) (((size_t)(i) * J3_N + (j)) * J3_N + (k))
static int jacobi3d(void *in, size_t off, size_t len, void *ctx) {
    (void)off; (void)len;
    const double *x = in;
    double *y = ctx;
#pragma omp parallel for
    for (int i = 1; i < J3_N - 1; i++)
        for (int j = 1; j < J3_N - 1; j++)
            for (int k = 1; k < J3_N - 1; k++)
                y[J3(i, j, k)] = (x[J3(i - 1, j, k)] + x[J3(i + 1, j, k)] + x[J3(i, j - 1, k)] +
                                  x[J3(i, j + 1, k)] + x[J3(i, j, k - 1)] + x[J3(i, j, k + 1)]) / 6.0;
    return 0;
}

/* CG on the 5-point Laplacian of a CG_M x CG_M grid (SPD), CSR; the staged array is x of
 * the product y = A x, run as CG's matrix-vector step. */
typedef struct { int *rowptr, *col; double *val; double *y; int n; } cg_ctx;
static int spmv(void *xv, size_t off, size_t len, void *ctx) {
    (void)off; (void)len;
    const double *x = xv;
    cg_ctx *c = ctx;
#pragma omp parallel for
    for (int i = 0; i < c->n; i++) {
        double s = 0;
        for (int k = c->rowptr[i]; k < c->rowptr[i + 1]; k++) s += c->val[k] * x[c->col[k]];
        c->y[i] = s;
    }
    return 0;
}

static int fft_sign;
static int fft(void *data, size_t off, size_t len, void *ctx) { /* in place, radix 2 */
    (void)off; (void)len; (void)ctx;
    double *z = data; /* interleaved re, im */
    size_t n = (size_t)1 << FFT_LOG;
    for (size_t i = 1, j = 0; i < n; i++) { /* bit reversal */
        size_t bit = n >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) {
            double t0 = z[2 * i], t1 = z[2 * i + 1];
            z[2 * i] = z[2 * j]; z[2 * i + 1] = z[2 * j + 1];
            z[2 * j] = t0; z[2 * j + 1] = t1;
        }
    }
    for (size_t half = 1; half < n; half <<= 1) {
        double ang = fft_sign * 3.14159265358979323846 / (double)half;
#pragma omp parallel for
        for (size_t k = 0; k < n; k += 2 * half)
            for (size_t m = 0; m < half; m++) {
                double wr = cos(ang * m), wi = sin(ang * m);
                size_t a = k + m, b = a + half;
                double xr = z[2 * b] * wr - z[2 * b + 1] * wi, xi = z[2 * b] * wi + z[2 * b + 1] * wr;
                z[2 * b] = z[2 * a] - xr; z[2 * b + 1] = z[2 * a + 1] - xi;
                z[2 * a] += xr; z[2 * a + 1] += xi;
            }
    }
    return 0;
}

/* ---- streams, decisions, runs ---- */

static tm_decision decide(stream_t s) {
    tm_rates r;
    tm_decision d;
    int threads = omp_get_max_threads();
    CHECK(tm_analyse(s.idx, s.n_idx, s.elem, (size_t)threads, &r));
    CHECK(tm_stage_decide(line, &r, s.u, s.read, s.write, 0.0, &d));
    printf("%s threads=%d elem=%llu u=%.17g read=%d write=%d r_paf=%.6f r_sf=%.6f r_lf=%.6f stage=%d "
           "t_boost=%.17g t_copy=%.17g\n",
           s.name, threads, (unsigned long long)s.elem, s.u, s.read, s.write, r.r_paf, r.r_sf, r.r_lf, d.stage, d.t_boost, d.t_copy);
    if (dump_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.i64", dump_dir, s.name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(s.idx, sizeof(int64_t), s.n_idx, f) != s.n_idx) { perror(path); exit(1); }
        fclose(f);
    }
    free(s.idx);
    return d;
}

/* Run `body` on `data` staged (chunk = the whole array: the kernels reach all of it) or in
 * place, as `d` says. */
static void run(tm_decision d, stream_t s, tm_chunk_fn body, void *data, size_t bytes, void *ctx) {
    if (d.stage) CHECK(tm_stage_run(mgr, data, bytes, bytes, s.read, s.write, body, ctx));
    else body(data, 0, bytes, ctx);
}

static void expect(int ok, const char *what) {
    printf("%s %s\n", ok ? "checked" : "WRONG", what);
    failures += !ok;
}

static int64_t *indices(size_t n) { return malloc(n * sizeof(int64_t)); }

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s LINE.json [DUMP_DIR]\n", argv[0]); return 2; }
    dump_dir = argc > 2 ? argv[2] : NULL;
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 2; }
    char json[8192];
    size_t got = fread(json, 1, sizeof json - 1, f);
    fclose(f);
    json[got] = 0;
    CHECK(tm_break_even_from_json(json, &line));
    tm_device devs[2] = {{"dram", 64u << 20}, {"emulated:optane-pmem", 64u << 20}};
    CHECK(tm_manager_new(devs, 2, "lru_in_place", &mgr));

    { /* RandomAccess: twice the same updates give the table back. */
        size_t n = (size_t)1 << RA_LOG, m = 4 * n;
        stream_t s = {"random_access", indices(m), m, (double)m / n, 1, 1, 8};
        uint64_t r = 1;
        for (size_t i = 0; i < m; i++) { r = ra_next(r); s.idx[i] = (int64_t)(r & (n - 1)); }
        tm_decision d = decide(s);
        uint64_t *t = malloc(n * 8);
        for (size_t i = 0; i < n; i++) t[i] = i;
        run(d, s, random_access, t, n * 8, NULL);
        run(d, s, random_access, t, n * 8, NULL);
        int ok = 1;
        for (size_t i = 0; i < n; i++) ok &= t[i] == i;
        expect(ok, "random_access: the updates applied twice cancel");
        free(t);
    }
    { /* PTRANS: B = A^T. */
        size_t n = PT_N, nn = n * n;
        stream_t s = {"ptrans", indices(nn), nn, 1.0, 1, 0, 8};
        for (size_t i = 0, k = 0; i < n; i++) for (size_t j = 0; j < n; j++) s.idx[k++] = (int64_t)(j * n + i);
        tm_decision d = decide(s);
        double *a = malloc(nn * 8), *b = malloc(nn * 8);
        for (size_t i = 0; i < nn; i++) a[i] = (double)i;
        pt_ctx c = {a, b};
        run(d, s, ptrans, a, nn * 8, &c);
        int ok = 1;
        for (size_t i = 0; i < n; i++) for (size_t j = 0; j < n; j++) ok &= b[i * n + j] == a[j * n + i];
        expect(ok, "ptrans: B is A transposed");
        free(a); free(b);
    }
    { /* Jacobi 2D: a linear field is its own average. */
        size_t n = J2_N, pts = (n - 2) * (n - 2);
        stream_t s = {"jacobi2d", indices(4 * pts), 4 * pts, 4.0 * pts / (n * n), 1, 0, 8};
        size_t k = 0;
        for (size_t i = 1; i < n - 1; i++) for (size_t j = 1; j < n - 1; j++) {
            s.idx[k++] = (int64_t)((i - 1) * n + j); s.idx[k++] = (int64_t)((i + 1) * n + j);
            s.idx[k++] = (int64_t)(i * n + j - 1); s.idx[k++] = (int64_t)(i * n + j + 1);
        }
        tm_decision d = decide(s);
        double *x = malloc(n * n * 8), *y = calloc(n * n, 8);
        for (size_t i = 0; i < n; i++) for (size_t j = 0; j < n; j++) x[i * n + j] = 2.0 * i + 3.0 * j;
        run(d, s, jacobi2d, x, n * n * 8, y);
        int ok = 1;
        for (size_t i = 1; i < n - 1; i++) for (size_t j = 1; j < n - 1; j++) ok &= fabs(y[i * n + j] - x[i * n + j]) < 1e-9;
        expect(ok, "jacobi2d: a linear field is kept");
        free(x); free(y);
    }
    { /* Jacobi 3D. */
        size_t n = J3_N, pts = (n - 2) * (n - 2) * (n - 2);
        stream_t s = {"jacobi3d", indices(6 * pts), 6 * pts, 6.0 * pts / (n * n * n), 1, 0, 8};
        size_t k = 0;
        for (size_t i = 1; i < n - 1; i++) for (size_t j = 1; j < n - 1; j++) for (size_t l = 1; l < n - 1; l++) {
            int64_t o[6] = {(int64_t)J3(i - 1, j, l), (int64_t)J3(i + 1, j, l), (int64_t)J3(i, j - 1, l),
                            (int64_t)J3(i, j + 1, l), (int64_t)J3(i, j, l - 1), (int64_t)J3(i, j, l + 1)};
            memcpy(&s.idx[k], o, sizeof o);
            k += 6;
        }
        tm_decision d = decide(s);
        double *x = malloc(n * n * n * 8), *y = calloc(n * n * n, 8);
        for (size_t i = 0; i < n; i++) for (size_t j = 0; j < n; j++) for (size_t l = 0; l < n; l++) x[J3(i, j, l)] = (double)(i + 2 * j + 3 * l);
        run(d, s, jacobi3d, x, n * n * n * 8, y);
        int ok = 1;
        for (size_t i = 1; i < n - 1; i++) for (size_t j = 1; j < n - 1; j++) for (size_t l = 1; l < n - 1; l++) ok &= fabs(y[J3(i, j, l)] - x[J3(i, j, l)]) < 1e-9;
        expect(ok, "jacobi3d: a linear field is kept");
        free(x); free(y);
    }
    { /* CG on the 2D Laplacian: the residual falls. */
        int m = CG_M, n = m * m;
        int *rowptr = malloc((size_t)(n + 1) * sizeof(int)), *col = malloc((size_t)n * 5 * sizeof(int));
        double *val = malloc((size_t)n * 5 * 8);
        int nnz = 0;
        for (int i = 0; i < n; i++) {
            rowptr[i] = nnz;
            int r = i / m, c = i % m;
            int nb[5] = {r > 0 ? i - m : -1, c > 0 ? i - 1 : -1, i, c < m - 1 ? i + 1 : -1, r < m - 1 ? i + m : -1};
            for (int q = 0; q < 5; q++) if (nb[q] >= 0) { col[nnz] = nb[q]; val[nnz++] = nb[q] == i ? 4.0 : -1.0; }
        }
        rowptr[n] = nnz;
        stream_t s = {"cg", indices((size_t)nnz), (size_t)nnz, (double)nnz / n, 1, 0, 8};
        for (int k = 0; k < nnz; k++) s.idx[k] = col[k];
        tm_decision d = decide(s);
        double *x = calloc((size_t)n, 8), *r = malloc((size_t)n * 8), *p = malloc((size_t)n * 8), *q = malloc((size_t)n * 8);
        cg_ctx c = {rowptr, col, val, q, n};
        double rr = 0, rr0;
        for (int i = 0; i < n; i++) { r[i] = p[i] = 1.0; rr += 1.0; }
        rr0 = rr;
        for (int it = 0; it < 400 && rr > 1e-20 * rr0; it++) {
            run(d, s, spmv, p, (size_t)n * 8, &c);
            double pq = 0;
            for (int i = 0; i < n; i++) pq += p[i] * q[i];
            double alpha = rr / pq, rr_new = 0;
            for (int i = 0; i < n; i++) { x[i] += alpha * p[i]; r[i] -= alpha * q[i]; rr_new += r[i] * r[i]; }
            for (int i = 0; i < n; i++) p[i] = r[i] + rr_new / rr * p[i];
            rr = rr_new;
        }
        expect(sqrt(rr / rr0) < 1e-8, "cg: the residual falls by 10^8 within 400 steps");
        free(rowptr); free(col); free(val); free(x); free(r); free(p); free(q);
    }
    { /* FFT: forward then inverse gives the signal back. */
        size_t n = (size_t)1 << FFT_LOG, k = 0;
        size_t accesses = 2 * n * FFT_LOG;
        stream_t s = {"fft", indices(accesses), accesses, 2.0 * FFT_LOG, 1, 1, 16};
        for (size_t half = 1; half < n; half <<= 1)
            for (size_t b = 0; b < n; b += 2 * half)
                for (size_t m = 0; m < half; m++) { s.idx[k++] = (int64_t)(b + m); s.idx[k++] = (int64_t)(b + m + half); }
        tm_decision d = decide(s);
        double *z = malloc(2 * n * 8), *z0 = malloc(2 * n * 8);
        for (size_t i = 0; i < 2 * n; i++) z[i] = z0[i] = sin(0.001 * (double)(i * i % 9973));
        fft_sign = -1;
        run(d, s, fft, z, 2 * n * 8, NULL);
        fft_sign = 1;
        run(d, s, fft, z, 2 * n * 8, NULL);
        double err = 0;
        for (size_t i = 0; i < 2 * n; i++) err = fmax(err, fabs(z[i] / (double)n - z0[i]));
        expect(err < 1e-9, "fft: forward then inverse gives the signal back");
        free(z); free(z0);
    }
    tm_break_even_free(line);
    tm_manager_free(mgr);
    printf("%d wrong\n", failures);
    return failures != 0;
}
