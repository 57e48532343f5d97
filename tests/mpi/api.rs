//! The distributed entry points of the C ABI that tests/common does not declare.
use crate::common::{Status, Table, TableOptions};
use std::ffi::c_char;

#[allow(improper_ctypes)]
unsafe extern "C" {
    pub fn strata_table_open_distributed(
        dir: *const c_char,
        dim: i64,
        comm: *const i32,
        opts: *const TableOptions,
        out: *mut *mut Table,
    ) -> Status;
    pub fn strata_mpi_available() -> i32;
}
