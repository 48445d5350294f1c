/* One malloc churn iteration shared by native_leak and native_churn: a block of a random size
 * in 16..8192 bytes (xorshift64*, fixed seed, so every run makes the same sizes), written,
 * and freed again. Leaks nothing. */
#ifndef MEMPROF_EXAMPLES_MALLOC_CHURN_H
#define MEMPROF_EXAMPLES_MALLOC_CHURN_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define CHURN_MIN 16
#define CHURN_MAX 8192

static uint64_t churn_rng = 0x9e3779b97f4a7c15ULL;

static size_t churn_size(void)
{
    churn_rng ^= churn_rng >> 12;
    churn_rng ^= churn_rng << 25;
    churn_rng ^= churn_rng >> 27;
    return CHURN_MIN + (churn_rng * 0x2545f4914f6cdd1dULL >> 32) % (CHURN_MAX - CHURN_MIN + 1);
}

/* Out of line (noipa: not inlined, cloned or renamed), so the churning frame has one name
 * in every chain. The pointer escapes through the asm, so the compiler cannot drop the
 * malloc/free pair. Returns 0 on success. */
__attribute__((noipa)) int churn_block(void)
{
    size_t n = churn_size();
    char *p = malloc(n);
    if (!p)
        return -1;
    p[0] = (char)n;
    p[n - 1] = (char)n;
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
#endif
