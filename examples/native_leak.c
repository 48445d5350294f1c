/* native_leak: the known malloc leak. After START_MS it leaks exactly LEAKS blocks of SIZE
 * bytes (default 2039, a prime, of 4096 bytes: 8351744 bytes), each from malloc in
 * leak_block(), spread evenly among CHURN malloc/free pairs of random sizes 16..8192 from
 * churn_block() (fixed seed; see malloc_churn.h). The leaked pointers stay in a global array
 * (reachable at exit; no malloc of its own), and stdout uses a static buffer, so at exit the only live malloc
 * blocks this program made are the leaked ones. It prints "leaked=N bytes=B" and "loop_s=",
 * sleeps HOLD_MS and exits without freeing them.
 *
 * usage: native_leak [-n LEAKS] [-c CHURN] [-s SIZE] [-w START_MS] [-t HOLD_MS]
 *   defaults: -n 2039 -c 200000 -s 4096 -w 300 -t 800; prints "pid=N" before the wait */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "malloc_churn.h"

#define MAX_LEAKS (1 << 20)

/* Not static: with internal linkage and never read, the compiler drops the stores to it
 * and the blocks become unreachable rather than kept. */
void *leaked[MAX_LEAKS];
static char stdout_buf[4096];

/* Out of line, so the leaking user frame has a name in every chain. */
__attribute__((noipa)) void *leak_block(size_t size)
{
    char *p = malloc(size);
    if (p)
        p[0] = 1;
    return p;
}

int main(int argc, char **argv)
{
    long leaks = 2039, churn = 200000, size = 4096;
    int start_ms = 300, hold_ms = 800, opt;
    setvbuf(stdout, stdout_buf, _IOLBF, sizeof stdout_buf);
    while ((opt = getopt(argc, argv, "n:c:s:w:t:")) != -1) {
        switch (opt) {
        case 'n': leaks = atol(optarg); break;
        case 'c': churn = atol(optarg); break;
        case 's': size = atol(optarg); break;
        case 'w': start_ms = atoi(optarg); break;
        case 't': hold_ms = atoi(optarg); break;
        default: goto usage;
        }
    }
    if (optind != argc || leaks < 0 || leaks > MAX_LEAKS || churn < 0 || size <= 0)
        goto usage;

    printf("pid=%d\n", (int)getpid());
    usleep(start_ms * 1000);

    long stride = leaks > 0 && churn / leaks > 0 ? churn / leaks : 1;
    long n = 0;
    double t0 = now_s();
    for (long i = 0; i < churn; i++) {
        if (n < leaks && i % stride == 0 && !(leaked[n++] = leak_block(size)))
            return 1;
        if (churn_block() < 0)
            return 1;
    }
    while (n < leaks)
        if (!(leaked[n++] = leak_block(size)))
            return 1;
    double loop_s = now_s() - t0;

    printf("leaked=%ld bytes=%ld\n", n, n * size);
    printf("loop_s=%.6f\n", loop_s);
    usleep(hold_ms * 1000);
    return 0; /* the leaked blocks are never freed */
usage:
    fprintf(stderr, "usage: native_leak [-n LEAKS<=%d] [-c CHURN] [-s SIZE] [-w START_MS] [-t HOLD_MS]\n",
            MAX_LEAKS);
    return 2;
}
