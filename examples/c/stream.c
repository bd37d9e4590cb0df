/* STREAM triad (a = b + s * c) over arrays tiermem places: each array is an object of a
 * manager over DRAM and a slower device, pinned for the loop (a pinned object is never
 * moved), run once with every array in fast memory and once after `tm_move` sent them to
 * the slow device (an emulated one is charged what the loop moved: `tm_charge`).
 * Build: cc stream.c $(pkg-config --cflags --libs tiermem)
 * Usage: stream [elements] [slow device spec] [fast device spec]
 * Specs may name memory spaces: `stream 1000000 large_cap hbw` places the arrays on the
 * nodes of those spaces nearest this thread (TIERMEM_SYSFS: a fixture machine's). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "tiermem.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        tm_status s_ = (call);                                                       \
        if (s_ != TM_OK) {                                                           \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tm_status_name(s_),        \
                    tm_last_error());                                                \
            return 1;                                                                \
        }                                                                            \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One triad over the three objects, pinned for the loop; returns GB/s or -1. */
static double triad(const tm_manager *m, const uint64_t ids[3], size_t n, double s) {
    void *p[3];
    size_t bytes;
    uint64_t tickets[3];
    for (int k = 0; k < 3; k++)
        if (tm_pin(m, ids[k], k == 0, &p[k], &bytes, &tickets[k]) != TM_OK) return -1;
    double *a = p[0], *b = p[1], *c = p[2];
    double t = now();
    for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    /* The loop ran at the speed of the memory under it; an emulated device adds the time
     * the device it names would have taken, when told what the loop moved. */
    uint64_t charges[9] = {ids[0], 0, n * sizeof(double), ids[1], n * sizeof(double), 0,
                           ids[2], n * sizeof(double), 0};
    tm_status st = tm_charge(m, charges, 3, 1);
    t = now() - t;
    if (st != TM_OK) return -1;
    for (int k = 0; k < 3; k++)
        if (tm_unpin(m, tickets[k]) != TM_OK) return -1;
    return 3.0 * n * sizeof(double) / t / 1e9;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 22;
    const char *slow = argc > 2 ? argv[2] : "emulated:optane-pmem";
    const char *fast = argc > 3 ? argv[3] : "dram";
    size_t bytes = n * sizeof(double);
    tm_device devices[2] = {{fast, 3 * bytes + (1 << 20)}, {slow, 3 * bytes + (1 << 20)}};
    tm_manager *m;
    CHECK(tm_manager_new(devices, 2, "lru_in_place", &m));
    uint64_t ids[3];
    for (int k = 0; k < 3; k++) CHECK(tm_alloc(m, bytes, TM_PLACE_FAST, &ids[k]));
    for (int k = 1; k < 3; k++) { /* b = 1, 2, 3, ...; c = 2 */
        void *p;
        size_t len;
        uint64_t t;
        CHECK(tm_pin(m, ids[k], 1, &p, &len, &t));
        double *x = p;
        for (size_t i = 0; i < n; i++) x[i] = k == 1 ? (double)i : 2.0;
        CHECK(tm_unpin(m, t));
    }
    double fast_gbs = triad(m, ids, n, 3.0);
    for (int k = 0; k < 3; k++) CHECK(tm_move(m, ids[k], TM_PLACE_SLOW));
    size_t dev;
    CHECK(tm_device_of(m, ids[0], &dev));
    double slow_gbs = triad(m, ids, n, 3.0);
    if (fast_gbs < 0 || slow_gbs < 0) {
        fprintf(stderr, "triad failed: %s\n", tm_last_error());
        return 1;
    }
    /* Check a = b + 3c after both runs (the data moved with its objects). */
    void *p;
    size_t len;
    uint64_t t;
    CHECK(tm_pin(m, ids[0], 0, &p, &len, &t));
    const double *a = p;
    for (size_t i = 0; i < n; i++)
        if (a[i] != (double)i + 6.0) {
            fprintf(stderr, "a[%zu] = %g, expected %g\n", i, a[i], (double)i + 6.0);
            return 1;
        }
    CHECK(tm_unpin(m, t));
    printf("triad of %zu doubles: %s %.2f GB/s, %s %.2f GB/s (device %zu); results checked\n",
           n, fast, fast_gbs, slow, slow_gbs, dev);
    for (size_t d = 0; d < 2; d++) { /* what each device was charged */
        tm_counters c;
        const char *name;
        CHECK(tm_device_counters(m, d, &c, &name));
        printf("device %zu %s: read %llu written %llu stall_ns %llu moves_in %llu moves_out %llu\n", d, name,
               (unsigned long long)c.bytes_read, (unsigned long long)c.bytes_written,
               (unsigned long long)c.kernel_stall_ns, (unsigned long long)c.moves_in,
               (unsigned long long)c.moves_out);
    }
    for (int k = 0; k < 3; k++) CHECK(tm_free(m, ids[k]));
    tm_manager_free(m);
    return 0;
}
