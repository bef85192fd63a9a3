//! Shared-memory placement per node from fixture copies of a postmaster's
//! `/proc/<pid>/maps` and `/proc/<pid>/numa_maps` (tests/fixtures/proc/postmaster: the
//! main segment is an anonymous shared mapping, `/dev/zero (deleted)`, split in two by
//! the kernel, beside a dynamic shared memory segment and the small System V segment).

use pg_stride_sched::numa::{segment_containing, segment_placement};
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/proc/postmaster")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const SEGMENT_START: u64 = 0x7ff7_dd86_a000;
const SEGMENT_END: u64 = 0x7ff8_63a0_0000;

#[test]
fn the_main_segment_spans_both_parts_of_its_split_mapping() {
    let maps = fixture("maps");
    // An address inside a pg_stride struct, far into the second part.
    let inside = SEGMENT_START + 0x4000_0000;
    assert_eq!(
        segment_containing(&maps, inside),
        Some((SEGMENT_START, SEGMENT_END))
    );
    assert_eq!(
        segment_containing(&maps, SEGMENT_START),
        Some((SEGMENT_START, SEGMENT_END))
    );
    // The System V segment is a mapping of its own.
    assert_eq!(
        segment_containing(&maps, 0x7ff8_668d_0800),
        Some((0x7ff8_668d_0000, 0x7ff8_668d_1000))
    );
    assert_eq!(segment_containing(&maps, 0x10), None);
}

#[test]
fn bytes_per_node_and_not_resident_add_up_to_the_segment() {
    let p = segment_placement(
        &fixture("maps"),
        &fixture("numa_maps"),
        SEGMENT_START + 4096,
    )
    .expect("the segment is mapped");
    assert_eq!(p.size, SEGMENT_END - SEGMENT_START);
    assert_eq!(p.size, 2_249_809_920);
    // Pages of other mappings (heap, DSM, System V, libraries) are not counted.
    assert_eq!(p.on_node(0), 9_000 * 4096);
    assert_eq!(p.on_node(1), (41 + 9_000) * 4096);
    assert_eq!(p.on_node(2), 0);
    assert_eq!(p.not_resident(), p.size - 18_041 * 4096);
    assert_eq!(
        p.bytes_per_node.values().sum::<u64>() + p.not_resident(),
        p.size
    );
}

#[test]
fn nothing_mapped_there_is_no_placement() {
    assert_eq!(segment_placement("", "", 0x1000), None);
    assert_eq!(segment_placement(&fixture("maps"), "", 0x1000), None);
    // numa_maps unreadable or empty: the whole segment is not resident, as far as can
    // be told.
    let p = segment_placement(&fixture("maps"), "", SEGMENT_START).unwrap();
    assert_eq!(p.not_resident(), p.size);
}
