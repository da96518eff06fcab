/* insn-count-plugin.c - a QEMU TCG plugin (API version 1, QEMU 7.x user mode) that counts executed
 * guest instructions and prints the running total whenever the guest calls getppid(2), which the
 * guest uses as a marker around the work it wants measured. It must not change guest behaviour.
 *
 * Debian's qemu-user is built with plugin support but ships neither plugins nor qemu-plugin.h, so
 * the few API entry points used are declared here (signatures of include/qemu/qemu-plugin.h, v1).
 * Build (host compiler): cc -O2 -shared -fPIC -o insn-count.so insn-count-plugin.c
 * Use: qemu-aarch64 -plugin ./insn-count.so[,out=FILE][,marker=NR] ... ; guest: os.getppid() -> a line
 *      "insn-count: N" (N = instructions executed so far, all threads) on FILE or stderr.
 * The count is per translation block entry (the block's instruction count is added when it starts),
 * non-atomic across guest threads: measure with one guest thread for exact numbers. */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t; /* only passed through, never read */
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num,
                                              uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                                              uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_syscall_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);

QEMU_PLUGIN_EXPORT int qemu_plugin_version = 1;
QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv);

static uint64_t n_insns;
/* getppid on the generic syscall table (aarch64, riscv64); 32-bit arm (EABI) numbers it 64 */
static int64_t marker_syscall = 173;
static FILE *out;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    /* an inline add costs one host instruction per block, no helper call: the run stays fast */
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &n_insns,
                                             (uint64_t)qemu_plugin_tb_n_insns(tb));
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1,
                       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7,
                       uint64_t a8) {
    (void)id, (void)vcpu_index, (void)a1, (void)a2, (void)a3, (void)a4, (void)a5, (void)a6, (void)a7,
        (void)a8;
    if (num == marker_syscall) {
        fprintf(out, "insn-count: %" PRIu64 "\n", n_insns);
        fflush(out);
    }
}

static void at_exit(qemu_plugin_id_t id, void *userdata) {
    (void)id, (void)userdata;
    fprintf(out, "insn-count total: %" PRIu64 "\n", n_insns);
    fflush(out);
    if (out != stderr) fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv) {
    (void)info;
    out = stderr;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            out = fopen(argv[i] + 4, "w");
            if (!out) {
                perror(argv[i] + 4);
                return 1;
            }
        } else if (strncmp(argv[i], "marker=", 7) == 0) {
            marker_syscall = strtoll(argv[i] + 7, NULL, 10);
        } else {
            fprintf(stderr, "insn-count plugin: unknown argument %s\n", argv[i]);
            return 1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
