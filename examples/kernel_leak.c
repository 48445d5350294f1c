/* kernel_leak: holds N pipes open (default 257, a prime, so counts are unmistakable) while
 * churning others, waits, then exits without closing them: the known kernel leak. Each held
 * pipe is a pipe_inode_info and its buffer array (both from alloc_pipe_info), an inode, a
 * dentry and two struct files; the kernel's teardown frees them at exit.
 *
 * usage: kernel_leak [-n HELD] [-c CHURN_ITERATIONS] [-t HOLD_MS] [-w START_WAIT_MS] [-s] [-f]
 *   -f  do the work in a forked child (the parent only waits): tests process-tree following
 *   -w  sleep first (for `record --pid`), after printing "pid=N"
 *   -s  wait for a line on standard input first (or its end), after printing "pid=N": a
 *       `record --pid` test starts the work once the recording has begun, however long the
 *       recorder took to start */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "churn.h"

__attribute__((noinline)) static int leak_and_churn(int held, long churn, int hold_ms)
{
    int (*fds)[2] = calloc(held, sizeof *fds);
    long stride = held > 0 && churn / held > 0 ? churn / held : 1;
    int n = 0;
    for (long i = 0; i < churn; i++) {
        if (n < held && i % stride == 0 && pipe(fds[n++]) < 0)
            return 1;
        if (churn_once() < 0)
            return 1;
    }
    while (n < held)
        if (pipe(fds[n++]) < 0)
            return 1;
    usleep(hold_ms * 1000);
    printf("held=%d pid=%d\n", held, (int)getpid());
    fflush(stdout);
    return 0; /* returns into exit(): the kernel's teardown closes the held pipes */
}

int main(int argc, char **argv)
{
    int held = 257, hold_ms = 800, start_wait_ms = 0, wait_for_line = 0, fork_child = 0, opt;
    long churn = 20000;
    while ((opt = getopt(argc, argv, "n:c:t:w:sf")) != -1) {
        switch (opt) {
        case 'n': held = atoi(optarg); break;
        case 'c': churn = atol(optarg); break;
        case 't': hold_ms = atoi(optarg); break;
        case 'w': start_wait_ms = atoi(optarg); break;
        case 's': wait_for_line = 1; break;
        case 'f': fork_child = 1; break;
        default:
            fprintf(stderr, "usage: kernel_leak [-n HELD] [-c CHURN] [-t HOLD_MS] [-w START_WAIT_MS] [-s] [-f]\n");
            return 2;
        }
    }
    if (start_wait_ms || wait_for_line) {
        printf("pid=%d\n", (int)getpid());
        fflush(stdout);
    }
    if (start_wait_ms)
        usleep(start_wait_ms * 1000);
    if (wait_for_line) {
        int c;
        while ((c = getchar()) != EOF && c != '\n')
            ;
    }
    if (!fork_child)
        return leak_and_churn(held, churn, hold_ms);
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0)
        _exit(leak_and_churn(held, churn, hold_ms));
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
