//! The C ABI of `include/strata.h`, and the only place C types live.
//!
//! - one file per C concept, each holding its `#[repr(C)]` structs and enums, their
//!   initialisers and conversions into the core's Rust types, and its exports: [`library`]
//!   (versions, features, errors), [`table`] (table options and info, the constructors),
//!   [`lookup`] (lookup options, requests, stats, pooling), [`server`] (the `strata_server`
//!   handle, table updates, table stats), [`partition`] (the `__partitioned__` structs);
//! - [`handle`]: what each opaque handle is in Rust and who owns it, declared once;
//! - [`boundary`]: the panic boundary every export runs in, the thread's last error, and the
//!   pointer-check helpers; [`sized`]: the `struct_size` rules, in one place; [`tensor`]:
//!   DLPack version and flag checks of managed tensors.
//!
//! An export checks its arguments, makes one call into the core, and returns a status: no
//! lookup, table or server logic lives here.

#![allow(non_camel_case_types)]

mod boundary;
mod handle;
mod library;
mod lookup;
mod partition;
mod server;
mod sized;
mod status;
mod table;
mod tensor;

pub use library::*;
pub use lookup::*;
pub use partition::*;
pub use server::*;
pub use status::Status;
pub use table::*;
pub use tensor::{DLPackDLTensorFromPyObjectNoSync, strata_dlpack_fill_host};
