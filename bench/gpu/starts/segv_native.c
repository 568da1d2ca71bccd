/* LD_PRELOADed into a server process: on SIGSEGV, the crashing thread's id and name, the faulting
 * instruction's library and symbol (dladdr), and its native stack (glibc backtrace) go to stderr, then
 * the default action (exit -11). Why: faulthandler prints only Python stacks, and the ResNet-18 servers'
 * crash (README.md) happens in a thread with no Python frame. PYTHONFAULTHANDLER=1 chains to this
 * handler after its own dump (it restores the previous handler and re-raises).
 * build: gcc -O1 -g -shared -fPIC -o segv_native.so segv_native.c -ldl
 * Variants for old_runtime_arms.sh (preloading the full library made the crash vanish, old_runtime_preload_ab.sh):
 * -DNO_HANDLER only runs backtrace() at load (glibc's unwinder and libgcc_s set up at process start);
 * -DNO_CONSTRUCTOR is an empty preload (what preloading alone changes: the link map, the address layout). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void say(const char *text) { (void)!write(2, text, strlen(text)); }

static void where(const char *what, void *pc) {
    char line[512];
    Dl_info info;
    memset(&info, 0, sizeof info);
    dladdr(pc, &info);
    snprintf(line, sizeof line, "native %s: %p in %s (+0x%lx) %s+0x%lx\n", what, pc,
             info.dli_fname ? info.dli_fname : "?", (unsigned long)((char *)pc - (char *)info.dli_fbase),
             info.dli_sname ? info.dli_sname : "?", (unsigned long)((char *)pc - (char *)info.dli_saddr));
    say(line);
}

static void on_segv(int sig, siginfo_t *si, void *raw) {
    char line[256], name[32] = "?";
    ucontext_t *uc = raw;
    pthread_getname_np(pthread_self(), name, sizeof name);
    snprintf(line, sizeof line, "\nnative SIGSEGV: tid %ld, thread name '%s', fault address %p\n",
             (long)syscall(SYS_gettid), name, si->si_addr);
    say(line);
    where("pc", (void *)uc->uc_mcontext.gregs[REG_RIP]);
    void *frames[64];
    int n = backtrace(frames, 64);
    for (int i = 0; i < n; i++) where("frame", frames[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

#ifndef NO_CONSTRUCTOR
__attribute__((constructor)) static void install(void) {
    void *warm[2];
    backtrace(warm, 2);                      /* loads libgcc_s now, not inside the handler */
#ifndef NO_HANDLER
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
#endif
}
#endif

