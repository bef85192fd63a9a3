//! The event loop: arrivals and slice ends in time order, every scheduling decision
//! taken by [`crate::SchedShared`]. [`simulate_with`] adds a periodic tick at which a
//! caller sees the run so far and may install new decay parameters, as the tuner does
//! with `set_decay` (wagner2021 §4).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::workload::QuerySpec;
use crate::decay::DecayParams;
use crate::ids::{GroupId, ProcId, QueryId};
use crate::shared::{
    Capacity, GroupConfig, Outcome, OwnedRegion, Policy, QueryOptions, SchedConfig, Turn,
    MAX_GROUPS, MAX_QUERY_MEMBERS,
};

/// Simulator settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// CPU slots.
    pub slots: u32,
    /// Slice length, ns (the adaptive slice's target, wagner2021 §3.1).
    pub slice_ns: u64,
    /// Decision rule.
    pub policy: Policy,
    /// Decay parameters (for `DecayingStride`).
    pub decay: DecayParams,
    /// Group settings by group index; groups not listed get the defaults.
    pub groups: Vec<GroupConfig>,
    /// Size of the query table; arrivals beyond it wait for admission in arrival order,
    /// like statements beyond `pg_stride.max_active_queries`.
    pub max_active: u32,
    /// Stop at this time (unfinished queries are reported without a finish time).
    pub horizon_ns: Option<u64>,
}

impl SimConfig {
    /// Defaults for `slots` slots under `policy`: 2 ms slices, the default decay.
    pub fn new(slots: u32, policy: Policy) -> Self {
        SimConfig {
            slots,
            slice_ns: 2_000_000,
            policy,
            decay: DecayParams::default(),
            groups: Vec::new(),
            max_active: 4_096,
            horizon_ns: None,
        }
    }
}

/// What happened to one query.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryResult {
    /// Class label from the workload.
    pub class: String,
    /// Group index.
    pub group: u32,
    /// Arrival time, ns.
    pub arrival_ns: u64,
    /// When it got a query entry (admission), ns; `None` while it waits for one.
    pub admitted_ns: Option<u64>,
    /// Completion time, ns; `None` if the horizon came first.
    pub finish_ns: Option<u64>,
    /// Latency it would have alone: its CPU demand spread over its processes.
    pub isolated_ns: u64,
    /// CPU time it received (during a run: in the slices that have ended, which is what
    /// the scheduler has charged).
    pub received_ns: u64,
    /// Longest time one of its processes waited for a slot.
    pub max_wait_ns: u64,
}

impl QueryResult {
    /// Completion minus arrival.
    pub fn latency_ns(&self) -> Option<u64> {
        self.finish_ns.map(|f| f - self.arrival_ns)
    }

    /// Latency relative to the isolated latency (wagner2021 §3.2, Eq. 1).
    pub fn slowdown(&self) -> Option<f64> {
        self.latency_ns()
            .map(|l| l as f64 / self.isolated_ns.max(1) as f64)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    SliceEnd { proc: u32, used_ns: u64 },
    Tick,
}

/// The callback of [`simulate_with`]: given the time and every query's result so far, it
/// may return decay parameters to install.
pub type OnTick<'a> = dyn FnMut(u64, &[QueryResult]) -> Option<DecayParams> + 'a;

/// A callback run every `every_ns` of simulated time.
struct Ticker<'a, 'f> {
    every_ns: u64,
    on_tick: &'a mut OnTick<'f>,
}

struct Running {
    query: usize,
    waiting_since: Option<u64>,
}

struct Engine<'a, 'f> {
    cfg: &'a SimConfig,
    ticker: Option<Ticker<'a, 'f>>,
    sched: OwnedRegion,
    specs: &'a [QuerySpec],
    results: Vec<QueryResult>,
    /// Per query: table entry, unassigned work, processes still working.
    ids: Vec<Option<QueryId>>,
    unassigned_ns: Vec<u64>,
    procs_left: Vec<u32>,
    /// Per process id.
    procs: Vec<Option<Running>>,
    free_procs: Vec<u32>,
    pending: VecDeque<usize>,
    active: u32,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    now: u64,
}

/// Runs `workload` under `cfg` and reports every query, in workload order.
pub fn simulate(workload: &[QuerySpec], cfg: &SimConfig) -> Vec<QueryResult> {
    let mut engine = Engine::new(workload, cfg, None);
    engine.run();
    engine.results
}

/// Runs `workload` under `cfg` like [`simulate`], and every `every_ns` of simulated time
/// (from `every_ns` on, while queries remain) calls `on_tick` with the time and the
/// results so far: finish times of the finished queries, `None` for the others, and the
/// CPU each has been charged. Decay parameters it returns are installed with
/// [`crate::SchedShared::set_decay`] at that moment; queries keep the priority they have.
pub fn simulate_with(
    workload: &[QuerySpec],
    cfg: &SimConfig,
    every_ns: u64,
    on_tick: &mut OnTick<'_>,
) -> Vec<QueryResult> {
    let ticker = Ticker {
        every_ns: every_ns.max(1),
        on_tick,
    };
    let mut engine = Engine::new(workload, cfg, Some(ticker));
    engine.run();
    engine.results
}

impl<'a, 'f> Engine<'a, 'f> {
    fn new(workload: &'a [QuerySpec], cfg: &'a SimConfig, ticker: Option<Ticker<'a, 'f>>) -> Self {
        let max_members = workload
            .iter()
            .map(|q| q.procs)
            .max()
            .unwrap_or(1)
            .min(MAX_QUERY_MEMBERS as u32);
        let max_group = workload.iter().map(|q| q.group + 1).max().unwrap_or(1);
        let cap = Capacity {
            max_procs: cfg.max_active.max(1) * max_members,
            max_queries: cfg.max_active.max(1),
            max_groups: max_group.max(cfg.groups.len() as u32).clamp(1, MAX_GROUPS),
        };
        let config = SchedConfig {
            cpu_slots: cfg.slots,
            policy: cfg.policy,
            decay: cfg.decay,
        };
        let sched = OwnedRegion::new(cap, &config).expect("simulator capacity");
        for (g, gc) in cfg.groups.iter().enumerate().take(cap.max_groups as usize) {
            sched.configure_group(GroupId(g as u32), *gc);
        }
        let first_tick = ticker.as_ref().map(|t| t.every_ns);
        let mut engine = Engine {
            cfg,
            ticker,
            sched,
            specs: workload,
            results: workload
                .iter()
                .map(|q| QueryResult {
                    class: q.class.clone(),
                    group: q.group.min(cap.max_groups - 1),
                    arrival_ns: q.arrival_ns,
                    admitted_ns: None,
                    finish_ns: None,
                    isolated_ns: q.cpu_ns / q.procs.min(max_members).min(cfg.slots).max(1) as u64,
                    received_ns: 0,
                    max_wait_ns: 0,
                })
                .collect(),
            ids: vec![None; workload.len()],
            unassigned_ns: workload.iter().map(|q| q.cpu_ns).collect(),
            procs_left: vec![0; workload.len()],
            procs: (0..cap.max_procs).map(|_| None).collect(),
            free_procs: (0..cap.max_procs).rev().collect(),
            pending: VecDeque::new(),
            active: 0,
            events: BinaryHeap::new(),
            seq: 0,
            now: 0,
        };
        for (i, q) in workload.iter().enumerate() {
            engine.push(q.arrival_ns, Event::Arrival(i));
        }
        if let (Some(at), false) = (first_tick, workload.is_empty()) {
            engine.push(at, Event::Tick);
        }
        engine
    }

    fn push(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    fn run(&mut self) {
        while let Some(Reverse((at, _, ev))) = self.events.pop() {
            if self.cfg.horizon_ns.is_some_and(|h| at > h) {
                break;
            }
            self.now = at;
            match ev {
                Event::Arrival(i) => {
                    if self.active < self.cfg.max_active.max(1) {
                        self.admit(i);
                    } else {
                        self.pending.push_back(i);
                    }
                }
                Event::SliceEnd { proc, used_ns } => self.slice_end(ProcId(proc), used_ns),
                Event::Tick => self.tick(),
            }
        }
    }

    /// Calls the ticker and schedules the next tick, unless the tick was the last event.
    fn tick(&mut self) {
        let Some(ticker) = self.ticker.as_mut() else {
            return;
        };
        if let Some(decay) = (ticker.on_tick)(self.now, &self.results) {
            self.sched.set_decay(decay);
        }
        let next = self.now + ticker.every_ns;
        if !self.events.is_empty() {
            self.push(next, Event::Tick);
        }
    }

    fn admit(&mut self, i: usize) {
        let spec = &self.specs[i];
        let group = GroupId(self.results[i].group);
        let options = QueryOptions {
            pinned_priority: spec.pinned_priority,
            ..Default::default()
        };
        let q = self
            .sched
            .register_query(group, options)
            .expect("query table sized to max_active");
        self.active += 1;
        self.ids[i] = Some(q);
        self.results[i].admitted_ns = Some(self.now);
        let members = spec.procs.min(MAX_QUERY_MEMBERS as u32);
        self.procs_left[i] = members;
        for _ in 0..members {
            let p = ProcId(
                self.free_procs
                    .pop()
                    .expect("process table sized to the workload"),
            );
            self.sched
                .join(p, q)
                .expect("members bounded by MAX_QUERY_MEMBERS");
            self.procs[p.index()] = Some(Running {
                query: i,
                waiting_since: None,
            });
            let out = self.sched.acquire(p);
            self.apply(p, out);
        }
    }

    /// Acts on an outcome for process `p`: it runs on or starts waiting, and a process
    /// that was handed a slot starts its slice.
    fn apply(&mut self, p: ProcId, out: Outcome) {
        match out.turn {
            Turn::Run => self.start_slice(p),
            Turn::Wait => self.running_mut(p).waiting_since = Some(self.now),
        }
        if let Some(w) = out.wake {
            self.woken(w);
        }
    }

    fn woken(&mut self, w: ProcId) {
        assert!(
            self.sched.is_running(w),
            "woken process {w:?} holds no slot"
        );
        let now = self.now;
        let r = self.running_mut(w);
        let since = r.waiting_since.take().expect("woken process was waiting");
        let query = r.query;
        let waited = now - since;
        let res = &mut self.results[query];
        res.max_wait_ns = res.max_wait_ns.max(waited);
        self.start_slice(w);
    }

    fn start_slice(&mut self, p: ProcId) {
        let i = self.running_mut(p).query;
        let chunk = self.cfg.slice_ns.max(1).min(self.unassigned_ns[i]);
        if chunk == 0 {
            // Its query's work is all handed out: this process is done.
            let wake = self.sched.release(p, 0);
            self.finish_proc(p, wake);
            return;
        }
        self.unassigned_ns[i] -= chunk;
        self.push(
            self.now + chunk,
            Event::SliceEnd {
                proc: p.0,
                used_ns: chunk,
            },
        );
    }

    fn slice_end(&mut self, p: ProcId, used_ns: u64) {
        let i = self.running_mut(p).query;
        self.results[i].received_ns += used_ns;
        if self.unassigned_ns[i] == 0 {
            let wake = self.sched.release(p, used_ns);
            self.finish_proc(p, wake);
        } else {
            let out = self.sched.end_slice(p, used_ns);
            self.apply(p, out);
        }
    }

    fn finish_proc(&mut self, p: ProcId, wake: Option<ProcId>) {
        let extra = self.sched.leave(p);
        debug_assert!(extra.is_none(), "an idle process has no slot to pass on");
        let i = self.procs[p.index()]
            .take()
            .expect("finishing a known process")
            .query;
        self.free_procs.push(p.0);
        if let Some(w) = wake {
            self.woken(w);
        }
        self.procs_left[i] -= 1;
        if self.procs_left[i] == 0 {
            self.results[i].finish_ns = Some(self.now);
            let q = self.ids[i].take().expect("finishing an admitted query");
            self.sched.unregister_query(q).expect("all processes left");
            self.active -= 1;
            if let Some(next) = self.pending.pop_front() {
                self.admit(next);
            }
        }
    }

    fn running_mut(&mut self, p: ProcId) -> &mut Running {
        self.procs[p.index()].as_mut().expect("known process")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(arrival_ms: u64, cpu_ms: u64, class: &str) -> QuerySpec {
        QuerySpec {
            arrival_ns: arrival_ms * 1_000_000,
            cpu_ns: cpu_ms * 1_000_000,
            group: 0,
            class: class.into(),
            procs: 1,
            pinned_priority: None,
        }
    }

    #[test]
    fn lone_query_has_slowdown_one() {
        for policy in [Policy::Fifo, Policy::FairStride, Policy::DecayingStride] {
            let r = simulate(&[q(5, 9, "a")], &SimConfig::new(2, policy));
            assert_eq!(r[0].latency_ns(), Some(9_000_000));
            assert_eq!(r[0].slowdown(), Some(1.0));
            assert_eq!(r[0].max_wait_ns, 0);
        }
    }

    #[test]
    fn fifo_runs_to_completion_fair_shares() {
        let w = [q(0, 100, "long"), q(1, 10, "short")];
        let fifo = simulate(&w, &SimConfig::new(1, Policy::Fifo));
        assert_eq!(fifo[0].finish_ns, Some(100_000_000));
        assert_eq!(fifo[1].finish_ns, Some(110_000_000));
        let fair = simulate(&w, &SimConfig::new(1, Policy::FairStride));
        // Alternating 2 ms slices: the short query is done after ~20 ms, not 110.
        assert!(fair[1].finish_ns.unwrap() <= 25_000_000, "{:?}", fair[1]);
        assert_eq!(fair[0].finish_ns, Some(110_000_000));
    }

    #[test]
    fn parallel_query_uses_its_processes() {
        let mut spec = q(0, 40, "par");
        spec.procs = 4;
        let r = simulate(
            std::slice::from_ref(&spec),
            &SimConfig::new(4, Policy::DecayingStride),
        );
        assert_eq!(r[0].finish_ns, Some(10_000_000));
        assert_eq!(r[0].isolated_ns, 10_000_000);
        let r = simulate(&[spec], &SimConfig::new(2, Policy::DecayingStride));
        assert_eq!(r[0].finish_ns, Some(20_000_000));
        assert_eq!(r[0].isolated_ns, 20_000_000);
    }

    #[test]
    fn admission_queue_beyond_the_table() {
        let w = [q(0, 10, "a"), q(0, 10, "b"), q(0, 10, "c")];
        let cfg = SimConfig {
            max_active: 1,
            ..SimConfig::new(4, Policy::FairStride)
        };
        let r = simulate(&w, &cfg);
        let finishes: Vec<_> = r.iter().map(|r| r.finish_ns.unwrap() / 1_000_000).collect();
        assert_eq!(finishes, vec![10, 20, 30]);
    }

    #[test]
    fn horizon_leaves_queries_unfinished_and_state_clean() {
        let w = [q(0, 10, "a"), q(0, 1_000, "b")];
        let cfg = SimConfig {
            horizon_ns: Some(50_000_000),
            ..SimConfig::new(1, Policy::FairStride)
        };
        let r = simulate(&w, &cfg);
        assert!(r[0].finish_ns.is_some());
        assert_eq!(r[1].finish_ns, None);
        assert!(r[1].received_ns >= 38_000_000);
    }

    #[test]
    fn ticks_see_the_run_so_far_and_install_decay() {
        // One slot: a 100 ms query, then at 50 ms a 40 ms one. With the default decay the
        // first has sunk to a low priority by then and the second runs almost alone.
        let w = [q(0, 100, "long"), q(50, 40, "short")];
        let cfg = SimConfig::new(1, Policy::DecayingStride);
        let plain = simulate(&w, &cfg);
        let mut seen = Vec::new();
        let no_decay = DecayParams {
            lambda: 1.0,
            ..cfg.decay
        };
        let ticked = simulate_with(&w, &cfg, 10_000_000, &mut |now, so_far| {
            seen.push((now, so_far[0].received_ns, so_far[1].admitted_ns));
            (now == 10_000_000).then_some(no_decay)
        });
        // Installed at 10 ms, before the long query's priority decayed: the two share
        // the slot from 50 ms on, so the short one finishes later than under decay.
        assert_eq!(plain[1].finish_ns, Some(98_000_000));
        assert_eq!(ticked[1].finish_ns, Some(128_000_000));
        // Every 10 ms until after the last event; charged CPU so far, admission once
        // arrived.
        let times: Vec<u64> = seen.iter().map(|s| s.0 / 1_000_000).collect();
        assert_eq!(times, (1..=15).map(|i| i * 10).collect::<Vec<_>>());
        // (The slice ending at 10 ms too is charged after the tick: ties go in the order
        // the events were scheduled.)
        assert_eq!(seen[0].1, 8_000_000);
        assert_eq!((seen[3].2, seen[4].2), (None, Some(50_000_000)));
        assert_eq!(ticked[1].admitted_ns, Some(50_000_000));
    }

    #[test]
    fn region_is_empty_after_a_run() {
        let w: Vec<_> = (0..30).map(|i| q(i, 3 + i % 7, "x")).collect();
        let cfg = SimConfig {
            max_active: 8,
            ..SimConfig::new(2, Policy::DecayingStride)
        };
        let mut engine = Engine::new(&w, &cfg, None);
        engine.run();
        assert!(engine.results.iter().all(|r| r.finish_ns.is_some()));
        assert_eq!(engine.sched.running(), 0);
        assert!(engine.sched.nobody_waits());
        assert_eq!(engine.active, 0);
        assert_eq!(engine.free_procs.len(), engine.procs.len());
    }
}
