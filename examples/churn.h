/* One churn iteration shared by the kernel examples: a pipe and a socketpair, a byte
 * through each, all closed again. Leaks nothing. Returns 0 on success. */
#ifndef MEMPROF_EXAMPLES_CHURN_H
#define MEMPROF_EXAMPLES_CHURN_H
#include <sys/socket.h>
#include <unistd.h>

static int churn_once(void)
{
    int p[2], s[2];
    char c = 'x';
    if (pipe(p) < 0)
        return -1;
    if (write(p[1], &c, 1) != 1 || read(p[0], &c, 1) != 1)
        return -1;
    close(p[0]);
    close(p[1]);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, s) < 0)
        return -1;
    if (write(s[1], &c, 1) != 1 || read(s[0], &c, 1) != 1)
        return -1;
    close(s[0]);
    close(s[1]);
    return 0;
}
#endif
