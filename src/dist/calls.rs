//! A [`DistTable`] as a table of the handle ([`TableImpl`]) and the owner of its collective
//! calls ([`Collective`]): which step each call starts with, how a refused call takes part in
//! it, and on which communicator each agreement runs.
//!
//! - `strata_lookup`: the count exchange is the first step ([`DistTable::lookup`]); a refused
//!   lookup sends its error in place of its counts.
//! - `strata_lookup_pooled`: the first step is an agreement (on the table's communicator) on
//!   every rank's pooled plan; then one collective gather of every key's row, pooled locally.
//! - `strata_lookup_batch`: two agreements on the group's channel ([`super::channel`]): after
//!   every request is checked, and at the end; every distributed request runs between them.

use super::table::DistTable;
use crate::dlpack::FloatDtype;
use crate::error::{Error, Result};
use crate::model::{LookupOptions, LookupStats, Planned, Pooling, Request, TableInfo, plan_pooled};
use crate::partition::TableDescription;
use crate::table::{Call, Collective, DistTiming, TableImpl};
use dlpark::ffi::{DLDevice, DLDeviceType, DLTensor};

impl TableImpl for DistTable {
    fn dim(&self) -> usize {
        self.dim
    }
    fn len(&self) -> usize {
        self.rows
    }
    fn info(&self) -> TableInfo {
        DistTable::info(self)
    }
    fn describe(&self) -> Result<TableDescription> {
        DistTable::describe(self)
    }
    fn collective(&self) -> Option<&dyn Collective> {
        Some(self)
    }
    fn timing(&self) -> Option<DistTiming> {
        Some(DistTable::timing(self))
    }

    /// The checks each rank makes alone, as the collective call would make them (nothing is
    /// kept: the call plans again, collectively).
    fn plan(&self, r: &Request, opts: &LookupOptions, plan: &mut Planned) -> Result<()> {
        r.plan_into(self.dim, (0, 0), opts, plan)?;
        *plan = Planned::Empty;
        Ok(())
    }

    fn run(&self, r: &Request, _plan: &mut Planned, _threads: usize, opts: &LookupOptions) -> Result<LookupStats> {
        TableImpl::lookup(self, r, opts)
    }

    /// The collective call itself: its checks are part of its first step.
    fn lookup(&self, r: &Request, opts: &LookupOptions) -> Result<LookupStats> {
        match r.pooling {
            None => DistTable::lookup(self, r, opts),
            Some(pooling) => self.pooled(r, pooling, opts),
        }
    }

    fn bytes(&self, _plan: &Planned) -> usize {
        0
    }
}

impl Collective for DistTable {
    fn agree(&self, call: Call, local: Result<()>) -> Result<()> {
        match call {
            Call::Batch => self.channel.agree(local),
            Call::Lookup | Call::Pooled => DistTable::agree(self, local),
        }
    }

    fn refuse(&self, call: Call, e: Error) -> Error {
        let refused = match call {
            Call::Lookup => return self.refuse_lookup(e),
            Call::Pooled => DistTable::agree::<()>(self, Err(e)),
            Call::Batch => self.channel.agree(Err(e)),
        };
        refused.err().unwrap_or_else(|| Error::Internal("an agreement dropped an error".into()))
    }
}

impl DistTable {
    /// A pooled lookup: every rank's plan agreed on, then one collective gather of every key's
    /// row into a staging buffer (float32), pooled locally; a quantized table's rows are pooled
    /// where they lie instead ([`DistTable::pool_stored`]).
    fn pooled(&self, r: &Request, pooling: Pooling, opts: &LookupOptions) -> Result<LookupStats> {
        let p = DistTable::agree(self, plan_pooled(self.dim, (0, 0), r, pooling, opts))?;
        if self.format.is_quantized() {
            return self.pool_stored(&p, opts);
        }
        let dim = self.dim;
        let mut rows = vec![0f32; p.nnz * dim];
        let mut shape = [p.nnz as i64, dim as i64];
        let staged = DLTensor {
            data: rows.as_mut_ptr().cast(),
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: 2,
            dtype: FloatDtype::F32.dl(),
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: the keys are r's (valid: a Request's contract); `staged` describes `rows`,
        // nnz x dim float32, alive and unborrowed until the lookup returns.
        let gather = unsafe { Request::plain(r.keys, &staged, true) };
        let found = DistTable::lookup(self, &gather, opts)?;
        // Every key has its row (a miss, the default row): the default is never read.
        let row = |i: usize| rows[i * dim..].as_ptr() as *const u8;
        crate::exec::pooled::pool_gathered(&row, FloatDtype::F32.into(), dim, &self.default_row, &p)?;
        Ok(found)
    }
}
