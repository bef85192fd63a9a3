//! The event loop: arrivals and slice ends in time order, every scheduling decision
//! taken by [`crate::SchedShared`]. [`simulate_with`] adds a periodic tick at which a
//! caller sees the run so far and may install new decay parameters, as the tuner does
//! with `set_decay` (wagner2021 §4).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::numa::MIN_STEAL_WAIT_NS;
use super::numa::{slice_work, NodeUsage, NumaPlacement, NumaReport, NumaSim, PhysSlots};
use super::workload::QuerySpec;
use crate::decay::DecayParams;
use crate::ids::{GroupId, ProcId, QueryId};
use crate::predict::{self, CostModel, History, Prediction, Quality, StartPolicy, Table, View};
use crate::shared::{
    Capacity, GroupConfig, Outcome, OwnedRegion, Policy, QueryOptions, SchedConfig, SchedShared,
    Turn, MAX_GROUPS, MAX_QUERY_MEMBERS,
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
    /// NUMA nodes, remote penalty and placement; `None`: one node, every slot local.
    pub numa: Option<NumaSim>,
    /// A process that starts waiting asks a lower-priority holder to end its slice now
    /// (as the extension always does; shared/preempt.rs). Without NUMA only.
    pub preempt: bool,
    /// Where a query's decaying priority starts.
    pub start: StartMode,
}

/// Where a query's decaying priority starts ([`crate::predict::start_policy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartMode {
    /// At its group's initial priority (`pg_stride.predict = off`).
    #[default]
    Decay,
    /// By the CPU predicted from the history of its fingerprint: the executions of it
    /// that finished before it arrived, as the extension learns them
    /// (`pg_stride.predict = on`; the simulator has no plan costs, so a fingerprint
    /// never seen starts as under `Decay`).
    Predicted,
    /// By the CPU it will really need: what a perfect prediction would give.
    Oracle,
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
            numa: None,
            preempt: false,
            start: StartMode::Decay,
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
    /// Of `received_ns`, the CPU time run on a node other than its memory's (0 without
    /// [`SimConfig::numa`]).
    pub remote_ns: u64,
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
    /// The slice numbered `slice` ends, unless it was cut short before (a stale event).
    SliceEnd {
        proc: u32,
        used_ns: u64,
        slice: u64,
    },
    Tick,
    /// Affine NUMA placement: a waiting process has waited long enough to steal, unless
    /// the wait `wait` ended (a stale timer).
    StealTimer {
        proc: u32,
        wait: u64,
    },
    /// Affine NUMA placement: the scheduler worker's round.
    NodeSample,
}

impl Event {
    /// Events that repeat for as long as others remain.
    fn periodic(&self) -> bool {
        matches!(self, Event::Tick | Event::NodeSample)
    }
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
    /// NUMA: the current wait (to tell stale steal timers), the physical slot held and
    /// the one last held (oblivious placement), and the running slice's node and whether
    /// it is remote.
    wait: u64,
    phys: Option<u32>,
    last_phys: Option<u32>,
    slice_on: Option<(u32, bool)>,
    /// The running slice: its number, start and the work handed to it.
    slice: Option<RunningSlice>,
}

#[derive(Clone, Copy)]
struct RunningSlice {
    number: u64,
    start: u64,
    work: u64,
}

/// NUMA state of a run ([`SimConfig::numa`]).
struct NumaState {
    penalty: f64,
    placement: NumaPlacement,
    sample_ns: u64,
    /// Oblivious: the physical slots.
    phys: Option<PhysSlots>,
    /// Per query: the node its memory is on, once known.
    mem_node: Vec<Option<u32>>,
    /// Processes waiting for a slot.
    waiting: u32,
    /// Waits started (numbers them).
    waits: u64,
    /// Time up to which the idle integrals are summed.
    summed_to: u64,
    report: NumaReport,
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
    /// Periodic events in `events`.
    periodic: usize,
    seq: u64,
    now: u64,
    numa: Option<NumaState>,
    /// With [`StartMode::Predicted`]: the histories, and each admitted query's prediction.
    histories: Option<Histories>,
}

/// The prediction table of [`StartMode::Predicted`], as the extension keeps it.
struct Histories {
    slots: Vec<History>,
    model: CostModel,
    quality: Quality,
    predicted: Vec<Option<Prediction>>,
}

/// A run's per-query results and, with [`SimConfig::numa`], what NUMA did.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRun {
    /// Every query, in workload order.
    pub results: Vec<QueryResult>,
    /// Per node CPU, remote share, idle slots; `None` without [`SimConfig::numa`].
    pub numa: Option<NumaReport>,
    /// How good the predictions were; `None` unless [`StartMode::Predicted`].
    pub quality: Option<Quality>,
}

/// Runs `workload` under `cfg` and reports every query, in workload order.
pub fn simulate(workload: &[QuerySpec], cfg: &SimConfig) -> Vec<QueryResult> {
    simulate_run(workload, cfg).results
}

/// Runs `workload` under `cfg` like [`simulate`], and reports what NUMA did as well.
pub fn simulate_run(workload: &[QuerySpec], cfg: &SimConfig) -> SimRun {
    let mut engine = Engine::new(workload, cfg, None);
    engine.run();
    SimRun {
        quality: engine.quality(),
        numa: engine.numa.map(|n| n.report),
        results: engine.results,
    }
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
        // No more statements are ever active than the workload has: a table sized to a
        // large admission limit (`max_active_queries` up to 262143, the tuner replays
        // the server's) would be allocated and zeroed at every replay for nothing.
        let table = cfg
            .max_active
            .min(u32::try_from(workload.len()).unwrap_or(u32::MAX))
            .max(1);
        let cap = Capacity {
            max_procs: table * max_members,
            max_queries: table,
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
        let numa = cfg
            .numa
            .as_ref()
            .map(|n| NumaState::new(n, cfg, &sched, workload));
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
                    remote_ns: 0,
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
            periodic: 0,
            seq: 0,
            now: 0,
            numa,
            histories: (cfg.start == StartMode::Predicted).then(|| Histories {
                slots: vec![History::default(); Table::slots_for(predict::CAPACITY)],
                model: CostModel::default(),
                quality: Quality::default(),
                predicted: vec![None; workload.len()],
            }),
        };
        for (i, q) in workload.iter().enumerate() {
            engine.push(q.arrival_ns, Event::Arrival(i));
        }
        if let (Some(at), false) = (first_tick, workload.is_empty()) {
            engine.push(at, Event::Tick);
        }
        if let Some(n) = &engine.numa {
            if matches!(n.placement, NumaPlacement::Affine { .. }) && !workload.is_empty() {
                engine.push(n.sample_ns, Event::NodeSample);
            }
        }
        engine
    }

    fn push(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.periodic += ev.periodic() as usize;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    /// Whether events other than periodic ones remain.
    fn work_remains(&self) -> bool {
        self.events.len() > self.periodic
    }

    fn run(&mut self) {
        while let Some(Reverse((at, _, ev))) = self.events.pop() {
            self.periodic -= ev.periodic() as usize;
            if self.cfg.horizon_ns.is_some_and(|h| at > h) {
                break;
            }
            self.sum_idle(at);
            self.now = at;
            match ev {
                Event::Arrival(i) => {
                    if self.active < self.cfg.max_active.max(1) {
                        self.admit(i);
                    } else {
                        self.pending.push_back(i);
                    }
                }
                Event::SliceEnd {
                    proc,
                    used_ns,
                    slice,
                } => {
                    let r = self.procs[proc as usize].as_ref();
                    if r.and_then(|r| r.slice).is_some_and(|s| s.number == slice) {
                        self.running_mut(ProcId(proc)).slice = None;
                        self.slice_end(ProcId(proc), used_ns);
                    }
                }
                Event::Tick => self.tick(),
                Event::StealTimer { proc, wait } => self.steal_timer(ProcId(proc), wait),
                Event::NodeSample => self.node_sample(),
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
        if self.work_remains() {
            self.push(next, Event::Tick);
        }
    }

    fn admit(&mut self, i: usize) {
        let spec = &self.specs[i];
        let group = GroupId(self.results[i].group);
        let home = self.numa.as_ref().and_then(|n| match n.placement {
            NumaPlacement::Affine { .. } => Some(self.sched.choose_home()),
            NumaPlacement::Oblivious => None,
        });
        let options = QueryOptions {
            pinned_priority: spec.pinned_priority,
            home: home.unwrap_or(0),
            start: self.start_of(i),
        };
        let q = self
            .sched
            .register_query(group, options)
            .expect("query table sized to max_active");
        if let (Some(n), Some(home)) = (self.numa.as_mut(), home) {
            // Bound to its home node, the query's memory is there (first touch).
            n.mem_node[i] = Some(home);
        }
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
                wait: 0,
                phys: None,
                last_phys: None,
                slice_on: None,
                slice: None,
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
            Turn::Wait => {
                self.running_mut(p).waiting_since = Some(self.now);
                if self.numa.is_some() {
                    self.numa_wait(p);
                } else if self.cfg.preempt {
                    if let Some(h) = self.sched.ask_holder_to_yield(p) {
                        self.cut_slice(h);
                    }
                }
            }
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
        if let Some(n) = self.numa.as_mut() {
            n.waiting -= 1;
        }
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
        let (work, used) = if self.numa.is_some() {
            self.numa_slice(p, i)
        } else {
            (chunk, chunk)
        };
        self.unassigned_ns[i] -= work;
        let number = self.seq;
        self.running_mut(p).slice = Some(RunningSlice {
            number,
            start: self.now,
            work,
        });
        self.push(
            self.now + used,
            Event::SliceEnd {
                proc: p.0,
                used_ns: used,
                slice: number,
            },
        );
    }

    /// Holder `h` was asked to yield: its slice ends now, the work it did not get to
    /// going back to its query. Its check-in answers the request.
    fn cut_slice(&mut self, h: ProcId) {
        let (now, number) = (self.now, self.seq);
        let r = self.running_mut(h);
        let Some(slice) = r.slice else { return };
        let i = r.query;
        let used = (now - slice.start).min(slice.work);
        r.slice = Some(RunningSlice { number, ..slice });
        self.unassigned_ns[i] += slice.work - used;
        self.push(
            now,
            Event::SliceEnd {
                proc: h.0,
                used_ns: used,
                slice: number,
            },
        );
    }

    fn slice_end(&mut self, p: ProcId, used_ns: u64) {
        let i = self.running_mut(p).query;
        self.results[i].received_ns += used_ns;
        if let Some(n) = self.numa.as_mut() {
            let r = self.procs[p.index()].as_mut().expect("known process");
            let (node, remote) = r.slice_on.take().expect("a slice was running");
            let usage = &mut n.report.nodes[node as usize];
            usage.cpu_ns += used_ns;
            if remote {
                usage.remote_ns += used_ns;
                self.results[i].remote_ns += used_ns;
            }
        }
        if self.unassigned_ns[i] == 0 {
            let wake = self.sched.release(p, used_ns);
            self.finish_proc(p, wake);
        } else {
            // A process on a slot away from its home got there by stealing and keeps the
            // right to; if it has to wait now, the other nodes' free slots are offered to
            // it only by a dispatch, which it runs itself, as when it started stealing
            // (shared/nodes.rs; the extension's slice end does the same).
            let stealer = self.numa.is_some() && self.sched.away_from_home(p);
            let out = self.sched.end_slice(p, used_ns);
            self.apply(p, out);
            if stealer && out.turn == Turn::Wait {
                while let Some(w) = self.sched.dispatch() {
                    self.woken(w);
                }
            }
        }
    }

    fn finish_proc(&mut self, p: ProcId, wake: Option<ProcId>) {
        let extra = self.sched.leave(p);
        debug_assert!(extra.is_none(), "an idle process has no slot to pass on");
        let r = self.procs[p.index()]
            .take()
            .expect("finishing a known process");
        let i = r.query;
        if let (Some(s), Some(phys)) = (r.phys, self.numa.as_mut().and_then(|n| n.phys.as_mut())) {
            phys.free(s);
        }
        self.free_procs.push(p.0);
        if let Some(w) = wake {
            self.woken(w);
        }
        self.procs_left[i] -= 1;
        if self.procs_left[i] == 0 {
            self.results[i].finish_ns = Some(self.now);
            if let Some(n) = self.numa.as_mut() {
                n.report.finished += 1;
                n.report.last_finish_ns = self.now;
            }
            let q = self.ids[i].take().expect("finishing an admitted query");
            self.sched.unregister_query(q).expect("all processes left");
            self.learn(i);
            self.active -= 1;
            if let Some(next) = self.pending.pop_front() {
                self.admit(next);
            }
        }
    }

    /// Where query `i`'s priority starts under [`SimConfig::start`].
    fn start_of(&mut self, i: usize) -> Option<StartPolicy> {
        let spec = &self.specs[i];
        let cpu_us = match self.cfg.start {
            StartMode::Decay => return None,
            StartMode::Oracle => spec.cpu_ns as f64 / 1000.0,
            StartMode::Predicted => {
                let h = self.histories.as_mut()?;
                let p = View::new(&h.slots, &h.model, &h.quality).predict(spec.fingerprint, 0.0);
                h.predicted[i] = p;
                p?.cpu_us
            }
        };
        Some(self.sched.predicted_start(spec.group as usize, cpu_us))
    }

    /// Records finished query `i` in the histories ([`StartMode::Predicted`]).
    fn learn(&mut self, i: usize) {
        let spec = &self.specs[i];
        let short_us = self.sched.short_threshold_us(spec.group as usize);
        let Some(h) = self.histories.as_mut() else {
            return;
        };
        let prediction = h.predicted[i];
        Table::new(&mut h.slots, &mut h.model, &mut h.quality).record(
            spec.fingerprint,
            0.0,
            spec.cpu_ns as f64 / 1000.0,
            self.now,
            prediction,
            short_us,
        );
    }

    /// How good the predictions were ([`StartMode::Predicted`]).
    fn quality(&self) -> Option<Quality> {
        self.histories.as_ref().map(|h| h.quality)
    }

    fn running_mut(&mut self, p: ProcId) -> &mut Running {
        self.procs[p.index()].as_mut().expect("known process")
    }

    // ---- NUMA (SimConfig::numa) ----

    /// Adds the free slots from the last event up to `at` to the idle integrals.
    fn sum_idle(&mut self, at: u64) {
        let Some(n) = self.numa.as_mut() else {
            return;
        };
        if at <= n.summed_to {
            return;
        }
        // Only up to the last completion: a later completion adds the span before it.
        if n.report.finished < self.specs.len() {
            let span = u128::from(at - n.summed_to);
            let free = n.report.slots().saturating_sub(self.sched.running());
            n.report.idle_slot_ns += span * u128::from(free);
            n.report.stranded_slot_ns += span * u128::from(free.min(n.waiting));
        }
        n.summed_to = at;
    }

    /// Process `p` started waiting: it gives up its physical slot (oblivious), or may
    /// steal after `steal_after` slices (affine).
    fn numa_wait(&mut self, p: ProcId) {
        let slice_ns = self.cfg.slice_ns;
        let nodes = self.sched.node_count();
        let n = self.numa.as_mut().expect("NUMA run");
        let r = self.procs[p.index()].as_mut().expect("known process");
        n.waiting += 1;
        n.waits += 1;
        r.wait = n.waits;
        if let (Some(phys), Some(s)) = (n.phys.as_mut(), r.phys.take()) {
            phys.free(s);
        }
        if let NumaPlacement::Affine {
            steal_after: Some(k),
        } = n.placement
        {
            if nodes > 1 {
                let wait = r.wait;
                let after = slice_ns.saturating_mul(u64::from(k)).max(MIN_STEAL_WAIT_NS);
                self.push(
                    self.now.saturating_add(after),
                    Event::StealTimer { proc: p.0, wait },
                );
            }
        }
    }

    /// A steal timer went off: if its wait goes on, the process may take any node's
    /// slot now (psaroudakis2016 §4: stealing keeps slots busy, at the price of remote
    /// accesses), and the free slots are dispatched, as the extension's `pause` does;
    /// then it waits another `steal_after` slices.
    fn steal_timer(&mut self, p: ProcId, wait: u64) {
        let waits_on = |e: &Self| {
            e.procs[p.index()]
                .as_ref()
                .is_some_and(|r| r.wait == wait && r.waiting_since.is_some())
        };
        if !waits_on(self) {
            return; // stale: that wait ended
        }
        self.sched.allow_steal(p);
        self.numa.as_mut().expect("NUMA run").report.steals += 1;
        while let Some(w) = self.sched.dispatch() {
            self.woken(w);
        }
        if waits_on(self) {
            let NumaPlacement::Affine {
                steal_after: Some(k),
            } = self.numa.as_ref().expect("NUMA run").placement
            else {
                unreachable!("steal timers belong to the affine placement");
            };
            let after = self
                .cfg
                .slice_ns
                .saturating_mul(u64::from(k))
                .max(MIN_STEAL_WAIT_NS);
            self.push(
                self.now.saturating_add(after),
                Event::StealTimer { proc: p.0, wait },
            );
        }
    }

    /// The scheduler worker's round: sample node utilisation (for the home choice), and
    /// run `dispatch` as a safety net (the extension does every 20 ms; here a process it
    /// finds would be a lost hand-off, so they are counted).
    fn node_sample(&mut self) {
        self.sched.sample_node_util();
        while let Some(w) = self.sched.dispatch() {
            self.numa.as_mut().expect("NUMA run").report.rescued += 1;
            self.woken(w);
        }
        if self.work_remains() {
            let every = self.numa.as_ref().expect("NUMA run").sample_ns.max(1);
            self.push(self.now + every, Event::NodeSample);
        }
    }

    /// Process `p` of query `i`, holding a slot, starts a slice: on which node it runs,
    /// whether that is remote from the query's memory, and the work done and CPU used.
    fn numa_slice(&mut self, p: ProcId, i: usize) -> (u64, u64) {
        let slot_node = self.sched.slot_node(p);
        let slice_ns = self.cfg.slice_ns;
        let left = self.unassigned_ns[i];
        let n = self.numa.as_mut().expect("NUMA run");
        let r = self.procs[p.index()].as_mut().expect("known process");
        let node = match n.phys.as_mut() {
            Some(phys) => {
                let s = match r.phys {
                    Some(s) => s,
                    None => {
                        let s = phys.take(r.last_phys);
                        r.phys = Some(s);
                        r.last_phys = Some(s);
                        s
                    }
                };
                phys.node(s)
            }
            None => slot_node.expect("a process starting a slice holds a slot"),
        };
        let mem = *n.mem_node[i].get_or_insert(node);
        let remote = node != mem;
        r.slice_on = Some((node, remote));
        slice_work(slice_ns, left, if remote { n.penalty } else { 1.0 })
    }
}

impl NumaState {
    fn new(spec: &NumaSim, cfg: &SimConfig, sched: &SchedShared, workload: &[QuerySpec]) -> Self {
        assert!(
            spec.remote_penalty.is_finite() && spec.remote_penalty >= 1.0,
            "remote_penalty must be finite and at least 1, not {}",
            spec.remote_penalty
        );
        let node_slots = spec.node_slots(cfg.slots);
        let phys = match spec.placement {
            NumaPlacement::Affine { .. } => {
                sched.set_node_slots(&node_slots);
                None
            }
            NumaPlacement::Oblivious => Some(PhysSlots::new(&node_slots)),
        };
        let first = workload.iter().map(|q| q.arrival_ns).min().unwrap_or(0);
        NumaState {
            penalty: spec.remote_penalty,
            placement: spec.placement,
            sample_ns: spec.sample_ns,
            phys,
            mem_node: vec![None; workload.len()],
            waiting: 0,
            waits: 0,
            summed_to: first,
            report: NumaReport {
                nodes: node_slots
                    .iter()
                    .map(|&slots| NodeUsage {
                        slots,
                        ..NodeUsage::default()
                    })
                    .collect(),
                first_arrival_ns: first,
                last_finish_ns: first,
                ..NumaReport::default()
            },
        }
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
            fingerprint: 0,
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
    fn a_prediction_lets_a_short_query_pass_a_long_one_it_knows() {
        // One slot. A long statement (fingerprint 1) runs once; later it arrives again,
        // and a short one (fingerprint 2, never seen) 1 ms after it.
        let with = |arrival_ms, cpu_ms, class, fingerprint| QuerySpec {
            fingerprint,
            ..q(arrival_ms, cpu_ms, class)
        };
        let w = [
            with(0, 200, "long", 1),
            with(300, 200, "long", 1),
            with(301, 10, "short", 2),
        ];
        let short_latency = |start| {
            let cfg = SimConfig {
                start,
                preempt: true,
                ..SimConfig::new(1, Policy::DecayingStride)
            };
            let run = simulate_run(&w, &cfg);
            (
                run.results[2].latency_ns().unwrap() / 1_000_000,
                run.quality,
            )
        };
        let (decay, no_quality) = short_latency(StartMode::Decay);
        let (predicted, quality) = short_latency(StartMode::Predicted);
        let (oracle, _) = short_latency(StartMode::Oracle);
        // under decay the long one keeps p0 for 8 quanta and shares the slot evenly;
        // predicted (as the oracle knows) it starts at p0 · 16 / 200 and gives way
        assert!(
            predicted < decay,
            "predicted {predicted} ms, decay {decay} ms"
        );
        assert!(
            oracle <= predicted + 1,
            "oracle {oracle} ms, predicted {predicted} ms"
        );
        assert!(predicted <= 12, "predicted {predicted} ms");
        assert_eq!(no_quality, None);
        let q = quality.unwrap();
        // the second long one from history; the first and the short one had none
        assert_eq!((q.long_as_long, q.from_history, q.unpredicted), (1, 1, 2));
    }

    #[test]
    fn the_query_table_is_no_larger_than_the_workload() {
        let w = [q(0, 10, "a"), q(0, 10, "b"), q(0, 10, "c")];
        let cfg = SimConfig {
            max_active: 262_143,
            ..SimConfig::new(2, Policy::DecayingStride)
        };
        let engine = Engine::new(&w, &cfg, None);
        assert_eq!(engine.sched.capacity().max_queries, 3);
        assert_eq!(engine.sched.capacity().max_procs, 3);
        let small = SimConfig {
            max_active: 2,
            ..cfg.clone()
        };
        assert_eq!(
            Engine::new(&w, &small, None).sched.capacity().max_queries,
            2
        );
        // all three finish, as with the table sized to the limit
        let r = simulate(&w, &cfg);
        assert!(r.iter().all(|r| r.finish_ns.is_some()), "{r:?}");
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
    fn preempting_ends_a_decayed_holders_slice_for_an_arrival() {
        // One slot, 10-ms slices: a 100 ms query, and at 55 ms, in the middle of one of
        // its slices, a 2 ms one.
        let w = [q(0, 100, "long"), q(55, 2, "short")];
        let plain = SimConfig {
            slice_ns: 10_000_000,
            ..SimConfig::new(1, Policy::DecayingStride)
        };
        let preempt = SimConfig {
            preempt: true,
            ..plain.clone()
        };
        let (a, b) = (simulate(&w, &plain), simulate(&w, &preempt));
        // Without: it waits for the slice's end at 60 ms.
        assert_eq!(a[1].finish_ns, Some(62_000_000));
        assert_eq!(a[1].max_wait_ns, 5_000_000);
        // With: it runs at once; the long query gets back the 5 ms it did not use.
        assert_eq!(b[1].finish_ns, Some(57_000_000));
        assert_eq!(b[1].max_wait_ns, 0);
        assert_eq!(a[0].finish_ns, Some(102_000_000));
        assert_eq!(b[0].finish_ns, Some(102_000_000));
        assert_eq!(b[0].received_ns, 100_000_000);
        // Without decay (equal priorities) nothing is cut.
        let fair = SimConfig {
            preempt: true,
            ..SimConfig::new(1, Policy::FairStride)
        };
        let fair_plain = SimConfig::new(1, Policy::FairStride);
        assert_eq!(simulate(&w, &fair), simulate(&w, &fair_plain));
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

    fn numa(nodes: usize, penalty: f64, placement: NumaPlacement) -> Option<NumaSim> {
        Some(NumaSim::new(nodes, penalty, placement))
    }

    /// Everything but `remote_ns`.
    fn timing(r: &[QueryResult]) -> Vec<(Option<u64>, Option<u64>, u64, u64)> {
        r.iter()
            .map(|r| (r.admitted_ns, r.finish_ns, r.received_ns, r.max_wait_ns))
            .collect()
    }

    #[test]
    fn one_node_or_no_penalty_decides_as_without_numa() {
        for procs in [1, 3] {
            let w = crate::sim::generate(&crate::sim::Shape {
                queries: 400,
                slots: 4,
                procs,
                seed: 5,
                ..Default::default()
            });
            let plain = SimConfig {
                max_active: 30,
                ..SimConfig::new(4, Policy::DecayingStride)
            };
            let base = simulate(&w, &plain);
            // One node: every slot is the home's, nothing is remote.
            let one = simulate_run(
                &w,
                &SimConfig {
                    numa: numa(
                        1,
                        1.3,
                        NumaPlacement::Affine {
                            steal_after: Some(0),
                        },
                    ),
                    ..plain.clone()
                },
            );
            assert_eq!(one.results, base);
            let report = one.numa.unwrap();
            assert_eq!(report.remote_share(), 0.0);
            assert_eq!(
                report.cpu_ns(),
                base.iter().map(|r| r.received_ns).sum::<u64>()
            );
            // Oblivious at penalty 1: one pool, as without NUMA; what runs remote does
            // not run slower.
            let flat = simulate_run(
                &w,
                &SimConfig {
                    numa: numa(2, 1.0, NumaPlacement::Oblivious),
                    ..plain.clone()
                },
            );
            assert_eq!(timing(&flat.results), timing(&base));
            let report = flat.numa.unwrap();
            assert!(report.remote_share() > 0.05, "{report:?}");
            assert_eq!(report.stranded_slot_ns, 0, "one pool is work-conserving");
            let remote: u64 = flat.results.iter().map(|r| r.remote_ns).sum();
            assert_eq!(
                remote,
                report.nodes.iter().map(|n| n.remote_ns).sum::<u64>()
            );
        }
    }

    #[test]
    fn a_remote_process_runs_at_the_penalised_rate_and_is_charged_its_cpu() {
        // One query alone on 2 nodes × 1 slot, its memory placed on node 1 beforehand:
        // its process takes the lowest free slot (node 0) and runs remote throughout.
        let w = [q(0, 100, "a")];
        let cfg = SimConfig {
            numa: numa(2, 1.25, NumaPlacement::Oblivious),
            ..SimConfig::new(2, Policy::DecayingStride)
        };
        let run = |mem: Option<u32>| {
            let mut engine = Engine::new(&w, &cfg, None);
            engine.numa.as_mut().unwrap().mem_node[0] = mem;
            engine.run();
            (engine.results, engine.numa.unwrap().report)
        };
        let (r, report) = run(Some(1));
        assert_eq!(r[0].finish_ns, Some(125_000_000));
        assert_eq!(r[0].received_ns, 125_000_000);
        assert_eq!(r[0].remote_ns, 125_000_000);
        assert_eq!(r[0].slowdown(), Some(1.25));
        assert_eq!(report.nodes[0].cpu_ns, 125_000_000);
        assert_eq!(report.nodes[0].remote_ns, 125_000_000);
        assert_eq!(
            report.nodes[1],
            NodeUsage {
                slots: 1,
                ..Default::default()
            }
        );
        assert_eq!(report.remote_share(), 1.0);
        // Idle: node 1's slot all along.
        assert_eq!(report.idle_share(), 0.5);
        // First touch: local.
        let (r, report) = run(None);
        assert_eq!((r[0].finish_ns, r[0].remote_ns), (Some(100_000_000), 0));
        assert_eq!(report.remote_share(), 0.0);
    }

    #[test]
    fn a_wait_that_ended_leaves_its_steal_timer_stale() {
        // One query with 2 processes homed on node 0 of 2 × 1 slots: they take turns on
        // node 0's slot, each waiting 2 ms at a time, so a steal after 3 slices (6 ms)
        // never comes. The timer of a wait that ended goes off while a later wait of the
        // same process is under way: it must not let the process steal.
        let mut spec = q(0, 20, "pair");
        spec.procs = 2;
        let cfg = SimConfig {
            numa: numa(
                2,
                1.3,
                NumaPlacement::Affine {
                    steal_after: Some(3),
                },
            ),
            ..SimConfig::new(2, Policy::DecayingStride)
        };
        let run = simulate_run(std::slice::from_ref(&spec), &cfg);
        let report = run.numa.unwrap();
        assert_eq!(report.steals, 0);
        assert_eq!(run.results[0].finish_ns, Some(20_000_000));
        assert_eq!(report.nodes[1].cpu_ns, 0);
        // Allowed to steal after 0 slices (1 ms, the extension's floor), the second
        // process takes node 1's slot during its first wait and keeps it.
        let cfg = SimConfig {
            numa: numa(
                2,
                1.3,
                NumaPlacement::Affine {
                    steal_after: Some(0),
                },
            ),
            ..cfg
        };
        let run = simulate_run(&[spec], &cfg);
        let report = run.numa.unwrap();
        assert_eq!(report.steals, 1);
        assert!(report.nodes[1].remote_ns > 0);
        assert_eq!(report.nodes[1].remote_ns, report.nodes[1].cpu_ns);
        assert_eq!(report.rescued, 0);
    }

    #[test]
    fn a_stealer_that_has_to_wait_is_offered_the_free_slots_at_once() {
        // A process that stole a slot and loses it at a slice end waits with the right to
        // steal; end_slice offers it only the node it held. Without the dispatch that
        // follows, it waited with its home's slot free until the next steal timer or
        // worker round, whose dispatch counted it as rescued (seed 1: 8 times).
        let w = crate::sim::generate(&crate::sim::Shape {
            queries: 3_000,
            slots: 4,
            seed: 1,
            ..Default::default()
        });
        let cfg = SimConfig {
            numa: numa(
                2,
                1.3,
                NumaPlacement::Affine {
                    steal_after: Some(4),
                },
            ),
            ..SimConfig::new(4, Policy::DecayingStride)
        };
        let report = simulate_run(&w, &cfg).numa.unwrap();
        assert!(report.steals > 0);
        assert_eq!(report.rescued, 0);
    }
}
