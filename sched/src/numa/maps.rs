//! Where a shared-memory segment's pages are, per NUMA node, read from a process's
//! `/proc/<pid>/maps` and `/proc/<pid>/numa_maps` without touching a page (docs/design.md §10,
//! "Shared-buffer placement without touching pages"; PostgreSQL 18's
//! `pg_shmem_allocations_numa` touches every page and queries `move_pages` instead).
//!
//! `maps` gives each mapping's address range (`7ff7dd86a000-7ff863a00000 rw-s 00000000
//! 00:01 4562  /dev/zero (deleted)`); `numa_maps` gives, per mapping start address, the
//! pages on each node (`7ff7dd86a000 default file=/dev/zero\040(deleted) dirty=18041
//! N0=18041 kernelpagesize_kB=4`), in units of `kernelpagesize_kB` (huge pages for a
//! hugetlbfs mapping). What numa_maps counts are the pages mapped in *that process's*
//! page tables: pages of a shared mapping that only other processes touched are not
//! among them, and are reported here as not resident.

use std::collections::BTreeMap;

/// A mapping of `/proc/<pid>/maps`: `[start, end)` and what backs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `dev inode path` as the line gives them: mappings of one object compare equal.
    pub backing: String,
}

/// Parses one line of `/proc/<pid>/maps`; `None` for a line that is not one.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut words = line.split_whitespace();
    let (start, end) = words.next()?.split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    let _perms = words.next()?;
    let _offset = words.next()?;
    let backing: Vec<&str> = words.collect();
    (start < end && backing.len() >= 2).then(|| Mapping {
        start,
        end,
        backing: backing.join(" "),
    })
}

/// The address range of the object mapped at `address`: the mapping that contains it,
/// extended over adjacent mappings of the same object (the kernel splits one mapping in
/// several when parts of it differ, e.g. after `madvise`). `None` if nothing is mapped
/// there.
pub fn segment_containing(maps: &str, address: u64) -> Option<(u64, u64)> {
    let mappings: Vec<Mapping> = maps.lines().filter_map(parse_maps_line).collect();
    let i = mappings
        .iter()
        .position(|m| m.start <= address && address < m.end)?;
    let (mut first, mut last) = (i, i);
    while first > 0
        && mappings[first - 1].end == mappings[first].start
        && mappings[first - 1].backing == mappings[i].backing
    {
        first -= 1;
    }
    while last + 1 < mappings.len()
        && mappings[last + 1].start == mappings[last].end
        && mappings[last + 1].backing == mappings[i].backing
    {
        last += 1;
    }
    Some((mappings[first].start, mappings[last].end))
}

/// One line of `/proc/<pid>/numa_maps`: the mapping's start and its bytes per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaMapsLine {
    pub start: u64,
    /// (node, bytes), ascending by node.
    pub bytes_per_node: Vec<(u32, u64)>,
}

/// Parses one line of `/proc/<pid>/numa_maps`; `None` for a line that is not one. A
/// line without `kernelpagesize_kB` counts 4 kB pages (kernels before 3.6 had none).
pub fn parse_numa_maps_line(line: &str) -> Option<NumaMapsLine> {
    let mut words = line.split_whitespace();
    let start = u64::from_str_radix(words.next()?, 16).ok()?;
    let mut pages: Vec<(u32, u64)> = Vec::new();
    let mut page_kb = 4u64;
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        if key == "kernelpagesize_kB" {
            page_kb = value.parse().ok()?;
        } else if let Some(node) = key.strip_prefix('N') {
            if let (Ok(node), Ok(n)) = (node.parse::<u32>(), value.parse::<u64>()) {
                pages.push((node, n));
            }
        }
    }
    pages.sort_unstable();
    Some(NumaMapsLine {
        start,
        bytes_per_node: pages
            .into_iter()
            .map(|(node, n)| (node, n.saturating_mul(page_kb * 1024)))
            .collect(),
    })
}

/// A segment's bytes per node and those on no node (not resident in the process whose
/// numa_maps was read): the two add up to the segment's size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Size of the segment, bytes.
    pub size: u64,
    /// Bytes per node, ascending by node; nodes with none are left out.
    pub bytes_per_node: BTreeMap<u32, u64>,
}

impl Placement {
    /// Bytes of the segment on no node.
    pub fn not_resident(&self) -> u64 {
        self.size
            .saturating_sub(self.bytes_per_node.values().sum::<u64>())
    }

    /// Bytes on node `node`.
    pub fn on_node(&self, node: u32) -> u64 {
        self.bytes_per_node.get(&node).copied().unwrap_or(0)
    }
}

/// Where the pages of the segment mapped at `address` are, from the texts of the same
/// process's `maps` and `numa_maps`. `None` if nothing is mapped at `address`.
pub fn segment_placement(maps: &str, numa_maps: &str, address: u64) -> Option<Placement> {
    let (start, end) = segment_containing(maps, address)?;
    let mut placement = Placement {
        size: end - start,
        ..Placement::default()
    };
    for line in numa_maps.lines().filter_map(parse_numa_maps_line) {
        if start <= line.start && line.start < end {
            for (node, bytes) in line.bytes_per_node {
                *placement.bytes_per_node.entry(node).or_insert(0) += bytes;
            }
        }
    }
    // A mapping that changed between the two reads cannot claim more than the segment.
    let total: u64 = placement.bytes_per_node.values().sum();
    if total > placement.size {
        placement.size = total;
    }
    Some(placement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_with_and_without_a_path() {
        assert_eq!(
            parse_maps_line(
                "7ff7dd86a000-7ff863a00000 rw-s 00000000 00:01 4562                       /dev/zero (deleted)"
            ),
            Some(Mapping {
                start: 0x7ff7_dd86_a000,
                end: 0x7ff8_63a0_0000,
                backing: "00:01 4562 /dev/zero (deleted)".into()
            })
        );
        assert_eq!(
            parse_maps_line("55bfc7d27000-55bfc7d5e000 rw-p 00000000 00:00 0 ").map(|m| m.backing),
            Some("00:00 0".into())
        );
        for bad in ["", "zz-10 rw-p 0 00:00 0", "10-5 rw-p 0 00:00 0", "10 rw-p"] {
            assert_eq!(parse_maps_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn numa_maps_lines_give_bytes_per_node() {
        let line = parse_numa_maps_line(
            "7ff7dd86a000 default file=/dev/zero\\040(deleted) dirty=18041 mapmax=72 active=5635 N0=18000 N1=41 kernelpagesize_kB=4",
        )
        .unwrap();
        assert_eq!(line.start, 0x7ff7_dd86_a000);
        assert_eq!(line.bytes_per_node, [(0, 18_000 * 4096), (1, 41 * 4096)]);
        let huge = parse_numa_maps_line(
            "7f0000000000 default file=/anon_hugepage\\040(deleted) huge dirty=3 N1=3 kernelpagesize_kB=2048",
        )
        .unwrap();
        assert_eq!(huge.bytes_per_node, [(1, 3 * 2048 * 1024)]);
        let untouched = parse_numa_maps_line("7f0000000000 default file=/dev/zero\\040(deleted)");
        assert_eq!(untouched.unwrap().bytes_per_node, []);
        assert_eq!(parse_numa_maps_line("not a line"), None);
    }

    #[test]
    fn a_split_mapping_is_one_segment() {
        let maps = "\
1000-2000 rw-s 00000000 00:01 7 /dev/zero (deleted)
2000-5000 rw-s 00001000 00:01 7 /dev/zero (deleted)
5000-6000 rw-s 00000000 00:01 8 /dev/zero (deleted)
";
        assert_eq!(segment_containing(maps, 0x2fff), Some((0x1000, 0x5000)));
        assert_eq!(segment_containing(maps, 0x5000), Some((0x5000, 0x6000)));
        assert_eq!(segment_containing(maps, 0x6000), None);
    }
}
