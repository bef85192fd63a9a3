//! The simulator reproduces wagner2021's qualitative result (§5.2, Figure 7) on the
//! paper's workload shape: for short queries, decaying stride beats fair stride, which
//! beats FIFO; and decay does not make long queries much worse than fair.

use pg_stride_sched::sim::{generate, simulate, summarize, ClassSummary, Shape, SimConfig};
use pg_stride_sched::Policy;

fn class(summaries: &[ClassSummary], name: &str) -> ClassSummary {
    summaries.iter().find(|c| c.class == name).cloned().unwrap()
}

#[test]
fn decay_beats_fair_beats_fifo_for_short_queries() {
    for slots in [2, 16] {
        for load in [0.8, 0.9, 1.0] {
            let workload = generate(&Shape {
                queries: 1_500,
                load,
                slots,
                seed: 7,
                ..Shape::default()
            });
            let run = |policy| summarize(&simulate(&workload, &SimConfig::new(slots, policy)));
            let (fifo, fair, decay) = (
                run(Policy::Fifo),
                run(Policy::FairStride),
                run(Policy::DecayingStride),
            );
            let short = |s: &[ClassSummary]| class(s, "short").mean;
            let at = format!("{slots} slots, load {load}");
            assert!(
                short(&decay) < short(&fair),
                "{at}: decay {} vs fair {}",
                short(&decay),
                short(&fair)
            );
            assert!(
                short(&fair) < short(&fifo),
                "{at}: fair {} vs fifo {}",
                short(&fair),
                short(&fifo)
            );
            // Everything finished, and long queries pay little for the short ones' gain.
            assert!(decay.iter().all(|c| c.unfinished == 0));
            let long = |s: &[ClassSummary]| class(s, "long").mean;
            assert!(
                long(&decay) < 1.25 * long(&fair),
                "{at}: long decay {} vs fair {}",
                long(&decay),
                long(&fair)
            );
        }
    }
}
