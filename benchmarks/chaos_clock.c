/* A host's wall clock stepped, as an NTP step or an operator's `date -s` steps it, for the
 * processes started with this library in LD_PRELOAD (benchmarks/chaos_faults.py builds it with
 * `cc -shared -fPIC`).
 *
 * CLOCK_REALTIME (and its coarse variant), gettimeofday() and time() read the real clock plus an
 * offset in nanoseconds: a signed 64-bit integer in the file CHAOS_CLOCK_FILE names, mapped
 * shared, so a write to that file steps the clock of every such process at once. The monotonic
 * clocks are left alone, as a wall-clock step leaves them.
 *
 * Why not libfaketime: the one Debian 12 ships (0.9.10) makes clock_nanosleep() fail with EINVAL
 * when it is told to leave the monotonic clock alone (FAKETIME_DONT_FAKE_MONOTONIC=1), and every
 * Python time.sleep() calls clock_nanosleep(); faking the monotonic clock as well would be a
 * different fault (time that jumps for timeouts too). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void chaos_clock_init(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("CHAOS_CLOCK_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) offset_ns = (volatile const int64_t *)p;
}

static void shifted(struct timespec *ts) {
    int64_t off = offset_ns ? *offset_ns : 0;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + off;
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (real_clock_gettime == NULL) chaos_clock_init();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shifted(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
