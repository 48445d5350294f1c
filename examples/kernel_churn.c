/* kernel_churn: creates and closes pipes and socketpairs in a loop (about 40 kmem events
 * per iteration). Leaks nothing: the control workload, and the overhead benchmark.
 *
 * usage: kernel_churn [ITERATIONS]   (default 200000); prints the loop's own wall time. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "churn.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? atol(argv[1]) : 200000;
    double t0 = now_s();
    for (long i = 0; i < iterations; i++) {
        if (churn_once() < 0) {
            perror("kernel_churn");
            return 1;
        }
    }
    printf("loop_s=%.6f iterations=%ld\n", now_s() - t0, iterations);
    return 0;
}
