//! The tuner's shared state: which decay parameters are in force (the configured or the
//! tuned ones, `pg_stride_sched::tuner::DecayChoice`) and the latest refreshes, for the
//! view `pg_stride.tuner`. Written under the tuner's LWLock by the process applying a
//! reload or by the tuner worker, read by the view.

use super::locks::{LockId, ShmemLock};
use pg_stride_sched::tuner::{DecayChoice, Refresh};
use pg_stride_sched::{DecayParams, SchedShared};
use std::cell::UnsafeCell;
use std::sync::atomic::AtomicI32;

/// Refreshes the view shows: the last hour at the default interval.
pub const HISTORY: usize = 64;

/// One refresh as the view shows it.
#[derive(Clone, Copy)]
pub struct RefreshRow {
    /// When it ended (TimestampTz, µs).
    pub at: i64,
    pub refresh: Refresh,
    /// Trace records lost since the previous refresh (overwritten before they were
    /// read, or dropped by a writer).
    pub lost: u64,
    /// Wall-clock and CPU time of the refresh, µs.
    pub elapsed_us: u64,
    pub cpu_us: u64,
}

struct History {
    rows: [Option<RefreshRow>; HISTORY],
    /// Refreshes recorded so far; the next goes to `count % HISTORY`.
    count: u64,
}

/// Plain data under the tuner lock; no pointers, so valid at any mapping address.
#[repr(C)]
pub struct TunerState {
    /// pid of the `pg_stride tuner` worker, 0 while it is not running.
    pub pid: AtomicI32,
    choice: UnsafeCell<DecayChoice>,
    history: UnsafeCell<History>,
}

impl TunerState {
    /// Initialises the state in place. Caller: shared-memory initialisation.
    ///
    /// # Safety
    /// `at` points to writable, unused memory for a `TunerState`.
    pub unsafe fn init(at: *mut TunerState, configured: DecayParams, tuner_on: bool) {
        // SAFETY: the caller's promise.
        unsafe {
            at.write(TunerState {
                pid: AtomicI32::new(0),
                choice: UnsafeCell::new(DecayChoice::new(configured, tuner_on)),
                history: UnsafeCell::new(History {
                    rows: [None; HISTORY],
                    count: 0,
                }),
            })
        };
    }

    fn with<R>(&self, f: impl FnOnce(&mut DecayChoice, &mut History) -> R) -> R {
        let _guard = ShmemLock::exclusive(LockId::Tuner);
        // SAFETY: the exclusive lock makes this process the only one using the state;
        // `f` is pure logic that raises no errors.
        unsafe { f(&mut *self.choice.get(), &mut *self.history.get()) }
    }

    /// A reload applies the configured decay parameters; the tuned ones stay in force
    /// unless the configuration changed or the tuner is off (`DecayChoice::reload`).
    pub fn apply_configured(&self, sched: &SchedShared, configured: DecayParams, tuner_on: bool) {
        self.with(|choice, _| sched.set_decay(choice.reload(configured, tuner_on)));
    }

    /// What a search starts from: the configuration's generation, the configured
    /// parameters, and whether tuned ones are in force.
    pub fn choice(&self) -> DecayChoice {
        self.with(|choice, _| *choice)
    }

    /// Installs the tuner's `tuned` parameters unless the configuration changed since
    /// `generation`; returns whether they are in force.
    pub fn adopt(&self, sched: &SchedShared, tuned: DecayParams, generation: u64) -> bool {
        self.with(|choice, _| match choice.adopt(tuned, generation) {
            Some(params) => {
                sched.set_decay(params);
                true
            }
            None => false,
        })
    }

    /// Records a refresh for the view.
    pub fn record(&self, row: RefreshRow) {
        self.with(|_, history| {
            history.rows[(history.count % HISTORY as u64) as usize] = Some(row);
            history.count += 1;
        });
    }

    /// The recorded refreshes, oldest first.
    pub fn history(&self) -> Vec<RefreshRow> {
        let (rows, count) = self.with(|_, history| (history.rows, history.count));
        let start = count.saturating_sub(HISTORY as u64);
        (start..count)
            .filter_map(|i| rows[(i % HISTORY as u64) as usize])
            .collect()
    }
}
