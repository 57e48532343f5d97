//! The tables whose rows live in this process: [`StaticTable`] (immutable vectors, dense or
//! keyed) and [`TieredTable`] (a parameter server's volatile and persistent tiers), each as a
//! [`TableImpl`]. Their lookups are planned by the model ([`Request::plan_into`]) and run by the
//! CPU executors.

use super::{Job, TableImpl};
use crate::error::{Error, Result};
use crate::exec::cpu::Found;
use crate::exec::pooled::{pool_static, pool_tiered};
use crate::model::{LookupOptions, LookupStats, Planned, Request, RowSource, StaticTable, TableInfo, TableStats, TieredTable};
use crate::partition::{self, TableDescription};

/// The error of a path quantized rows do not take yet: `table` (int8 rows) `what`.
fn quantized_here(t: &StaticTable, what: &str) -> Error {
    Error::invalid("table", format!("stores {} rows, which {what}", t.format().name()))
}

/// The stats of a pooled lookup on a table that keeps no tier counters.
fn counted(f: Found) -> LookupStats {
    LookupStats { hits: f.hits, misses: f.misses, ..LookupStats::default() }
}

impl TableImpl for StaticTable {
    fn dim(&self) -> usize {
        StaticTable::dim(self)
    }
    fn len(&self) -> usize {
        StaticTable::len(self)
    }
    fn info(&self) -> TableInfo {
        StaticTable::info(self)
    }
    fn describe(&self) -> Result<TableDescription> {
        if self.format().is_quantized() {
            return Err(quantized_here(self, "has no __partitioned__ view"));
        }
        partition::describe(self)
    }
    fn rows(&self) -> Option<&dyn RowSource> {
        Some(self)
    }

    fn plan(&self, r: &Request, opts: &LookupOptions, plan: &mut Planned) -> Result<()> {
        // (`out` is kept clear of the table's own vectors.)
        r.plan_into(StaticTable::dim(self), self.store().byte_range(), opts, plan)
    }

    fn run(&self, _r: &Request, plan: &mut Planned, threads: usize, _opts: &LookupOptions) -> Result<LookupStats> {
        plan.cap_threads(threads);
        match plan {
            Planned::Empty => Ok(LookupStats::default()),
            Planned::Plain(p) => self.run_plan(p),
            Planned::Pooled(p) => pool_static(self, p).map(counted),
        }
    }

    fn job<'a>(&'a self, plan: &'a Planned) -> Option<Job<'a>> {
        match plan {
            Planned::Empty => None,
            Planned::Plain(p) => Some(Job::Plain(self, p)),
            Planned::Pooled(p) => Some(Job::Pooled(self, p)),
        }
    }
}

impl TableImpl for TieredTable {
    fn dim(&self) -> usize {
        TieredTable::dim(self)
    }
    fn len(&self) -> usize {
        TieredTable::len(self)
    }
    fn info(&self) -> TableInfo {
        TableInfo {
            rows: TieredTable::len(self) as i64,
            dim: TieredTable::dim(self) as i64,
            format: TieredTable::format(self),
            keyed: true,
            mapped: false,
            adopted: false,
            index_bytes: 0,
            vector_bytes: (TieredTable::len(self) * TieredTable::format(self).row_bytes(TieredTable::dim(self))) as u64,
        }
    }
    fn stats(&self) -> TableStats {
        TieredTable::stats(self)
    }
    fn describe(&self) -> Result<TableDescription> {
        Err(Error::invalid("table", "is a parameter-server table; expected a dense static or distributed table"))
    }
    fn is_mutable(&self) -> bool {
        true
    }
    fn upsert(&self, keys: &[u64], rows: &[f32]) -> Result<()> {
        TieredTable::upsert(self, keys, rows)
    }
    fn erase(&self, keys: &[u64]) -> Result<u64> {
        TieredTable::erase(self, keys)
    }
    fn rows(&self) -> Option<&dyn RowSource> {
        Some(self)
    }

    fn plan(&self, r: &Request, opts: &LookupOptions, plan: &mut Planned) -> Result<()> {
        // (A tiered table's rows live in its tiers, not in caller memory: there is no range to
        // keep `out` clear of.)
        r.plan_into(TieredTable::dim(self), (0, 0), opts, plan)
    }

    fn run(&self, _r: &Request, plan: &mut Planned, threads: usize, _opts: &LookupOptions) -> Result<LookupStats> {
        plan.cap_threads(threads);
        match plan {
            Planned::Empty => Ok(LookupStats::default()),
            Planned::Plain(p) => self.lookup(p),
            Planned::Pooled(p) => pool_tiered(self, p),
        }
    }
}
