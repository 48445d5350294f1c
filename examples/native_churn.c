/* native_churn: malloc churn that leaks nothing, for overhead benchmarks: after START_MS,
 * CHURN malloc/free pairs of random sizes 16..8192 from churn_block() (the same fixed-seed
 * sequence as native_leak; see malloc_churn.h). Prints "churn=N" and "loop_s=" (the loop
 * alone), sleeps HOLD_MS and exits.
 *
 * usage: native_churn [-c CHURN] [-w START_MS] [-t HOLD_MS]
 *   defaults: -c 200000 -w 300 -t 800; prints "pid=N" before the wait */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "malloc_churn.h"

static char stdout_buf[4096];

int main(int argc, char **argv)
{
    long churn = 200000;
    int start_ms = 300, hold_ms = 800, opt;
    setvbuf(stdout, stdout_buf, _IOLBF, sizeof stdout_buf);
    while ((opt = getopt(argc, argv, "c:w:t:")) != -1) {
        switch (opt) {
        case 'c': churn = atol(optarg); break;
        case 'w': start_ms = atoi(optarg); break;
        case 't': hold_ms = atoi(optarg); break;
        default: goto usage;
        }
    }
    if (optind != argc || churn < 0)
        goto usage;

    printf("pid=%d\n", (int)getpid());
    usleep(start_ms * 1000);
    double t0 = now_s();
    for (long i = 0; i < churn; i++)
        if (churn_block() < 0)
            return 1;
    double loop_s = now_s() - t0;
    printf("churn=%ld\n", churn);
    printf("loop_s=%.6f\n", loop_s);
    usleep(hold_ms * 1000);
    return 0;
usage:
    fprintf(stderr, "usage: native_churn [-c CHURN] [-w START_MS] [-t HOLD_MS]\n");
    return 2;
}
