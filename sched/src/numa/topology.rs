//! The machine's NUMA nodes: which CPUs each has and how much memory, as Linux reports
//! them under `/sys/devices/system/node` (`online`, `nodeN/cpulist`, `nodeN/meminfo`).
//! A kernel without NUMA support has no such directory; the machine is then one node
//! with the CPUs of `/sys/devices/system/cpu/online`.

use std::fmt;
use std::fs;
use std::path::Path;

/// Highest CPU or node number accepted in a list: far above any machine PostgreSQL runs
/// on (Linux's own limit is 8192 CPUs), low enough that a corrupt list cannot make a
/// reader allocate without bound.
pub const MAX_ID: u32 = 1 << 16;

/// A NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The kernel's node number.
    pub id: u32,
    /// Its CPUs (those the server may use, after [`Topology::restrict`]), ascending.
    pub cpus: Vec<u32>,
    /// Memory of the node, kB; `None` where not reported (a spec topology).
    pub mem_total_kb: Option<u64>,
    /// Free memory of the node, kB, when read.
    pub mem_free_kb: Option<u64>,
}

/// The nodes, ascending by id. Nodes without CPUs (memory-only nodes, or nodes whose
/// CPUs the server may not use) are kept: their memory still counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

/// Why a topology could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyError {
    /// A CPU or node list that does not parse.
    BadList(String),
    /// A file that could not be read.
    Unreadable(String),
    /// No node, or no CPU at all.
    Empty,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::BadList(s) => write!(f, "invalid CPU or node list \"{s}\""),
            TopologyError::Unreadable(s) => write!(f, "cannot read {s}"),
            TopologyError::Empty => f.write_str("no NUMA node with a CPU"),
        }
    }
}

/// Parses the kernel's list format: comma-separated numbers and ranges `a-b`, with an
/// optional stride `a-b:s` (as `isolcpus=` accepts); whitespace around it ignored, an
/// empty list is empty. Returns the numbers ascending, without duplicates.
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, TopologyError> {
    let bad = || TopologyError::BadList(text.trim().chars().take(64).collect());
    let number = |s: &str| -> Result<u32, TopologyError> {
        match s.trim().parse::<u32>() {
            Ok(n) if n <= MAX_ID => Ok(n),
            _ => Err(bad()),
        }
    };
    let mut ids = Vec::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(ids);
    }
    for part in text.split(',') {
        let (range, stride) = match part.split_once(':') {
            Some((r, s)) => (r, number(s)?),
            None => (part, 1),
        };
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(range)?;
                (n, n)
            }
        };
        if lo > hi || stride == 0 {
            return Err(bad());
        }
        ids.extend((lo..=hi).step_by(stride as usize));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Formats ascending numbers as the kernel does: `0-3,8,10-11`.
pub fn format_cpu_list(ids: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        while i + 1 < ids.len() && ids[i + 1] == ids[i] + 1 {
            i += 1;
        }
        parts.push(if ids[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", ids[i])
        });
        i += 1;
    }
    parts.join(",")
}

fn read(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path)
        .map_err(|e| TopologyError::Unreadable(format!("{}: {e}", path.display())))
}

/// `MemTotal` and `MemFree` of a node's `meminfo` ("Node 0 MemTotal:  12937420 kB").
fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace().skip(2);
            (words.next()? == name).then(|| words.next()?.parse().ok())?
        })
    };
    (field("MemTotal:"), field("MemFree:"))
}

impl Topology {
    /// Reads the topology under `root` (`/sys` on a live system).
    pub fn from_sysfs(root: &Path) -> Result<Topology, TopologyError> {
        let node_dir = root.join("devices/system/node");
        if !node_dir.join("online").exists() {
            let cpus = parse_cpu_list(&read(&root.join("devices/system/cpu/online"))?)?;
            return Topology::new(vec![Node {
                id: 0,
                cpus,
                mem_total_kb: None,
                mem_free_kb: None,
            }]);
        }
        let mut nodes = Vec::new();
        for id in parse_cpu_list(&read(&node_dir.join("online"))?)? {
            let dir = node_dir.join(format!("node{id}"));
            let cpus = parse_cpu_list(&read(&dir.join("cpulist"))?)?;
            // meminfo is informative: a node without it still places work.
            let (mem_total_kb, mem_free_kb) = read(&dir.join("meminfo"))
                .map(|t| parse_meminfo(&t))
                .unwrap_or((None, None));
            nodes.push(Node {
                id,
                cpus,
                mem_total_kb,
                mem_free_kb,
            });
        }
        Topology::new(nodes)
    }

    /// A topology from a spec: node CPU lists separated by `|`, node ids from 0 (`0|1`:
    /// CPU 0 on node 0, CPU 1 on node 1; `0-3|4-7`). A CPU in two nodes is an error.
    pub fn from_spec(spec: &str) -> Result<Topology, TopologyError> {
        let mut nodes: Vec<Node> = Vec::new();
        for (id, list) in spec.split('|').enumerate() {
            let cpus = parse_cpu_list(list)?;
            if cpus.is_empty()
                || nodes
                    .iter()
                    .any(|n| cpus.iter().any(|c| n.cpus.contains(c)))
            {
                return Err(TopologyError::BadList(spec.chars().take(64).collect()));
            }
            nodes.push(Node {
                id: id as u32,
                cpus,
                mem_total_kb: None,
                mem_free_kb: None,
            });
        }
        Topology::new(nodes)
    }

    fn new(mut nodes: Vec<Node>) -> Result<Topology, TopologyError> {
        nodes.sort_by_key(|n| n.id);
        if nodes.iter().all(|n| n.cpus.is_empty()) {
            return Err(TopologyError::Empty);
        }
        Ok(Topology { nodes })
    }

    /// The same nodes with only the CPUs in `allowed` (the server's affinity mask). An
    /// error if none is left.
    pub fn restrict(&self, allowed: &[u32]) -> Result<Topology, TopologyError> {
        let nodes = self
            .nodes
            .iter()
            .map(|n| Node {
                cpus: n
                    .cpus
                    .iter()
                    .copied()
                    .filter(|c| allowed.contains(c))
                    .collect(),
                ..n.clone()
            })
            .collect();
        Topology::new(nodes)
    }

    /// The node a CPU belongs to (its index in `nodes`).
    pub fn node_of_cpu(&self, cpu: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus.contains(&cpu))
    }

    /// CPUs per node, in node order.
    pub fn cpus_per_node(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.cpus.len() as u32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1\n").unwrap(), [0, 1]);
        assert_eq!(
            parse_cpu_list("0-3,8-11").unwrap(),
            [0, 1, 2, 3, 8, 9, 10, 11]
        );
        assert_eq!(parse_cpu_list("5").unwrap(), [5]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("0-7:2").unwrap(), [0, 2, 4, 6]);
        assert_eq!(parse_cpu_list("3,1,1-2").unwrap(), [1, 2, 3]);
        for bad in ["a", "3-1", "1-", "-1", "1,,2", "0-4:0", "99999999", "70000"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lists_format_as_the_kernel_writes_them() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[4]), "4");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn meminfo_gives_total_and_free() {
        let text = "Node 0 MemTotal:       12937420 kB\nNode 0 MemFree:         6097852 kB\nNode 0 MemUsed:         6839568 kB\n";
        assert_eq!(parse_meminfo(text), (Some(12_937_420), Some(6_097_852)));
        assert_eq!(parse_meminfo(""), (None, None));
    }

    #[test]
    fn a_spec_makes_fake_nodes_and_refuses_overlaps() {
        let t = Topology::from_spec("0|1").unwrap();
        assert_eq!(t.cpus_per_node(), [1, 1]);
        assert_eq!((t.node_of_cpu(1), t.node_of_cpu(2)), (Some(1), None));
        assert!(Topology::from_spec("0-1|1-2").is_err());
        assert!(Topology::from_spec("0||1").is_err());
        assert!(Topology::from_spec("x").is_err());
    }

    #[test]
    fn restricting_keeps_memory_only_nodes_and_refuses_no_cpu() {
        let t = Topology::from_spec("0-3|4-7").unwrap();
        let r = t.restrict(&[0, 1, 2, 3]).unwrap();
        assert_eq!(r.cpus_per_node(), [4, 0]);
        assert_eq!(t.restrict(&[9]), Err(TopologyError::Empty));
    }
}
