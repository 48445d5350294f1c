/* two_sites: two functions, site_a and site_b, each calling glibc's pipe() directly; main
 * calls them in turn and keeps every pipe: 70 from site_a, 130 from site_b, interleaved
 * (seven of each twenty from site_a). pipe() is a frameless wrapper, so frame-pointer
 * unwinding from the system call skips whichever site called it; memprof puts the caller
 * back from the word at the user stack pointer (memprof/sources/symbols/frameless.py).
 * A report must show two chains, site_a's with 70 pipes and site_b's with 130.
 *
 * usage: two_sites [-t HOLD_MS] */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PIPES 200
#define FROM_A_PER_20 7

__attribute__((noinline)) int site_a(int fds[2])
{
    return pipe(fds);
}

__attribute__((noinline)) int site_b(int fds[2])
{
    return pipe(fds);
}

int main(int argc, char **argv)
{
    int hold_ms = 300, opt, fds[PIPES][2], from_a = 0;
    while ((opt = getopt(argc, argv, "t:")) != -1) {
        if (opt != 't') {
            fprintf(stderr, "usage: two_sites [-t HOLD_MS]\n");
            return 2;
        }
        hold_ms = atoi(optarg);
    }
    for (int i = 0; i < PIPES; i++) {
        int a = i % 20 < FROM_A_PER_20;
        from_a += a;
        if ((a ? site_a : site_b)(fds[i]) < 0)
            return 1;
    }
    usleep(hold_ms * 1000);
    printf("site_a=%d site_b=%d pid=%d\n", from_a, PIPES - from_a, (int)getpid());
    fflush(stdout);
    return 0; /* the kernel's teardown closes the pipes at exit */
}
