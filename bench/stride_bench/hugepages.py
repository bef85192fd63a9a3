"""Huge pages for the server's shared memory, as on a production server.

PostgreSQL maps its shared memory (2 GB of shared_buffers here) with huge pages when
the kernel has them reserved (`huge_pages = try`, the default). Without them, every
backend maps the segment with 4-kB pages, and on a virtual machine whose kernel runs
DAMON to page out memory for the host (kdamond), each access check of a shared page walks
the page's mappings in every backend: with 64 clients connected, kdamond took 9-10 % of
a CPU during the open-loop points, in runs of tens of milliseconds that no process can
preempt on a kernel without preemption
(bench/results/cpu-interference/alpha095_huge_pages). Huge pages are not on the
kernel's LRU lists, so DAMON does not check them, and the server needs a TLB entry per
2 MB rather than per 4 kB, like any production server.

As root, the run reserves what the server needs (`vm.nr_hugepages`, from `postgres -C
shared_memory_size_in_huge_pages`), and gives the machine back the previous value at its
end; bench/run's clean-up trap does that for a runner that was killed
(`RESTORE_FILE`). Otherwise the server runs with what is reserved, if anything.
"""

import re
from pathlib import Path

from .common import IS_ROOT, OUT, PG_BIN, as_server_user, log, parse_settings, run
from .pgserver import stride_library_problem

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
# the value to restore, while this run has raised it (read by bench/run's trap)
RESTORE_FILE = OUT / "nr_hugepages.restore"
# a share of the server's need reserved on top: configurations differ a little in shared
# memory (pg_stride's own, the pool's queues)
MARGIN = 1 / 32


def needed_pages(pgdata: Path, settings: list) -> int | None:
    """Huge pages the server of `pgdata` needs with `settings` added (name = value
    lines), from PostgreSQL itself (15 and later); None if it cannot say. The server
    must be stopped: the figure is computed at start-up."""
    opts = [a for k, v in parse_settings(settings).items() for a in ("-c", f"{k}={v}")]
    res = run(as_server_user([PG_BIN / "postgres", "-D", pgdata, *opts,
                              "-C", "shared_memory_size_in_huge_pages"]),
              check=False, capture=True, quiet=True)
    out = res.stdout.strip() if res.returncode == 0 and res.stdout else ""
    return int(out) if out.isdigit() and int(out) > 0 else None


def with_margin(pages: int) -> int:
    return pages + max(8, int(pages * MARGIN))


class Reservation:
    """The huge pages reserved for a run: `reserve` raises vm.nr_hugepages to what the
    server needs (root only), `release` sets the previous value back."""

    def __init__(self):
        self.before: int | None = None
        self.raised = False

    def reserve_for_server(self, pgdata: Path, base: list) -> dict:
        """`reserve` what the server of `pgdata` needs with the `base` settings and
        pg_stride loaded (when it can be), the most of any configuration. Call before the
        server's first start."""
        lib = [] if stride_library_problem() else ["shared_preload_libraries = 'pg_stride'"]
        return self.reserve(needed_pages(pgdata, base + lib))

    def reserve(self, needed: int | None) -> dict:
        """Reserves `needed` pages (with a margin) unless that many are reserved already;
        returns what it did, for results.json."""
        if not NR_HUGEPAGES.exists():
            return {"status": "no huge pages on this system"}
        self.before = int(NR_HUGEPAGES.read_text())
        record = {"needed": needed, "before": self.before, "reserved": self.before}
        if needed is None:
            record["status"] = ("the server's need is unknown (postgres -C "
                                "shared_memory_size_in_huge_pages: PostgreSQL 15 and later)")
            return record
        want = with_margin(needed)
        if self.before >= want:
            record["status"] = "reserved already"
            return record
        if not IS_ROOT:
            record["status"] = "not root: vm.nr_hugepages left as it is"
            log(f"huge pages: {self.before} reserved, the server needs {needed}; as root "
                "the run would reserve them (shared memory in 4-kB pages otherwise)")
            return record
        RESTORE_FILE.write_text(f"{self.before}\n")
        NR_HUGEPAGES.write_text(f"{want}\n")
        self.raised = True
        got = int(NR_HUGEPAGES.read_text())
        record.update(reserved=got, status="reserved for the run")
        log(f"huge pages: vm.nr_hugepages {self.before} -> {got} (the server needs {needed}); "
            "set back at the end of the run")
        return record

    def release(self):
        if not self.raised:
            return
        NR_HUGEPAGES.write_text(f"{self.before}\n")
        RESTORE_FILE.unlink(missing_ok=True)
        self.raised = False
        log(f"huge pages: vm.nr_hugepages set back to {self.before}")


KERNEL_PAGE = re.compile(r"^KernelPageSize:\s+(\d+) kB", re.M)


def maps_huge_pages(smaps: str) -> bool:
    """Whether a process's /proc/PID/smaps text has a mapping in huge pages (hugetlb:
    a kernel page size above 4 kB; transparent huge pages still show 4 kB)."""
    return any(int(kb) > 4 for kb in KERNEL_PAGE.findall(smaps))


def server_uses_huge_pages(postmaster_pid: int | None) -> bool | None:
    """Whether the running server's shared memory is in huge pages; None if unknown."""
    if not postmaster_pid:
        return None
    try:
        return maps_huge_pages(Path(f"/proc/{postmaster_pid}/smaps").read_text())
    except OSError:
        return None
