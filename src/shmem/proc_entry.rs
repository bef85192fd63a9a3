//! One process's entry in the shared region ([`ProcEntry`]), indexed by its PGPROC
//! number, with the part other processes write ([`Inbox`]) and the CPU accounting its
//! parallel workers add to it ([`SharedAccounting`]); the writer rules are in the
//! header of `shmem`.

use pg_stride_sched::admission::Lease;
use pg_stride_sched::tuner::Accounting;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Per-process state, in two parts by writer (the rules are in the module header): the
/// fields a process writes itself, and its [`Inbox`], which other processes write. Each
/// part has cache lines of its own: backends write their own fields at every statement,
/// and entries sharing a line would make their processes' caches fight over it; a giver
/// or the scheduler worker writing a process's inbox leaves the line its owner writes
/// alone.
#[derive(Default)]
#[repr(C, align(64))]
pub struct ProcEntry {
    /// pid of the process that last registered work here; 0 when unused. Set by the
    /// process when it claims the entry; cleared by the scheduler worker, with a
    /// compare-and-swap, once that process is gone.
    pub pid: AtomicI32,
    /// Top-level statements of this process that are admitted and executing.
    pub running: AtomicU32,
    /// Statements this process registered, counted (wrapping) before `running` counts
    /// each: a reader that sees the same count around its reads saw one statement.
    pub registered: AtomicU32,
    /// Top-level statements of this process that wait for admission.
    pub queued: AtomicU32,
    /// Group slot of this process's latest registered statement.
    pub group: AtomicU32,
    /// When the statement now waiting for admission arrived (TimestampTz, µs).
    pub queued_since: AtomicI64,
    /// When this process's latest statement was admitted (TimestampTz, µs).
    pub admitted_at: AtomicI64,
    /// Query entry (+1; 0 = none) this process registered in the CPU scheduler; its
    /// parallel workers join it.
    pub cpu_query: AtomicU32,
    /// Query entry (+1) this process could not free because parallel workers had not
    /// left it yet; the scheduler worker frees it later.
    pub orphan_query: AtomicU32,
    /// 1 while the process is paused at a yield point, waiting for a CPU slot.
    pub paused: AtomicU32,
    /// Parallel workers the current statement's plan asked for, over all its Gathers.
    pub workers_planned: AtomicU32,
    /// Parallel workers granted to the current statement (the concurrency hint).
    pub workers_granted: AtomicU32,
    /// Time the current statement spent paused at yield points, µs.
    pub paused_us: AtomicU64,
    /// 1 while this process's statement runs with its yield points armed: it checks in
    /// within a chunk of tuples, and takes back there an admission lent while it waited
    /// for its client. Written by the process when that changes (`cpu::member`).
    pub checks_in: AtomicU32,
    /// The count in `registered` of the latest statement if it never joins CPU
    /// scheduling (a write, a read too small to schedule; the count after it
    /// otherwise): it has no yield points, and the scheduler worker sends it a
    /// runaway-query rule's query cancel at once. Written before that count, and a count
    /// rather than a flag, so that a reader who sees the old count never takes the new
    /// statement's value for the old one's.
    pub unscheduled: AtomicU32,
    /// The count in `registered` of this process's last statement that ended, or of the
    /// last of a client command's statements (its rule's cancel forgotten:
    /// [`ProcEntry::forget_rule_cancels_from`]): the scheduler worker withdraws a cancel
    /// it asked for a statement that ended meanwhile, and takes what runs under an
    /// ended statement's count for an open cursor's fetch.
    pub ended: AtomicU32,
    /// Check-ins and slots taken by this process, counted (wrapping) so that the
    /// watchdog sees a holder that reached no yield point during a whole round.
    pub checkins: AtomicU32,
    /// The share of its last slice's wall-clock time this holder ran, ‰, and when that
    /// slice ended (CLOCK_MONOTONIC ns; 0 = no share to go by), published at its slice
    /// ends with pinned slots (`slice_share::publish`). A holder that swaps CPUs with
    /// this one withdraws its share (stores 0 in `slice_share_at_ns`, `slice_share::moved`).
    pub slice_ran_permille: AtomicU32,
    pub slice_share_at_ns: AtomicU64,
    /// When the statement that registered `cpu_query` arrived (before admission) and
    /// was admitted, CLOCK_MONOTONIC ns: the tuner traces statements still running.
    pub query_arrival_ns: AtomicU64,
    pub query_admit_ns: AtomicU64,
    /// Rows the leader's current statement produced (returned, or changed by a write),
    /// as of its last check-in at a yield point: what runaway-query rules read.
    pub rows: AtomicU64,
    /// CPU time, ns, that the query entry in `cpu_query` had used when the current
    /// statement registered, for a statement of a later client command than the entry's
    /// (run beside an open cursor, whose query it joins or, not scheduled itself, keeps):
    /// runaway-query rules judge the statement by what the query used since. 0 otherwise.
    pub cpu_base_ns: AtomicU64,
    /// The query id of this process's current statement (0 = not computed), for the
    /// hits of runaway-query rules.
    pub query_id: AtomicU64,
    /// The CPU predicted for the query this process registered, and its class
    /// ([`ProcEntry::prediction`]); 0 = none.
    prediction: AtomicU64,
    /// The admission this process keeps between its statements while nobody waits. A
    /// protocol of its own (`pg_stride_sched::admission::Lease`): the scheduler worker
    /// lends it while the process waits for its client.
    pub lease: Lease,
    /// Statements of group slot `group` admitted at once and not yet added to the
    /// group's `admitted` counter, which every backend would otherwise write at every
    /// statement; counted for the slot's incarnation `pending_incarnation`.
    /// `pg_stride.reset_stats()` zeroes it from another backend: a statistics reset.
    pub admitted_pending: AtomicU64,
    pub pending_incarnation: AtomicU32,
    /// What other processes write for this one.
    pub inbox: Inbox,
}

/// The part of a [`ProcEntry`] that other processes write: a process that hands this
/// one a slot or a CPU, its parallel workers, and the scheduler worker. The owner reads
/// what they wrote, and clears the requests it acted on.
#[derive(Default)]
#[repr(C, align(64))]
pub struct Inbox {
    /// When a slot was last handed to this process (CLOCK_MONOTONIC ns), written by the
    /// process that hands it over just before setting the latch: the hand-off's latency.
    pub slot_given_ns: AtomicU64,
    /// 1 while this process runs as `SCHED_BATCH` because a statement leaving
    /// ExecutorRun handed it a slot (`cpu::hand_over`); the process sets itself back.
    pub woken_as_batch: AtomicU32,
    /// The CPU (+1; 0 = none) this process owns while it holds a slot
    /// (`pg_stride.pin_slots`), written by the process that gives it the CPU, or swaps
    /// CPUs with it.
    pub slot_cpu: AtomicU32,
    /// The CPU this process was last pinned to (none: unpinned), by itself or by the
    /// process that handed it a slot: its mask then holds that CPU alone. A
    /// `pg_stride_sched::pin_word`, which also counts its writes.
    pub pinned_cpu: AtomicU32,
    /// What the parallel workers of this process's current statement measured (they add
    /// theirs when they end; the leader takes the sum into its trace record).
    pub workers_acct: SharedAccounting,
    /// Written by the scheduler worker: a runaway-query rule (its index + 1; 0 = none)
    /// cancels this process's statement `rule_cancel_key` (its count in `registered`);
    /// the process clears it as it raises the error.
    pub rule_cancel: AtomicU32,
    pub rule_cancel_key: AtomicU32,
    /// Written by the scheduler worker: a runaway-query rule moves this process's
    /// statement `rule_move_key` to group slot `rule_move` - 1 (0 = none); the process
    /// clears it once its query moved.
    pub rule_move: AtomicU32,
    pub rule_move_key: AtomicU32,
}

/// [`Accounting`] as sums that several processes add to.
#[derive(Default)]
pub struct SharedAccounting {
    cpu_total_ns: AtomicU64,
    paused_ns: AtomicU64,
    handoff_ns: AtomicU64,
    held_ns: AtomicU64,
    held_runqueue_ns: AtomicU64,
    runqueue_ns: AtomicU64,
    runqueue_before_slot_ns: AtomicU64,
    paused_runqueue_ns: AtomicU64,
    long_slice_ns: AtomicU64,
    handoffs: AtomicU64,
}

impl SharedAccounting {
    /// Adds one process's measurements.
    pub fn add(&self, a: &Accounting) {
        self.cpu_total_ns
            .fetch_add(a.cpu_total_ns, Ordering::Relaxed);
        self.paused_ns.fetch_add(a.paused_ns, Ordering::Relaxed);
        self.handoff_ns.fetch_add(a.handoff_ns, Ordering::Relaxed);
        self.held_ns.fetch_add(a.held_ns, Ordering::Relaxed);
        self.held_runqueue_ns
            .fetch_add(a.held_runqueue_ns, Ordering::Relaxed);
        self.runqueue_ns.fetch_add(a.runqueue_ns, Ordering::Relaxed);
        self.runqueue_before_slot_ns
            .fetch_add(a.runqueue_before_slot_ns, Ordering::Relaxed);
        self.paused_runqueue_ns
            .fetch_add(a.paused_runqueue_ns, Ordering::Relaxed);
        self.long_slice_ns
            .fetch_add(a.long_slice_ns, Ordering::Relaxed);
        self.handoffs
            .fetch_add(u64::from(a.handoffs), Ordering::Relaxed);
    }

    /// Resets the sums to zero. Reads first, and writes only sums that are not zero: a
    /// statement without workers finds them all zero, and a swap is a locked instruction
    /// on a line that other processes write, at every statement.
    pub fn clear(&self) {
        for sum in [
            &self.cpu_total_ns,
            &self.paused_ns,
            &self.handoff_ns,
            &self.held_ns,
            &self.held_runqueue_ns,
            &self.runqueue_ns,
            &self.runqueue_before_slot_ns,
            &self.paused_runqueue_ns,
            &self.long_slice_ns,
            &self.handoffs,
        ] {
            if sum.load(Ordering::Relaxed) != 0 {
                sum.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The sums so far, reset to zero.
    pub fn take(&self) -> Accounting {
        Accounting {
            cpu_total_ns: self.cpu_total_ns.swap(0, Ordering::Relaxed),
            paused_ns: self.paused_ns.swap(0, Ordering::Relaxed),
            handoff_ns: self.handoff_ns.swap(0, Ordering::Relaxed),
            held_ns: self.held_ns.swap(0, Ordering::Relaxed),
            held_runqueue_ns: self.held_runqueue_ns.swap(0, Ordering::Relaxed),
            runqueue_ns: self.runqueue_ns.swap(0, Ordering::Relaxed),
            runqueue_before_slot_ns: self.runqueue_before_slot_ns.swap(0, Ordering::Relaxed),
            paused_runqueue_ns: self.paused_runqueue_ns.swap(0, Ordering::Relaxed),
            long_slice_ns: self.long_slice_ns.swap(0, Ordering::Relaxed),
            handoffs: self
                .handoffs
                .swap(0, Ordering::Relaxed)
                .min(u64::from(u32::MAX)) as u32,
            ..Accounting::default()
        }
    }
}

impl ProcEntry {
    /// Forgets everything the entry says; used when its process is gone, by the next
    /// process to claim it or by the scheduler worker.
    pub fn reset(&self) {
        self.running.store(0, Ordering::Relaxed);
        self.queued.store(0, Ordering::Relaxed);
        self.group.store(0, Ordering::Relaxed);
        self.queued_since.store(0, Ordering::Relaxed);
        self.admitted_at.store(0, Ordering::Relaxed);
        self.cpu_query.store(0, Ordering::Relaxed);
        self.paused.store(0, Ordering::Relaxed);
        self.checks_in.store(0, Ordering::Relaxed);
        self.admitted_pending.store(0, Ordering::Relaxed);
        self.inbox.slot_cpu.store(0, Ordering::Relaxed);
        self.inbox.rule_cancel.store(0, Ordering::Relaxed);
        self.inbox.rule_move.store(0, Ordering::Relaxed);
        // Unpinned, one write on: a process still pinning the entry's last process
        // (a giver between its mask and its compare-and-swap) fails its swap.
        let pinned = self.inbox.pinned_cpu.load(Ordering::Relaxed);
        self.inbox.pinned_cpu.store(
            pg_stride_sched::pin_word::next(pinned, None),
            Ordering::Relaxed,
        );
        self.slice_share_at_ns.store(0, Ordering::Relaxed);
        self.clear_statement();
        self.pid.store(0, Ordering::Release);
    }

    /// The statement counted `key` in `registered` ends (or fails): a runaway-query
    /// rule's cancel asked for it is void. The session's next work may run under the same
    /// count (a cursor fetched again after it): it must neither raise that error nor get
    /// the query cancel the scheduler worker sends a statement that did not raise it.
    ///
    /// Sequentially consistent with the scheduler worker's request and its look at
    /// `ended` after it (`worker::rules`): either this sees the request and clears it, or
    /// the worker sees the end and withdraws it.
    pub fn forget_rule_cancel_of(&self, key: u32) {
        self.forget_rule_cancels_from(key, key);
    }

    /// The statements counted `first` to `last` (wrapping) end: a client command's, the
    /// last of them the latest registered (a DO block's loop, whose body statements
    /// ended while it went on: [`ProcEntry::forget_rule_cancel_of`] of each).
    pub fn forget_rule_cancels_from(&self, first: u32, last: u32) {
        self.ended.store(last, Ordering::SeqCst);
        if self.inbox.rule_cancel.load(Ordering::SeqCst) != 0 {
            let asked = self.inbox.rule_cancel_key.load(Ordering::Relaxed);
            if asked.wrapping_sub(first) <= last.wrapping_sub(first) {
                self.inbox.rule_cancel.store(0, Ordering::Release);
            }
        }
    }

    /// The group slot a runaway-query rule asked to move this process's current
    /// statement to, while the move is not done. A move asked for a statement that ended
    /// unmoved (its parallel workers were members until its end) is no longer this
    /// process's business: the process clears it at its next check-in only.
    pub fn move_asked_for_this_statement(&self) -> Option<usize> {
        let target = self.inbox.rule_move.load(Ordering::Acquire);
        (target != 0
            && self.inbox.rule_move_key.load(Ordering::Relaxed)
                == self.registered.load(Ordering::Acquire))
        .then(|| target as usize - 1)
    }

    /// Publishes the CPU predicted for the query this process registered, µs, and
    /// whether that counts as short.
    pub fn publish_prediction(&self, cpu_us: u64, short: bool) {
        let word = (cpu_us.min(u64::MAX >> 2) << 2) | if short { 1 } else { 2 };
        self.prediction.store(word, Ordering::Relaxed);
    }

    /// The CPU predicted for the query this process registered, µs, and whether that
    /// counts as short; `None` without a prediction.
    pub fn prediction(&self) -> Option<(u64, bool)> {
        let word = self.prediction.load(Ordering::Relaxed);
        (word != 0).then_some((word >> 2, word & 3 == 1))
    }

    /// Forgets what the entry says of the previous statement; a new one starts.
    pub fn clear_statement(&self) {
        self.rows.store(0, Ordering::Relaxed);
        self.cpu_base_ns.store(0, Ordering::Relaxed);
        self.prediction.store(0, Ordering::Relaxed);
        self.workers_planned.store(0, Ordering::Relaxed);
        self.workers_granted.store(0, Ordering::Relaxed);
        self.paused_us.store(0, Ordering::Relaxed);
        self.inbox.workers_acct.clear();
    }
}
