//! The CPU scheduler's settings: the slots, the slice, the decay of priorities, pinning,
//! prediction and the trace (docs/configuration.md), registered from `_PG_init` and
//! read through the accessors below.

use crate::gucs::Setting;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Largest accepted `pg_stride.cpu_slots`; far above any core count PostgreSQL runs on.
const MAX_CPU_SLOTS: i32 = 4096;
/// Largest accepted priority (`priority_initial`, `priority_min`): the groups' limit.
const MAX_PRIORITY: i32 = pg_stride_sched::groups::PRIORITY_INITIAL.max as i32;

static CPU_SLOTS: Setting<i32> = Setting::new(GucSetting::<i32>::new(0));
static SLICE_MS: Setting<f64> = Setting::new(GucSetting::<f64>::new(2.0));
static DECAY_LAMBDA: Setting<f64> = Setting::new(GucSetting::<f64>::new(0.9));
static DECAY_START: Setting<i32> = Setting::new(GucSetting::<i32>::new(8));
static PRIORITY_INITIAL: Setting<i32> = Setting::new(GucSetting::<i32>::new(10_000));
/// `pg_stride.priority_min`: 1, not the paper's 100 (wagner2021 §4). A statement
/// predicted long starts at p0 × threshold / prediction, within the floor: at 100, every
/// statement predicted above 1.6 s (10,000 × 16 ms / 100) started at the same priority,
/// so one of 2 s shared the CPU evenly with one of a minute (docs/internals/
/// scheduling.md, "How statements are classified").
static PRIORITY_MIN: Setting<i32> = Setting::new(GucSetting::<i32>::new(1));
static PIN_SLOTS: Setting<bool> = Setting::new(GucSetting::<bool>::new(false));
static TUNER: Setting<bool> = Setting::new(GucSetting::<bool>::new(false));
/// `pg_stride.predict`: statements start at a priority predicted from their
/// fingerprint's history (`pg_stride_sched::predict`), so that short ones are told from
/// long ones without groups or tags (docs/internals/scheduling.md, "How statements are
/// classified").
static PREDICT: Setting<bool> = Setting::new(GucSetting::<bool>::new(true));
static TRACE: Setting<bool> = Setting::new(GucSetting::<bool>::new(false));

/// CPU slots in effect: `pg_stride.cpu_slots`, or the CPUs available to this server
/// when it is 0 (docs/design.md §1: one slot per core, wagner2021 §2).
pub fn effective_cpu_slots() -> u32 {
    // Counting the CPUs reads the affinity mask and cgroup files: once per process, not
    // at every watchdog round.
    static AVAILABLE_CPUS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    match CPU_SLOTS.get() {
        0 => *AVAILABLE_CPUS
            .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
        n => n as u32,
    }
}

/// `pg_stride.slice` in ms.
pub fn slice_ms() -> f64 {
    SLICE_MS.get()
}

/// The shortest `pg_stride.slice`, in ms and in ns.
const SLICE_MIN_MS: f64 = 0.1;
pub const SLICE_MIN_NS: u64 = (SLICE_MIN_MS * 1_000_000.0) as u64;

/// `pg_stride.slice` in ns.
pub fn slice_ns() -> u64 {
    (SLICE_MS.get() * 1_000_000.0) as u64
}

/// The decay settings as the scheduling core takes them; one quantum is one slice
/// (wagner2021 §3.2: the update quantum equals t_max).
pub fn decay_params() -> pg_stride_sched::DecayParams {
    pg_stride_sched::DecayParams {
        lambda: DECAY_LAMBDA.get(),
        d_start: DECAY_START.get() as u32,
        quantum_ns: slice_ns(),
    }
}

/// `pg_stride.priority_initial`, the priority of a group without its own.
pub(super) fn priority_initial() -> i32 {
    PRIORITY_INITIAL.get()
}

/// `pg_stride.priority_min`, the floor of a group without its own.
pub(super) fn priority_min() -> i32 {
    PRIORITY_MIN.get()
}

/// `pg_stride.pin_slots`.
pub(super) fn pin_slots() -> bool {
    PIN_SLOTS.get()
}

/// `pg_stride.tuner`: the tuner worker chooses the decay settings.
pub fn tuner_on() -> bool {
    TUNER.get()
}

/// `pg_stride.predict`: statements start at a priority predicted from their history.
pub fn predicts() -> bool {
    PREDICT.get()
}

/// `pg_stride.trace`.
pub fn traces() -> bool {
    TRACE.get()
}

/// Registers the CPU scheduler's settings. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_stride.cpu_slots",
        c"Number of processes that may execute scheduled query work at once.",
        c"0 means the number of CPUs this server may use.",
        CPU_SLOTS.inner(),
        0,
        MAX_CPU_SLOTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"pg_stride.slice",
        c"Target CPU time a process runs between two scheduling checks.",
        c"Yield points are placed so that the work between two checks takes about this long.",
        SLICE_MS.inner(),
        SLICE_MIN_MS,
        1000.0,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"pg_stride.decay_lambda",
        c"Factor by which a query's priority decays per slice of CPU once decay started.",
        c"1 keeps priorities where they start (fair sharing, or by predicted size with pg_stride.predict on); lower values favour short queries more.",
        DECAY_LAMBDA.inner(),
        0.0,
        1.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.decay_start",
        c"Slices of CPU a query receives before its priority starts to decay.",
        c"",
        DECAY_START.inner(),
        0,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.priority_initial",
        c"Priority a query starts with, unless its resource group sets its own.",
        c"Higher priorities get more CPU; see pg_stride.decay_lambda.",
        PRIORITY_INITIAL.inner(),
        1,
        MAX_PRIORITY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.priority_min",
        c"Lowest priority a query decays to, unless its resource group sets its own.",
        c"Keeps long queries from starving; a value above pg_stride.priority_initial acts as priority_initial (no decay).",
        PRIORITY_MIN.inner(),
        1,
        MAX_PRIORITY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.pin_slots",
        c"Runs each CPU-slot holder on a CPU of its own, which travels with the slot when it is handed over.",
        c"Not with pg_stride.numa = bind, where processes follow their node's CPUs. A holder that finds no CPU free runs unpinned.",
        PIN_SLOTS.inner(),
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.tuner",
        c"Lets the tuner worker choose decay_lambda and decay_start from the traced workload.",
        c"Groups with their own decay settings keep them. A reload that changes pg_stride.decay_lambda, decay_start or slice installs the new values; see the view pg_stride.tuner.",
        TUNER.inner(),
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.predict",
        c"Starts each CPU-scheduled statement at a priority predicted from the CPU its query identifier used before.",
        c"A statement predicted short keeps its group's initial priority for decay_start slices or twice its prediction, whichever is longer; one predicted long starts lower, the lower the longer its prediction, and holds that priority until it has used twice its prediction. Needs compute_query_id (on or auto); see the view pg_stride.statements.",
        PREDICT.inner(),
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.trace",
        c"Records every CPU-scheduled statement in the trace that the view pg_stride.trace shows.",
        c"The tuner records them too while it is on. A record holds the statement's arrival, admission and finish times, its CPU in and outside CPU slots, and its waits for slots.",
        TRACE.inner(),
        GucContext::Suset,
        GucFlags::default(),
    );
}
