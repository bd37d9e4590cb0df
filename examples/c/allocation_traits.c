/* The H2M slides' allocation_traits example, written against H2M's published API only
 * (../shared/papers/terboven-h2m-ppam22-slides.txt): three buffers of the slides' DGEMM
 * application placed by traits (A: hbw, priority 1; B: low_lat, priority 15; C: hbw,
 * priority 5), a product computed, A's traits changed to large_cap and migrated, the
 * product recomputed from the same pointers and checked.
 *
 *   cc allocation_traits.c $(pkg-config --cflags --libs tiermem)
 *   H2M_VERBOSE=1 ./a.out [n]       # the mapping, the views and each placement on stderr
 */
#include <h2m.h>
#include <stdio.h>
#include <stdlib.h>

static int check(int rc, const char *what) {
    if (rc != H2M_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
    return rc;
}

static double *alloc_traits(size_t n, h2m_alloc_trait_value_t space, int prio) {
    int err;
    h2m_alloc_trait_t traits[2] = {{h2m_atk_pref_mem_space, {.atv = space}},
                                   {h2m_atk_access_prio, {.i = prio}}};
    double *p = h2m_alloc_w_traits(n * n * sizeof(double), &err, 2, traits);
    check(err, "h2m_alloc_w_traits");
    return p;
}

static double product_sum(const double *a, const double *b, double *c, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
            sum += s;
        }
    return sum;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 128;
    check(h2m_init(), "h2m_init");
    check(h2m_thread_init(), "h2m_thread_init");
    check(h2m_post_init_serial(), "h2m_post_init_serial");

    double *a = alloc_traits(n, h2m_atv_mem_space_hbw, 1);
    double *b = alloc_traits(n, h2m_atv_mem_space_low_lat, 15);
    double *c = alloc_traits(n, h2m_atv_mem_space_hbw, 5);
    for (size_t i = 0; i < n * n; i++) {
        a[i] = (double)(i % 7);
        b[i] = (double)(i % 5) + 1;
    }
    double before = product_sum(a, b, c, n);

    /* A is read rarely now: move it to the large-capacity space. */
    h2m_alloc_trait_t cold[1] = {{h2m_atk_pref_mem_space, {.atv = h2m_atv_mem_space_large_cap}}};
    check(h2m_update_traits(a, n * n * sizeof(double), 1, cold, 0), "h2m_update_traits");
    check(h2m_apply_migration(), "h2m_apply_migration");
    void *only[1] = {b};
    check(h2m_apply_migration_for_allocations(only, 1), "h2m_apply_migration_for_allocations");
    double after = product_sum(a, b, c, n);

    printf("n = %zu: sum %.1f before migration, %.1f after\n", n, before, after);
    if (before != after) {
        fprintf(stderr, "the product changed across migration\n");
        return 1;
    }
    check(h2m_free(a), "h2m_free");
    check(h2m_free(b), "h2m_free");
    check(h2m_free(c), "h2m_free");
    check(h2m_thread_finalize(), "h2m_thread_finalize");
    check(h2m_finalize(), "h2m_finalize");
    printf("results checked\n");
    return 0;
}
