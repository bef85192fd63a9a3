//! The `pg_stride tuner` background worker (wagner2021 §4; docs/design.md §9): every `pg_stride.tuner_interval` it replays the last
//! `pg_stride.tuner_window` of the trace in the simulator over candidate decay
//! parameters and installs the best if it beats those in force by the margin; every
//! second it looks whether the newest statements' sizes have shifted, and then checks
//! the parameters in force against the configured ones at once.
//!
//! A process of its own, separate from the scheduler worker, whose watchdog must run
//! every few ms while a refresh simulates for tens to hundreds of ms. It reads shared
//! memory only (no database, no SPI) and runs at a lower CPU priority than queries.
//! The search is `pg_stride_sched::tuner`, the same code `pg_stride-sim tune` and the
//! closed-loop simulations run.

use crate::gucs::Setting;
use crate::os;
use crate::shmem::{self, RefreshRow};
use crate::{admission, cpu, pg};
use pg_stride_sched::sim::{SimConfig, StartMode};
use pg_stride_sched::tuner::{Check, LoopSettings, Refresh, Trace, Tuner};
use pg_stride_sched::{GroupId, SchedShared};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Name and `backend_type` of the tuner worker.
pub const TUNER_NAME: &str = "pg_stride tuner";

/// Niceness of the tuner: its simulations yield the CPU to queries.
const NICENESS: i32 = 10;

/// What the worker keeps between its rounds.
struct Tracking {
    tuner: Tuner,
    loop_settings: LoopSettings,
    /// When the next search is due.
    due: Instant,
    /// The ring's head at the previous reading, and its drop count then.
    next_ticket: u64,
    dropped: u64,
    /// Records lost since the last recorded refresh.
    lost: u64,
}

impl Tracking {
    /// Tracking starts afresh: the first search comes once a window has been traced.
    fn new(next_ticket: u64, dropped: u64) -> Tracking {
        Tracking {
            tuner: Tuner::new(LoopSettings::default().tuner),
            loop_settings: LoopSettings::default(),
            due: Instant::now() + window(),
            next_ticket,
            dropped,
            lost: 0,
        }
    }
}

static TUNER_WINDOW_S: Setting<i32> = Setting::new(GucSetting::<i32>::new(20));
static TUNER_INTERVAL_S: Setting<i32> = Setting::new(GucSetting::<i32>::new(60));

/// Registers the tuner worker's settings (`pg_stride.tuner` itself is the CPU
/// scheduler's). Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_stride.tuner_window",
        c"Span of the most recent statements the tuner replays at each refresh.",
        c"",
        TUNER_WINDOW_S.inner(),
        1,
        3_600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_stride.tuner_interval",
        c"How often the tuner searches decay parameters for the traced workload.",
        c"It also checks every second whether the sizes of the newest statements have shifted.",
        TUNER_INTERVAL_S.inner(),
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

fn window() -> Duration {
    Duration::from_secs(TUNER_WINDOW_S.get().max(1) as u64)
}

fn interval() -> Duration {
    Duration::from_secs(TUNER_INTERVAL_S.get().max(1) as u64)
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_stride_tuner_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the connection gives it a pg_stat_activity row, nothing else.
    BackgroundWorker::connect_worker_to_spi(None, None);
    let Some(shared) = shmem::shared() else {
        return;
    };
    let (Some(sched), Some(ring)) = (shared.sched(), shared.trace()) else {
        return;
    };
    pg::lower_cpu_priority(NICENESS);
    shared.tuner.pid.store(pg::my_pid(), Ordering::Release);
    pg::on_exit(super::signals::forget_this_worker);
    let mut tracking: Option<Tracking> = None;
    let check = Duration::from_nanos(LoopSettings::default().check_ns);
    while BackgroundWorker::wait_latch(Some(check)) {
        super::signals::reload_config_if_signalled();
        if !cpu::tuner_on() {
            // Off: what was tracked is stale by the time it is switched on again.
            tracking = None;
            continue;
        }
        let t = tracking.get_or_insert_with(|| Tracking::new(ring.head(), ring.lost()));
        round(shared, sched, t);
    }
    super::signals::exit_to_be_restarted();
}

/// One round: a search when one is due, else a look for a shift.
fn round(shared: &shmem::Shared, sched: &SchedShared, t: &mut Tracking) {
    let started = Instant::now();
    let cpu_before = os::thread_cpu_ns();
    let now_ns = os::monotonic_ns();
    let start_ns = now_ns.saturating_sub(window().as_nanos() as u64);
    let read = cpu::read_window(shared, start_ns, t.next_ticket);
    t.lost += read.overwritten + read.dropped.saturating_sub(t.dropped);
    (t.next_ticket, t.dropped) = (read.next_ticket, read.dropped);
    let trace = Trace::from_records(&read.records, start_ns, now_ns);
    // A shorter pg_stride.tuner_interval set by a reload applies at once.
    t.due = t.due.min(started + interval());
    let search = started >= t.due;
    let recent = (!search).then(|| trace.recent(t.loop_settings.shift_queries));
    if let Some(recent) = &recent {
        if !t.tuner.shifted(recent, sched.decay().quantum_ns) {
            return;
        }
    }
    // Read before the search: a configuration change during it makes `adopt` drop it.
    let choice = shared.tuner.choice();
    let sim = sim_config(sched);
    let refresh = match &recent {
        None => {
            t.due = started + interval();
            t.tuner.refresh(&trace, &sim)
        }
        Some(recent) => {
            // The next search waits until the window holds only the new workload.
            t.due = t.due.min(started + window());
            t.tuner.fall_back(recent, &sim, choice.configured())
        }
    };
    let installed = refresh.adopted && shared.tuner.adopt(sched, refresh.new, choice.generation());
    if refresh.adopted && !installed {
        pgrx::log!("pg_stride: the tuner's choice was dropped: the decay settings changed, or pg_stride.tuner was switched off, while it searched");
    } else if installed {
        log_installed(&refresh);
    }
    shared.tuner.record(RefreshRow {
        at: pg::now_timestamp(),
        refresh: Refresh {
            adopted: installed,
            new: if installed { refresh.new } else { refresh.old },
            ..refresh
        },
        lost: std::mem::take(&mut t.lost),
        elapsed_us: started.elapsed().as_micros() as u64,
        cpu_us: os::thread_cpu_ns().saturating_sub(cpu_before) / 1_000,
    });
}

/// The system as it is, for the simulator: the slots, slice, decay and groups in
/// force, the admission limit, and whether waiters preempt lower priorities.
fn sim_config(sched: &SchedShared) -> SimConfig {
    SimConfig {
        slots: cpu::effective_cpu_slots(),
        slice_ns: cpu::slice_ns(),
        policy: sched.policy(),
        decay: sched.decay(),
        groups: (0..sched.capacity().max_groups)
            .map(|g| sched.group_config(GroupId(g)))
            .collect(),
        max_active: admission::max_active_queries(),
        horizon_ns: None,
        // The tuner replays the decision rule; its replay has no NUMA nodes.
        numa: None,
        preempt: true,
        // Predictions learnt from the window's own statements only (the server's table
        // knows more): the replay then leans towards plain decay.
        start: if cpu::predicts() {
            StartMode::Predicted
        } else {
            StartMode::Decay
        },
    }
}

fn log_installed(r: &Refresh) {
    let what = match r.check {
        Check::Search => "search",
        Check::Fallback => "shift check",
    };
    let predicted = match (r.predicted_old, r.predicted_best) {
        (Some(old), Some(new)) => format!(
            ", predicted mean slowdown {:.2} -> {:.2}",
            old.mean, new.mean
        ),
        _ => String::new(),
    };
    pgrx::log!(
        "pg_stride: the tuner's {what} over {} statements installed decay_lambda = {:.3}, decay_start = {} (was {:.3}, {}){predicted}",
        r.queries,
        r.new.lambda,
        r.new.d_start,
        r.old.lambda,
        r.old.d_start
    );
}
