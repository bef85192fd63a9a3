//! The SQL functions that manage resource groups: `pg_stride.create_group`,
//! `alter_group` and `drop_group`, the table behind them, and the trigger that keeps the
//! shared group directory in step with the table (see `groups`).

use pg_stride_sched::groups::{validate, GroupSettings, DEFAULT_GROUP, MAX_NAME_LEN};
use pg_stride_sched::rules::{Action, Rules};
use pgrx::prelude::*;

extension_sql!(
    r#"
CREATE TABLE pg_stride.resource_groups (
    name                 text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 63),
    weight               integer NOT NULL DEFAULT 100 CHECK (weight BETWEEN 1 AND 10000),
    max_concurrency      integer NOT NULL DEFAULT 0 CHECK (max_concurrency BETWEEN 0 AND 262143),
    max_queued           integer CHECK (max_queued BETWEEN 0 AND 262143),
    queue_timeout        integer CHECK (queue_timeout BETWEEN 0 AND 86400000),
    max_parallel_workers integer CHECK (max_parallel_workers BETWEEN 0 AND 262143),
    priority_initial     integer CHECK (priority_initial BETWEEN 1 AND 1000000),
    priority_min         integer CHECK (priority_min BETWEEN 1 AND 1000000),
    decay_lambda         double precision CHECK (decay_lambda BETWEEN 0 AND 1),
    decay_start          integer CHECK (decay_start BETWEEN 0 AND 1000000),
    pinned               boolean NOT NULL DEFAULT false,
    memory_budget        integer CHECK (memory_budget BETWEEN 0 AND 2147483647),
    reject_oversized     boolean NOT NULL DEFAULT false,
    rules                text NOT NULL DEFAULT '',
    rules_dry_run        boolean NOT NULL DEFAULT false,
    CHECK (priority_min <= priority_initial)
);
COMMENT ON TABLE pg_stride.resource_groups IS
    'pg_stride resource groups; change them with pg_stride.create_group/alter_group/drop_group';
-- Groups are configuration: pg_dump keeps them. "default" has a row only once altered.
SELECT pg_catalog.pg_extension_config_dump('pg_stride.resource_groups', '');

CREATE FUNCTION pg_stride.resource_groups_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_stride.publish_groups();
    RETURN NULL;
END
$$;
CREATE TRIGGER resource_groups_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pg_stride.resource_groups
    FOR EACH STATEMENT EXECUTE FUNCTION pg_stride.resource_groups_changed();

REVOKE ALL ON FUNCTION pg_stride.create_group, pg_stride.alter_group, pg_stride.drop_group,
    pg_stride.publish_groups FROM PUBLIC;
"#,
    name = "resource_groups_table",
    requires = [
        functions::create_group,
        functions::alter_group,
        functions::drop_group,
        functions::publish_groups
    ],
);

mod functions {
    use super::*;
    use crate::{config, pg, shmem};
    use pgrx::datum::DatumWithOid;

    /// A required argument of a function that also takes NULLs (so PostgreSQL calls it
    /// with NULL arguments too, where a STRICT function would return NULL unseen).
    fn required<T>(value: Option<T>, argument: &str, hint: &str) -> T {
        value.unwrap_or_else(|| {
            pg::raise(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("{argument} of a resource group must not be NULL"),
                Some(hint),
            )
        })
    }

    /// The checks every group function makes before touching the table; returns the
    /// group's name.
    fn check_caller(name: Option<&str>) -> &str {
        if !pg::is_superuser() {
            pg::raise(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                "only superusers can manage pg_stride resource groups".into(),
                None,
            );
        }
        let database = crate::groups::database_name();
        let current = pg::current_database();
        if current != database {
            pg::raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("pg_stride resource groups are managed in database \"{database}\", not \"{current}\""),
                Some("Connect to the database named by pg_stride.database, or change that setting."),
            );
        }
        let name = required(name, "the name", "A group name has 1 to 63 bytes.");
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            pg::raise(
                PgSqlErrorCode::ERRCODE_INVALID_NAME,
                format!("invalid resource group name \"{name}\""),
                Some("A group name has 1 to 63 bytes."),
            );
        }
        name
    }

    /// Takes the groups table from other writers until the transaction ends. Its mode,
    /// SHARE ROW EXCLUSIVE, conflicts with itself and with every write, so group
    /// functions run at once take turns, and each reads the table after the lock, under
    /// READ COMMITTED as the one before left it: an alteration keeps the settings
    /// another just committed, a group dropped meanwhile is not stored again, and two
    /// creations of one name or beyond the last free slot cannot both pass their checks.
    /// (Under REPEATABLE READ the reads see the transaction's snapshot, taken before the
    /// lock: a change committed meanwhile makes the write fail with a serialization
    /// error, but two creations of different groups may both pass the count, and the
    /// groups loader then warns of the group left out.)
    fn lock_table() {
        Spi::run("LOCK TABLE pg_stride.resource_groups IN SHARE ROW EXCLUSIVE MODE")
            .unwrap_or_else(|e| {
                pg::raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!("pg_stride: cannot lock the resource groups table: {e}"),
                    None,
                )
            });
    }

    fn check_settings(name: &str, settings: &GroupSettings) {
        if let Err(detail) = validate(settings) {
            pg::raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid setting for resource group \"{name}\": {detail}"),
                None,
            );
        }
    }

    /// A group's runaway-query rules from their text (`pg_stride_sched::rules`).
    fn parse_rules(name: &str, text: &str) -> Rules {
        Rules::parse(text).unwrap_or_else(|detail| {
            pg::raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid rules for resource group \"{name}\": {detail}"),
                Some("Write each rule as \"measure > value: action\", separated by \";\": measures cpu_time, elapsed, rows, temp_bytes; actions log, cancel, move GROUP."),
            )
        })
    }

    /// Warns of each `move` rule of group `name` whose target is no group. Such a rule is
    /// kept, as `SET default_tablespace` in `ALTER DATABASE` keeps a tablespace not made
    /// yet: its hits are only logged until the target is created (`worker/rules.rs`), and
    /// a misspelt name would otherwise go unseen until a statement met the rule.
    fn warn_of_missing_targets(name: &str, rules: &Rules) {
        let groups = crate::groups::read_table();
        let exists = |target: &str| {
            target == name || target == DEFAULT_GROUP || groups.iter().any(|g| g.name == target)
        };
        for rule in rules.iter().filter(|r| r.action == Action::Move) {
            let target = rule.target.as_str();
            if !exists(target) {
                pg::report(
                    PgLogLevel::WARNING,
                    PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                    format!("resource group \"{target}\" of rule \"{rule}\" does not exist"),
                    Some("Its hits are only logged until the group is created with pg_stride.create_group()."),
                );
            }
        }
    }

    /// Warns of the groups whose `move` rules name `dropped`: from now on their hits are
    /// only logged.
    fn warn_of_rules_moving_to(dropped: &str) {
        for group in crate::groups::read_table() {
            let moving = group
                .settings
                .rules
                .iter()
                .any(|r| r.action == Action::Move && r.target.as_str() == dropped);
            if moving && group.name != dropped {
                pg::report(
                    PgLogLevel::WARNING,
                    PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                    format!(
                        "rules of resource group \"{}\" move statements to resource group \"{dropped}\"",
                        group.name
                    ),
                    Some("Their hits are only logged from now on; change them with pg_stride.alter_group()."),
                );
            }
        }
    }

    /// The stored settings of `name`; `default` without a row has the default settings.
    fn stored(name: &str) -> Option<GroupSettings> {
        let found = crate::groups::read_table()
            .into_iter()
            .find(|g| g.name == name);
        match found {
            Some(g) => Some(g.settings),
            None if name == DEFAULT_GROUP => Some(GroupSettings::default()),
            None => None,
        }
    }

    /// Raises the ERROR for a function given a name that is no group.
    fn no_such_group(name: &str) -> ! {
        pg::raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("resource group \"{name}\" does not exist"),
            Some("List the groups in pg_stride.groups."),
        )
    }

    /// Inserts group `name` with settings `s`, or updates its row if it has one.
    fn upsert(name: &str, s: &GroupSettings) {
        store(
            name,
            s,
            "WITH stored AS (INSERT INTO pg_stride.resource_groups AS g \
                 (name, weight, max_concurrency, max_queued, queue_timeout, \
                  max_parallel_workers, priority_initial, priority_min, decay_lambda, \
                  decay_start, pinned, memory_budget, reject_oversized, rules, rules_dry_run) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
             ON CONFLICT (name) DO UPDATE SET weight = $2, max_concurrency = $3, \
                 max_queued = $4, queue_timeout = $5, max_parallel_workers = $6, \
                 priority_initial = $7, priority_min = $8, decay_lambda = $9, \
                 decay_start = $10, pinned = $11, memory_budget = $12, \
                 reject_oversized = $13, rules = $14, rules_dry_run = $15 RETURNING 1) \
             SELECT pg_catalog.count(*) FROM stored",
        );
    }

    /// Updates the row of group `name` to settings `s`; returns whether it had one.
    /// Unlike an upsert, which inserts afresh a row deleted since the transaction's
    /// snapshot was taken (REPEATABLE READ), an update of such a row fails with a
    /// serialization error.
    fn update(name: &str, s: &GroupSettings) -> bool {
        store(
            name,
            s,
            "WITH stored AS (UPDATE pg_stride.resource_groups SET weight = $2, \
                 max_concurrency = $3, max_queued = $4, queue_timeout = $5, \
                 max_parallel_workers = $6, priority_initial = $7, priority_min = $8, \
                 decay_lambda = $9, decay_start = $10, pinned = $11, memory_budget = $12, \
                 reject_oversized = $13, rules = $14, rules_dry_run = $15 \
              WHERE name OPERATOR(pg_catalog.=) $1 RETURNING 1) \
             SELECT pg_catalog.count(*) FROM stored",
        ) > 0
    }

    /// Runs `statement`, which writes group `name`'s row from `$1` (the name) to `$15`
    /// (the settings in the table's column order) and returns the rows it wrote.
    fn store(name: &str, s: &GroupSettings, statement: &str) -> i64 {
        let rules = s.rules.to_string();
        let args: [DatumWithOid; 15] = [
            name.into(),
            s.weight.into(),
            s.max_concurrency.into(),
            s.max_queued.into(),
            s.queue_timeout.into(),
            s.max_parallel_workers.into(),
            s.priority_initial.into(),
            s.priority_min.into(),
            s.decay_lambda.into(),
            s.decay_start.into(),
            s.pinned.into(),
            s.memory_budget.into(),
            s.reject_oversized.into(),
            rules.as_str().into(),
            s.rules_dry_run.into(),
        ];
        Spi::get_one_with_args::<i64>(statement, &args)
            .map(Option::unwrap_or_default)
            .unwrap_or_else(|e| {
                // An SQL error inside keeps its own SQLSTATE (pgrx re-raises it); what
                // comes back here is SPI failing by itself, a bug.
                pg::raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!("pg_stride: cannot store resource group \"{name}\": {e}"),
                    None,
                )
            })
    }

    /// Creates a resource group. Settings left NULL follow the server-wide GUCs.
    #[allow(clippy::too_many_arguments)]
    #[pg_extern(volatile, parallel_unsafe, schema = "pg_stride")]
    fn create_group(
        name: Option<&str>,
        weight: default!(Option<i32>, 100),
        max_concurrency: default!(Option<i32>, 0),
        max_parallel_workers: default!(Option<i32>, "NULL"),
        priority_initial: default!(Option<i32>, "NULL"),
        priority_min: default!(Option<i32>, "NULL"),
        decay_lambda: default!(Option<f64>, "NULL"),
        decay_start: default!(Option<i32>, "NULL"),
        pinned: default!(Option<bool>, false),
        max_queued: default!(Option<i32>, "NULL"),
        queue_timeout: default!(Option<i32>, "NULL"),
        memory_budget: default!(Option<i32>, "NULL"),
        reject_oversized: default!(Option<bool>, false),
        rules: default!(Option<&str>, "''"),
        rules_dry_run: default!(Option<bool>, false),
    ) {
        let name = check_caller(name);
        // A runaway rule names its `move` target up to a ';', trimmed: a name it could
        // not spell is refused here.
        if name.trim() != name || name.contains(';') {
            pg::raise(
                PgSqlErrorCode::ERRCODE_INVALID_NAME,
                format!("invalid resource group name \"{name}\""),
                Some("A new group's name has no ';' and no spaces at its ends."),
            );
        }
        let leave_out = "Leave the argument out for its default.";
        let settings = GroupSettings {
            weight: required(weight, "the weight", leave_out),
            max_concurrency: required(max_concurrency, "max_concurrency", leave_out),
            max_queued,
            queue_timeout,
            memory_budget,
            reject_oversized: required(reject_oversized, "reject_oversized", leave_out),
            rules: parse_rules(name, required(rules, "rules", leave_out)),
            rules_dry_run: required(rules_dry_run, "rules_dry_run", leave_out),
            max_parallel_workers,
            priority_initial,
            priority_min,
            decay_lambda,
            decay_start,
            pinned: required(pinned, "pinned", leave_out),
        };
        check_settings(name, &settings);
        lock_table();
        if stored(name).is_some() {
            pg::raise(
                PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                format!("resource group \"{name}\" already exists"),
                Some("Use pg_stride.alter_group() to change it."),
            );
        }
        // Shared memory has a slot for `default` and MAX_GROUPS - 1 others; a group
        // beyond them would never be in effect (config::reload_groups).
        let others = crate::groups::read_table()
            .iter()
            .filter(|g| g.name != DEFAULT_GROUP)
            .count();
        if others + 1 >= shmem::MAX_GROUPS {
            pg::raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "cannot create resource group \"{name}\": at most {} groups besides \"default\" fit in shared memory",
                    shmem::MAX_GROUPS - 1
                ),
                Some("Drop a group that is not used, with pg_stride.drop_group(), to make room."),
            );
        }
        warn_of_missing_targets(name, &settings.rules);
        upsert(name, &settings);
    }

    /// Changes the settings given (non-NULL) of a resource group; the others stay.
    #[allow(clippy::too_many_arguments)]
    #[pg_extern(volatile, parallel_unsafe, schema = "pg_stride")]
    fn alter_group(
        name: Option<&str>,
        weight: default!(Option<i32>, "NULL"),
        max_concurrency: default!(Option<i32>, "NULL"),
        max_parallel_workers: default!(Option<i32>, "NULL"),
        priority_initial: default!(Option<i32>, "NULL"),
        priority_min: default!(Option<i32>, "NULL"),
        decay_lambda: default!(Option<f64>, "NULL"),
        decay_start: default!(Option<i32>, "NULL"),
        pinned: default!(Option<bool>, "NULL"),
        max_queued: default!(Option<i32>, "NULL"),
        queue_timeout: default!(Option<i32>, "NULL"),
        memory_budget: default!(Option<i32>, "NULL"),
        reject_oversized: default!(Option<bool>, "NULL"),
        rules: default!(Option<&str>, "NULL"),
        rules_dry_run: default!(Option<bool>, "NULL"),
    ) {
        let name = check_caller(name);
        lock_table();
        let old = stored(name).unwrap_or_else(|| no_such_group(name));
        let settings = GroupSettings {
            weight: weight.unwrap_or(old.weight),
            max_concurrency: max_concurrency.unwrap_or(old.max_concurrency),
            max_queued: max_queued.or(old.max_queued),
            queue_timeout: queue_timeout.or(old.queue_timeout),
            memory_budget: memory_budget.or(old.memory_budget),
            reject_oversized: reject_oversized.unwrap_or(old.reject_oversized),
            rules: rules.map_or(old.rules, |text| parse_rules(name, text)),
            rules_dry_run: rules_dry_run.unwrap_or(old.rules_dry_run),
            max_parallel_workers: max_parallel_workers.or(old.max_parallel_workers),
            priority_initial: priority_initial.or(old.priority_initial),
            priority_min: priority_min.or(old.priority_min),
            decay_lambda: decay_lambda.or(old.decay_lambda),
            decay_start: decay_start.or(old.decay_start),
            pinned: pinned.unwrap_or(old.pinned),
        };
        check_settings(name, &settings);
        if rules.is_some() {
            warn_of_missing_targets(name, &settings.rules);
        }
        if !update(name, &settings) {
            // `default` has a row only once altered; any other group was found above.
            if name != DEFAULT_GROUP {
                no_such_group(name);
            }
            upsert(name, &settings);
        }
    }

    /// Drops a resource group that no statement runs in. Sessions still set to it fall
    /// back to `default`, with a WARNING at their next statement.
    #[pg_extern(volatile, parallel_unsafe, schema = "pg_stride")]
    fn drop_group(name: &str) {
        check_caller(Some(name));
        if name == DEFAULT_GROUP {
            pg::raise(
                PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
                format!("cannot drop resource group \"{DEFAULT_GROUP}\""),
                Some("Every session not assigned to another group runs in it; use pg_stride.alter_group() to change it."),
            );
        }
        lock_table();
        if stored(name).is_none() {
            no_such_group(name);
        }
        if let Some(shared) = shmem::shared() {
            if let Some(slot) = shared.groups.find(name) {
                if shared.slot_has_statements(slot) {
                    pg::raise(
                        PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
                        format!("resource group \"{name}\" is in use"),
                        Some("Wait until its statements finish (see pg_stride.groups), then drop it."),
                    );
                }
            }
        }
        warn_of_rules_moving_to(name);
        let args: [DatumWithOid; 1] = [name.into()];
        Spi::run_with_args(
            "DELETE FROM pg_stride.resource_groups WHERE name OPERATOR(pg_catalog.=) $1",
            &args,
        )
        .unwrap_or_else(|e| {
            // An SQL error inside keeps its own SQLSTATE (pgrx re-raises it); what comes
            // back here is SPI failing by itself, a bug.
            pg::raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("pg_stride: cannot drop resource group \"{name}\": {e}"),
                None,
            )
        });
    }

    /// Trigger helper: publishes the groups table as this transaction sees it, so that
    /// the change is in effect at once for this session, and has the groups worker
    /// reload the committed table when the transaction ends.
    #[pg_extern(volatile, parallel_unsafe, schema = "pg_stride")]
    fn publish_groups() {
        // The table of any other database is not the one that defines the groups.
        if pg::current_database() != crate::groups::database_name() {
            return;
        }
        crate::groups::mark_changed();
        if let Some(shared) = shmem::shared() {
            config::reload_groups(shared, false);
        }
    }
}
