//! Thin wrappers around the Linux calls pg_stride uses: clocks, the kernel's accounting
//! of a thread, CPU affinity and scheduling policies (layer 1 of docs/design.md §7, beside
//! `pg`, which wraps PostgreSQL). Each one is a system call or a vDSO read that cannot
//! raise a PostgreSQL ERROR.

/// The thread CPU clock, ns. A system call on Linux: read once per chunk of tuples,
/// never per tuple (docs/design.md §8).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Time this thread has spent runnable but waiting for a CPU, ns: the second field of
/// /proc/thread-self/schedstat (the kernel's `run_delay`). 0 where the file is missing
/// (a kernel without schedstats). A file read: for tracing, not for every slice.
pub fn thread_run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Voluntary context switches of this thread so far (getrusage's `ru_nvcsw`): each time
/// it blocked — I/O, a lock, a latch — rather than was preempted. One system call.
pub fn thread_voluntary_switches() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills the one we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD asks for the calling thread; `usage` is writable.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_nvcsw as u64
}

/// The CPU time of process `pid` (all its threads; a backend has one), ns, as the
/// kernel last accounted it: for another process that runs, only at its context switches
/// and scheduler ticks, so it moves in steps of a tick (sched/src/stall.rs). `None` once
/// it has exited. One system call.
pub fn process_cpu_ns(pid: i32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes the clock id we pass.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC, ns: the same clock in every process of the machine, so statements'
/// arrival and finish times from different backends compare (the tuner's trace).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPUs this process may run on (its affinity mask, `sched_getaffinity`),
/// ascending; `None` if the mask cannot be read.
pub fn allowed_cpus() -> Option<Vec<u32>> {
    // SAFETY: a cpu_set_t is plain bits, valid zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `set`
    // for the calling process (pid 0).
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return None;
    }
    let mut cpus = Vec::new();
    for cpu in 0..8 * size_of::<libc::cpu_set_t>() {
        // SAFETY: CPU_ISSET reads bit `cpu` of the set, below its size.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            cpus.push(cpu as u32);
        }
    }
    Some(cpus)
}

/// Restricts this process to `cpus` (`sched_setaffinity`). CPUs beyond the kernel's
/// set size are ignored. The kernel refuses a mask with no CPU this process may use
/// (e.g. outside its cpuset).
pub fn set_allowed_cpus(cpus: &[u32]) -> std::io::Result<()> {
    set_allowed_cpus_of(0, cpus)
}

/// Restricts process `pid` (0: this one) to `cpus`, as [`set_allowed_cpus`]. Another
/// process of the server runs as the same user, which the kernel requires.
pub fn set_allowed_cpus_of(pid: i32, cpus: &[u32]) -> std::io::Result<()> {
    // SAFETY: a cpu_set_t is plain bits, valid zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if (cpu as usize) < 8 * size_of::<libc::cpu_set_t>() {
            // SAFETY: CPU_SET sets bit `cpu` of the set, below its size.
            unsafe { libc::CPU_SET(cpu as usize, &mut set) };
        }
    }
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of `set` for
    // process `pid`.
    os_result(unsafe { libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &set) }.into())
}

/// A system call's result: 0 is success, anything else leaves its error in `errno`.
fn os_result(rc: i64) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets the kernel's scheduling policy of process `pid` (0: this one) to `SCHED_BATCH`
/// (`batch`) or back to `SCHED_OTHER`. A batch process woken up does not preempt the
/// one running on its CPU; it runs when that one sleeps or uses up its time slice.
/// Another process of the server runs as the same user, which the kernel requires.
pub fn set_batch_policy(pid: i32, batch: bool) -> std::io::Result<()> {
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` and changes process `pid`'s policy only.
    os_result(unsafe { libc::sched_setscheduler(pid, policy, &param) }.into())
}

/// Sets this process's kernel time slice, ns (`sched_setattr`'s `sched_runtime`: the
/// size of each request EEVDF serves, Linux 6.12 and later), keeping its nice value; 0
/// gives the kernel's default back. A process with a longer slice than a waking one is
/// preempted by it at once (the kernel's PREEMPT_SHORT). `class`: `Some(true)` puts it
/// in `SCHED_IDLE`, which any other process waking on its CPU preempts at once and which
/// the kernel wakes other processes onto as if the CPU were idle; `Some(false)` in
/// `SCHED_OTHER`; `None` keeps its policy. Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` or
/// a high enough `RLIMIT_NICE` ([`may_leave_idle_class`]).
pub fn set_own_scheduling(slice_ns: u64, class: Option<bool>) -> std::io::Result<()> {
    /// Keep the policy (include/uapi/linux/sched.h).
    const SCHED_FLAG_KEEP_POLICY: u64 = 0x08;
    let nice = own_nice();
    let (policy, flags) = match class {
        Some(true) => (libc::SCHED_IDLE, 0),
        Some(false) => (libc::SCHED_OTHER, 0),
        None => (libc::SCHED_OTHER, SCHED_FLAG_KEEP_POLICY),
    };
    let attr = libc::sched_attr {
        size: size_of::<libc::sched_attr>() as u32,
        sched_policy: policy as u32,
        sched_flags: flags,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: slice_ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr reads `attr`, of the size it says, for this process only.
    os_result(unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0) })
}

/// This process's nice value.
fn own_nice() -> i32 {
    // SAFETY: getpriority only reads this process's nice value.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

/// Whether this process could go back from `SCHED_IDLE` to `SCHED_OTHER` at its nice
/// value: the kernel treats `SCHED_IDLE` as nice 20 and lets a process lower its nice
/// value only with `CAP_SYS_NICE` or an `RLIMIT_NICE` of at least 20 - nice (systemd's
/// `LimitNICE=+0`). A process must not enter a class it cannot leave: the next
/// statement it runs would get no CPU beside any other work.
pub fn may_leave_idle_class() -> bool {
    /// Bit of CAP_SYS_NICE in the capability sets (include/uapi/linux/capability.h).
    const CAP_SYS_NICE: u32 = 23;
    let nice = own_nice();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut lim) };
    if rc == 0 && lim.rlim_cur >= (20 - nice).max(0) as libc::rlim_t {
        return true;
    }
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
    })
}

/// The CPU this process runs on now (`sched_getcpu`: a vDSO read on Linux, tens of ns,
/// no system call); it may have moved by the time the caller looks. `None` if the
/// kernel cannot tell.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and only returns a number.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
}
