//! Runaway-query rules (`pg_stride_sched::rules`), checked by the scheduler worker at
//! each sweep against the running statements of the groups that have rules. A rule
//! fires once per statement: its hit is logged and recorded (`pg_stride.rule_hits`),
//! and a `cancel` asks the statement's process to raise an error naming the rule at its
//! next yield point. A statement without yield points (it writes, or is too small to
//! schedule) is cancelled as `pg_cancel_backend` would, at once, and so is one that
//! reaches none within [`CANCEL_GRACE`] (it waits on a lock, or sleeps). A `move`
//! asks the statement's process to move its query to the rule's group at its next
//! check-in (`cpu::runaway`).

use crate::{pg, shmem};
use pg_stride_sched::rules::{Action, Metric, Rules, Usage};
use std::collections::HashMap;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// How long a statement asked to cancel itself at a yield point has before it is sent
/// a query cancel.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// What the worker remembers of a process's statement between sweeps.
#[derive(Clone, Copy)]
pub struct Seen {
    /// The statement: the process's count of registered statements when it was seen.
    key: u32,
    /// The rules it was judged by, and those that fired (bit i = rule i); bits of a dry
    /// run apart, so that a rule met during one acts once `rules_dry_run` is off. Rules
    /// changed meanwhile are judged afresh.
    rules: Rules,
    fired: u8,
    dry_fired: u8,
    /// When a rule asked it to cancel, and whether it was sent a query cancel since.
    cancel_asked: Option<Instant>,
    signalled: bool,
}

/// Checks the rules of every group that has some against its running statements.
/// `seen`: per process number, kept between sweeps.
pub fn check(shared: &shmem::Shared, seen: &mut HashMap<usize, Seen>) {
    let directory = shared.groups.groups();
    let slots: HashMap<&str, usize> = directory
        .iter()
        .map(|(slot, g)| (g.name.as_str(), *slot))
        .collect();
    let groups: HashMap<usize, (String, Rules, bool)> = directory
        .iter()
        .filter(|&(_, g)| !g.settings.rules.is_empty())
        .cloned()
        .map(|(slot, g)| (slot, (g.name, g.settings.rules, g.settings.rules_dry_run)))
        .collect();
    if groups.is_empty() {
        seen.clear();
        return;
    }
    let temp = if groups.values().any(|(_, r, _)| r.uses(Metric::TempBytes)) {
        let mut temp = temp_bytes_by_pid();
        add_workers_to_leaders(shared, &mut temp);
        temp
    } else {
        HashMap::new()
    };
    let now_us = pg::now_timestamp();
    for (procno, entry) in shared.procs().iter().enumerate() {
        let key = entry.registered.load(Ordering::Acquire);
        let admitted_at = entry.admitted_at.load(Ordering::Relaxed);
        let group = entry.group.load(Ordering::Acquire) as usize;
        let running = shared.is_live(procno)
            && entry.running.load(Ordering::Acquire) > 0
            && entry.queued.load(Ordering::Acquire) == 0
            && admitted_at != 0;
        let Some((name, rules, dry_run)) = groups.get(&group).filter(|_| running) else {
            // A statement queued to take its lent admission back (`admission::take_back`)
            // is the same statement once it runs again: what fired for it stays fired.
            if !shared.is_live(procno) || seen.get(&procno).is_some_and(|s| s.key != key) {
                seen.remove(&procno);
            }
            continue;
        };
        let fresh = Seen {
            key,
            rules: *rules,
            fired: 0,
            dry_fired: 0,
            cancel_asked: None,
            signalled: false,
        };
        let s = seen.entry(procno).or_insert(fresh);
        if s.key != key {
            *s = fresh;
        } else if s.rules != *rules {
            s.rules = *rules;
            s.fired = 0;
            s.dry_fired = 0;
        }
        let pid = entry.pid.load(Ordering::Relaxed);
        let usage = Usage {
            cpu_us: statement_cpu_ns(shared, entry) / 1000,
            elapsed_us: now_us.saturating_sub(admitted_at).max(0) as u64,
            rows: entry.rows.load(Ordering::Relaxed),
            temp_bytes: temp.get(&pid).copied().unwrap_or(0),
        };
        // Whether statement `key` has ended already: then what runs under its count is
        // an open cursor's fetch (a cursor declared before it), which has yield points.
        let ended_at_look = entry.ended.load(Ordering::SeqCst) == key;
        let unscheduled = entry.unscheduled.load(Ordering::Relaxed) == key && !ended_at_look;
        // The figures above are statement `key`'s only if it is still the backend's
        // statement after they were read: a statement that began meanwhile cleared them
        // for itself before it published its key, and wrote them after it (behind a
        // release fence, `statements::arrive`), and is judged at the next sweep, never
        // by them under the old key.
        fence(Ordering::Acquire);
        if entry.registered.load(Ordering::Relaxed) != key {
            continue;
        }
        let hits = if *dry_run {
            let hits = rules.newly_hit(&usage, s.fired | s.dry_fired);
            s.dry_fired |= hits;
            hits
        } else {
            let hits = rules.newly_hit(&usage, s.fired);
            s.fired |= hits;
            hits
        };
        shared
            .groups
            .counters(group)
            .rule_hits
            .fetch_add(u64::from(hits.count_ones()), Ordering::Relaxed);
        for (i, rule) in rules
            .iter()
            .enumerate()
            .filter(|(i, _)| hits & (1 << i) != 0)
        {
            let value = usage.of(rule.metric);
            let query_id = entry.query_id.load(Ordering::Relaxed);
            let process = (pid, u32::from(pg::proc_role(procno)));
            shared.rule_hits.record(shmem::RuleHit::new(
                now_us, process, query_id, name, *rule, value, *dry_run,
            ));
            let target = rule.target.as_str();
            let target_slot = slots.get(target).copied();
            let action = match (rule.action, dry_run, target_slot) {
                (Action::Log, ..) => "logged".to_string(),
                (Action::Cancel, true, _) => "would cancel it (rules_dry_run)".to_string(),
                (Action::Cancel, false, _) => "cancels it".to_string(),
                (Action::Move, _, None) => {
                    format!("resource group \"{target}\" does not exist: logged only")
                }
                (Action::Move, true, _) => {
                    format!("would move it to resource group \"{target}\" (rules_dry_run)")
                }
                (Action::Move, false, _) => format!("moves it to resource group \"{target}\""),
            };
            pgrx::log!(
                "pg_stride: the statement of process {pid} in resource group \"{name}\" met rule \"{rule}\" ({} {value}); {action}",
                rule.metric.name()
            );
            if rule.action == Action::Cancel && !dry_run && s.cancel_asked.is_none() {
                entry.inbox.rule_cancel_key.store(key, Ordering::Relaxed);
                entry
                    .inbox
                    .rule_cancel
                    .store(i as u32 + 1, Ordering::SeqCst);
                pg::set_latch(procno);
                s.cancel_asked = Some(Instant::now());
            }
            if let (Action::Move, false, Some(slot)) = (rule.action, dry_run, target_slot) {
                entry.inbox.rule_move_key.store(key, Ordering::Relaxed);
                entry
                    .inbox
                    .rule_move
                    .store(slot as u32 + 1, Ordering::Release);
            }
        }
        if let Some(asked) = s.cancel_asked {
            // Only while the process has not raised the rule's error yet (it clears the
            // request as it does): the session's next statement, run beside a cursor that
            // keeps `key` registered, must not get the cancel meant for this one.
            let asked_rule = entry.inbox.rule_cancel.load(Ordering::Acquire);
            let mut pending =
                asked_rule != 0 && entry.inbox.rule_cancel_key.load(Ordering::Relaxed) == key;
            // The statement may have ended since the look above, before the request was
            // stored, its end not seeing it: the request is withdrawn, not sent to what
            // the session runs next (ProcEntry::forget_rule_cancel_of). One that had
            // ended before the look is a cursor's run under its count: its yield points
            // raise the rule's error.
            if pending && !ended_at_look && entry.ended.load(Ordering::SeqCst) == key {
                let _ = entry.inbox.rule_cancel.compare_exchange(
                    asked_rule,
                    0,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                pending = false;
            }
            // A statement without yield points (a write, a read too small to schedule,
            // each statement of a DO block's loop of writes) would raise nothing before
            // it ends: it is sent the query cancel at once, or its command's next
            // statement (the loop's next UPDATE) would start afresh.
            if !s.signalled && pending && (unscheduled || asked.elapsed() >= CANCEL_GRACE) {
                pg::cancel_backend(pid);
                s.signalled = true;
            }
        }
    }
}

/// CPU time of `entry`'s statement, its parallel workers' included, ns (0 while it has
/// not joined CPU scheduling): what its query used since the statement registered.
fn statement_cpu_ns(shared: &shmem::Shared, entry: &shmem::ProcEntry) -> u64 {
    shared
        .query_cpu_ns(entry)
        .saturating_sub(entry.cpu_base_ns.load(Ordering::Relaxed))
}

/// Adds the temporary files of each parallel worker (or pool worker) to those of its
/// leader, the process whose statement the rules judge: a worker's own sort or hash
/// spills under its own pid. Lock-group membership is read without a lock; a worker
/// that joins or leaves meanwhile is counted at the next sweep.
fn add_workers_to_leaders(shared: &shmem::Shared, temp: &mut HashMap<i32, u64>) {
    for procno in 0..shared.procs().len() {
        let leader = pg::proc_lock_group_leader(procno);
        if leader == procno {
            continue;
        }
        let pid = pg::proc_pid(procno);
        // The same leader after the pid was read: the pid is the member's, not that of
        // a process that took the PGPROC since.
        if pg::proc_lock_group_leader(procno) != leader {
            continue;
        }
        let Some(&bytes) = temp.get(&pid) else {
            continue;
        };
        *temp.entry(pg::proc_pid(leader)).or_insert(0) += bytes;
    }
}

/// Bytes of temporary files per pid, from the `pgsql_tmp` directory of every tablespace:
/// the default one's (`base/pgsql_tmp`), and each other's
/// (`pg_tblspc/<oid>/<version>/pgsql_tmp`), where `temp_tablespaces`, or a database's
/// own default tablespace when it is empty, put them. Files named `pgsql_tmp<pid>.<n>`,
/// and the shared file sets of parallel queries, directories `pgsql_tmp<pid>.<n>.fileset`
/// named by the leader.
fn temp_bytes_by_pid() -> HashMap<i32, u64> {
    let mut by_pid = HashMap::new();
    // The worker runs in the data directory.
    let mut dirs = vec![std::path::PathBuf::from("base/pgsql_tmp")];
    if let Ok(spaces) = std::fs::read_dir("pg_tblspc") {
        for space in spaces.flatten() {
            let Ok(versions) = std::fs::read_dir(space.path()) else {
                continue;
            };
            dirs.extend(versions.flatten().map(|v| v.path().join("pgsql_tmp")));
        }
    }
    for dir in dirs {
        add_temp_bytes(&dir, &mut by_pid);
    }
    by_pid
}

/// Adds the bytes of the temporary files in `dir` (a `pgsql_tmp`) to `by_pid`.
fn add_temp_bytes(dir: &std::path::Path, by_pid: &mut HashMap<i32, u64>) {
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("pgsql_tmp"))
            .and_then(|n| n.split('.').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        let bytes = if meta.is_dir() {
            std::fs::read_dir(entry.path())
                .map(|files| {
                    files
                        .flatten()
                        .filter_map(|f| f.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0)
        } else {
            meta.len()
        };
        *by_pid.entry(pid).or_insert(0) += bytes;
    }
}
