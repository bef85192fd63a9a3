//! Slowdown statistics per query class (wagner2021 §5: mean and tail slowdown).

use super::engine::QueryResult;

/// Slowdown statistics of the finished queries of one class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassSummary {
    /// Class label.
    pub class: String,
    /// Finished queries.
    pub count: usize,
    /// Queries the horizon cut off.
    pub unfinished: usize,
    /// Mean slowdown.
    pub mean: f64,
    /// Median slowdown.
    pub p50: f64,
    /// 95th percentile slowdown.
    pub p95: f64,
    /// 99th percentile slowdown.
    pub p99: f64,
    /// Largest slowdown.
    pub max: f64,
}

/// Summaries per class, sorted by class label, followed by one for all queries ("all").
pub fn summarize(results: &[QueryResult]) -> Vec<ClassSummary> {
    let mut classes: Vec<&str> = results.iter().map(|r| r.class.as_str()).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut out: Vec<ClassSummary> = classes
        .iter()
        .map(|&c| summary(c, results.iter().filter(|r| r.class == c)))
        .collect();
    out.push(summary("all", results.iter()));
    out
}

fn summary<'a>(class: &str, results: impl Iterator<Item = &'a QueryResult>) -> ClassSummary {
    let mut unfinished = 0;
    let mut s: Vec<f64> = results
        .filter_map(|r| {
            let s = r.slowdown();
            unfinished += s.is_none() as usize;
            s
        })
        .collect();
    s.sort_by(f64::total_cmp);
    let mean = if s.is_empty() {
        f64::NAN
    } else {
        s.iter().sum::<f64>() / s.len() as f64
    };
    ClassSummary {
        class: class.to_string(),
        count: s.len(),
        unfinished,
        mean,
        p50: percentile(&s, 0.50),
        p95: percentile(&s, 0.95),
        p99: percentile(&s, 0.99),
        max: s.last().copied().unwrap_or(f64::NAN),
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(class: &str, latency: u64, isolated: u64) -> QueryResult {
        QueryResult {
            class: class.into(),
            group: 0,
            arrival_ns: 10,
            admitted_ns: Some(10),
            finish_ns: Some(10 + latency),
            isolated_ns: isolated,
            received_ns: isolated,
            max_wait_ns: 0,
            remote_ns: 0,
        }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.95), 95.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn summary_per_class() {
        let mut results = vec![r("short", 20, 10), r("short", 40, 10), r("long", 100, 100)];
        results.push(QueryResult {
            finish_ns: None,
            ..r("long", 0, 5)
        });
        let s = summarize(&results);
        let names: Vec<_> = s.iter().map(|c| c.class.as_str()).collect();
        assert_eq!(names, ["long", "short", "all"]);
        assert_eq!((s[0].count, s[0].unfinished, s[0].mean), (1, 1, 1.0));
        assert_eq!(
            (s[1].count, s[1].mean, s[1].p50, s[1].max),
            (2, 3.0, 2.0, 4.0)
        );
        assert_eq!((s[2].count, s[2].unfinished), (3, 1));
    }
}
