/* An execution profile of a bench firmware, as a QEMU TCG plugin (plugin API version 1, as
 * QEMU 7.2 loads it). toolchain/lab/cycles.py builds it with the host's cc and reads what it
 * writes; the timing model there turns the profile into estimated cycles.
 *
 * For every instruction the firmware executes it counts, per phase:
 *   count    how often it ran;
 *   taken    how often the next instruction to run was not the one after it (a taken branch);
 *   entered  how often it ran right after another instruction than the one before it (it was
 *            branched to);
 *   flash    how many of its data reads fell in the flash region [flash_lo, flash_hi).
 * A phase ends each time the instruction at `mark` runs (the entry of the bench harness's
 * counter read), so phase k holds what ran between the k-th and the (k+1)-th reading.
 *
 * Arguments: out=FILE, mark=ADDRESS, flash=LO:HI (hexadecimal or decimal). It writes FILE
 * when QEMU exits:
 *   phase K
 *   ADDRESS SIZE COUNT TAKEN ENTERED FLASH      (one line per instruction that ran in phase K)
 *
 * QEMU's plugin header is not packaged by Debian, so the few declarations this file uses are
 * written here from the API's documentation; their layout is the version-1 ABI.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef uint32_t qemu_plugin_meminfo_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct {
  const char *target_name;
  struct {
    int min;
    int cur;
  } version;
  bool system_emulation;
  union {
    struct {
      int smp_vcpus;
      int max_vcpus;
    } system;
  };
} qemu_info_t;

enum { CB_NO_REGS = 0 };
enum { MEM_RW = 3 }; /* the callback filters out stores: QEMU 7.2 swaps R and W */

typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*insn_cb)(unsigned int, void *);
typedef void (*mem_cb)(unsigned int, qemu_plugin_meminfo_t, uint64_t, void *);
typedef void (*exit_cb)(qemu_plugin_id_t, void *);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *, insn_cb, int, void *);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *, mem_cb, int, int, void *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, exit_cb, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);
bool qemu_plugin_mem_is_store(qemu_plugin_meminfo_t);

EXPORT int qemu_plugin_version = 1;

/* One instruction: where it is, and its counts in the current phase. */
typedef struct {
  uint64_t address;
  uint32_t size;
  bool touched;  /* on the current phase's list */
  uint64_t count, taken, entered, flash;
} Instruction;

#define SLOTS (1u << 18) /* distinct instructions at most: more than any firmware of 1 MiB */

static Instruction *table[SLOTS];
static Instruction *touched[SLOTS];
static size_t touched_count, phase, distinct;
static Instruction *previous;
static uint64_t mark_address, flash_lo, flash_hi;
static FILE *out;
static bool failed;

static Instruction *instruction_at(uint64_t address, uint32_t size) {
  size_t slot = (size_t)((address >> 1) * 2654435761u) & (SLOTS - 1);
  while (table[slot] != NULL && table[slot]->address != address) slot = (slot + 1) & (SLOTS - 1);
  if (table[slot] == NULL) {
    if (++distinct >= SLOTS / 2 || (table[slot] = calloc(1, sizeof(Instruction))) == NULL) {
      failed = true;
      return NULL;
    }
    table[slot]->address = address;
    table[slot]->size = size;
  }
  return table[slot];
}

/* Writes the current phase's counts and starts the next phase. */
static void end_phase(void) {
  size_t i;
  fprintf(out, "phase %zu\n", phase++);
  for (i = 0; i < touched_count; ++i) {
    Instruction *insn = touched[i];
    fprintf(out, "%llx %u %llu %llu %llu %llu\n", (unsigned long long)insn->address,
            insn->size, (unsigned long long)insn->count, (unsigned long long)insn->taken,
            (unsigned long long)insn->entered, (unsigned long long)insn->flash);
    insn->count = insn->taken = insn->entered = insn->flash = 0;
    insn->touched = false;
  }
  touched_count = 0;
}

static void executed(unsigned int vcpu, void *data) {
  Instruction *insn = data;
  bool jumped = previous != NULL && insn->address != previous->address + previous->size;
  (void)vcpu;
  if (jumped) previous->taken++;
  if (insn->address == mark_address) end_phase();
  if (jumped) insn->entered++;
  if (!insn->touched) {
    insn->touched = true;
    touched[touched_count++] = insn;
  }
  insn->count++;
  previous = insn;
}

static void read_memory(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t address,
                        void *data) {
  Instruction *insn = data;
  (void)vcpu;
  if (!qemu_plugin_mem_is_store(info) && address >= flash_lo && address < flash_hi) insn->flash++;
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  size_t i, n = qemu_plugin_tb_n_insns(tb);
  (void)id;
  for (i = 0; i < n; ++i) {
    struct qemu_plugin_insn *handle = qemu_plugin_tb_get_insn(tb, i);
    Instruction *insn = instruction_at(qemu_plugin_insn_vaddr(handle),
                                       (uint32_t)qemu_plugin_insn_size(handle));
    if (insn == NULL) return;
    qemu_plugin_register_vcpu_insn_exec_cb(handle, executed, CB_NO_REGS, insn);
    qemu_plugin_register_vcpu_mem_cb(handle, read_memory, CB_NO_REGS, MEM_RW, insn);
  }
}

static void finished(qemu_plugin_id_t id, void *data) {
  (void)id;
  (void)data;
  end_phase();
  if (failed) fprintf(out, "overflow\n");
  fclose(out);
}

static bool argument(const char *arg, const char *key, const char **value) {
  size_t n = strlen(key);
  if (strncmp(arg, key, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                               char **argv) {
  const char *value, *path = NULL;
  char *end;
  int i;
  (void)info;
  for (i = 0; i < argc; ++i) {
    if (argument(argv[i], "out", &value)) {
      path = value;
    } else if (argument(argv[i], "mark", &value)) {
      mark_address = strtoull(value, NULL, 0);
    } else if (argument(argv[i], "flash", &value)) {
      flash_lo = strtoull(value, &end, 0);
      flash_hi = *end == ':' ? strtoull(end + 1, NULL, 0) : flash_lo;
    } else {
      fprintf(stderr, "profile plugin: unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  if (path == NULL || (out = fopen(path, "w")) == NULL) {
    fprintf(stderr, "profile plugin: cannot write the profile (out=FILE)\n");
    return 1;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
  qemu_plugin_register_atexit_cb(id, finished, NULL);
  return 0;
}
