/* sigbus.c - turns a SIGBUS inside a registered file mapping into one line naming the file, then exit.
 * A model file truncated on disk while mapped makes reads of the lost pages fault with SIGBUS; nothing
 * can resume such a read, so the process reports which file and exits with EL_SIGBUS_EXIT_CODE (a
 * service manager restarts it). A SIGBUS anywhere else goes to the previous handler (or the default).
 * The handler only uses async-signal-safe calls (write, sigaction, _exit) and lock-free slots. */
#define _POSIX_C_SOURCE 200809L /* sigaction, siginfo_t under -std=c11 */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "edgellama.h"

#define SLOTS 64
#define NAME_MAX_BYTES 512

typedef struct {
    uintptr_t start; /* 0 = free; published last (release), read first (acquire) */
    size_t len;
    char name[NAME_MAX_BYTES];
} mapping;

static mapping slots[SLOTS];
static struct sigaction previous;
static int installed; /* guarded by the atomic exchange in install() */

static void put(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void put_str(const char *s) { put(s, strlen(s)); }

static void put_u64(uint64_t v) {
    char buf[24];
    size_t i = sizeof buf;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    put(buf + i, sizeof buf - i);
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
    const uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; i < SLOTS; i++) {
        const uintptr_t start = __atomic_load_n(&slots[i].start, __ATOMIC_ACQUIRE);
        if (start > 1 && addr >= start && addr - start < slots[i].len) {
            put_str("edgellama: error: ");
            put_str(slots[i].name);
            put_str(": the file was truncated or changed on disk while in use (bus error reading byte ");
            put_u64((uint64_t)(addr - start));
            put_str(" of its mapping); replace model files by renaming a new file over them, never in place\n");
            _exit(EL_SIGBUS_EXIT_CODE);
        }
    }
    /* not ours: let the handler we replaced (or the default action) have it */
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) {
            previous.sa_sigaction(sig, info, ctx);
            return;
        }
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    /* returning re-executes the faulting access, which now takes the default action (core dump) */
}

static int install(void) {
    if (__atomic_exchange_n(&installed, 1, __ATOMIC_ACQ_REL)) return EL_OK;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) != 0) {
        __atomic_store_n(&installed, 0, __ATOMIC_RELEASE);
        return EL_EINVAL;
    }
    return EL_OK;
}

int el_sigbus_register(const void *addr, size_t len, const char *name) {
    if (!addr || len == 0 || !name) return EL_EINVAL;
    int st = install();
    if (st != EL_OK) return st;
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t expected = 0;
        /* claim the slot with the sentinel 1 (ignored by the handler) while it is filled */
        if (!__atomic_compare_exchange_n(&slots[i].start, &expected, (uintptr_t)1, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        size_t n = strlen(name);
        if (n >= NAME_MAX_BYTES) n = NAME_MAX_BYTES - 1;
        memcpy(slots[i].name, name, n);
        slots[i].name[n] = '\0';
        slots[i].len = len;
        __atomic_store_n(&slots[i].start, (uintptr_t)addr, __ATOMIC_RELEASE);
        return EL_OK;
    }
    return EL_ENOMEM;
}

int el_sigbus_unregister(const void *addr) {
    if (!addr) return EL_EINVAL;
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t expected = (uintptr_t)addr;
        if (__atomic_compare_exchange_n(&slots[i].start, &expected, (uintptr_t)0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return EL_OK;
    }
    return EL_EINVAL;
}
